"""New weights in a running engine (RL loops): a checkpoint's weights
reloaded in place give that checkpoint's outputs (and the cached prefixes
of the old weights are forgotten), back again to the first; tensors handed
over directly; tensor parallelism; mismatched checkpoints, quantized
models and requests in flight refused."""

from __future__ import annotations

import pytest
import torch

from octavo import SamplingParams
from octavo.errors import InvalidArgumentError, ModelLoadError
from tests.checkpoints import build_checkpoint

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": [5 + i, 17, 42, 99, 7, 3] * 3} for i in range(3)]


def tokens(llm):
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]


@pytest.fixture(scope="module")
def other_weights(tmp_path_factory, tokenizer_dir):
    return build_checkpoint(tmp_path_factory.mktemp("trained"), "llama", tokenizer_dir, seed=9)


def test_reloaded_weights_give_their_outputs(llama_dir, other_weights, make_llm):
    llm = make_llm(llama_dir)
    before, expected = tokens(llm), tokens(make_llm(other_weights))
    assert before != expected
    assert llm.reload_weights(str(other_weights)) > 0
    assert tokens(llm) == expected  # the same prompts: no stale prefix-cache hit
    assert llm.collective_rpc("reload_weights") == [llm.reload_weights()]  # the model's own, re-read
    assert tokens(llm) == before


def test_tensors_handed_over(llama_dir, other_weights, make_llm):
    from safetensors.torch import load_file

    llm = make_llm(llama_dir)
    expected = tokens(make_llm(other_weights))
    state = load_file(str(other_weights / "model.safetensors"))
    assert llm.load_weights(state.items()) == len(state)
    assert tokens(llm) == expected
    # A subset: the rest keep their values.
    original = load_file(str(llama_dir / "model.safetensors"))
    assert llm.load_weights([(k, v) for k, v in original.items() if ".layers." in k]) < len(original)
    assert tokens(llm) != expected


def test_tensor_parallel_ranks_reload_their_slices(llama_dir, other_weights, make_llm, tmp_path):
    import json
    import shutil

    from octavo import LLM
    from tests.distributed.common import engine_options

    expected = tokens(make_llm(other_weights))
    wider = tmp_path / "wider"
    shutil.copytree(llama_dir, wider)
    config = json.loads((wider / "config.json").read_text())
    (wider / "config.json").write_text(json.dumps({**config, "intermediate_size": 256}))
    llm = LLM(str(llama_dir), **engine_options(tensor_parallel_size=2))
    try:
        # Refused before the workers are asked: one failing a call would stop serving.
        with pytest.raises(ModelLoadError, match="intermediate_size"):
            llm.reload_weights(str(wider))
        assert len(llm.collective_rpc("reload_weights", kwargs={"weights_path": str(other_weights)})) == 2
        assert tokens(llm) == expected
        with pytest.raises(InvalidArgumentError, match="several worker processes"):
            llm.load_weights([])
    finally:
        llm.engine.shutdown()


def test_refusals(llama_dir, checkpoint_dirs, make_llm, tmp_path):
    import json
    import shutil

    llm = make_llm(llama_dir)
    with pytest.raises(ModelLoadError, match="running model is a LlamaForCausalLM"):
        llm.reload_weights(str(checkpoint_dirs["qwen3"]))
    wider = tmp_path / "wider"
    shutil.copytree(llama_dir, wider)
    config = json.loads((wider / "config.json").read_text())
    (wider / "config.json").write_text(json.dumps({**config, "intermediate_size": 256}))
    with pytest.raises(ModelLoadError, match="intermediate_size"):
        llm.reload_weights(str(wider))
    with pytest.raises(InvalidArgumentError, match="'reload_weights' only"):
        llm.collective_rpc("execute_model")
    llm.engine.add_request("busy", [5, 6, 7], GREEDY)
    with pytest.raises(InvalidArgumentError, match="between requests"):
        llm.reload_weights()
    llm.engine.abort_request("busy")
    with pytest.raises(ModelLoadError, match="quantized"):
        make_llm(llama_dir, quantization="int8_weight_only").reload_weights()
    assert torch.is_grad_enabled()
