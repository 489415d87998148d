"""vLLM's ``hf_overrides``: config.json values replaced before the model is
built. A RoPE override (linear scaling, another theta) and a longer context
give Hugging Face's tokens on a checkpoint whose config.json says the same;
bad overrides are refused with the config's own errors."""

from __future__ import annotations

import json

import pytest

from octavo import SamplingParams
from octavo.errors import InvalidArgumentError, ModelLoadError, UnsupportedModelError
from octavo.models.config import apply_overrides, load_arch_config
from tests.hf_reference import assert_tokens_match, hf_greedy
from tests.models.test_hf_parity import make_prompts

OVERRIDES = {"rope_theta": 500.0, "rope_scaling": {"rope_type": "linear", "factor": 4.0}, "max_position_embeddings": 1024}


def test_top_level_values_replace_and_nested_model_configs_merge():
    raw = {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}, "hidden_size": 8,
           "text_config": {"hidden_size": 16, "num_hidden_layers": 2}}
    merged = apply_overrides(raw, {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}, "text_config": {"hidden_size": 32}})
    assert merged["rope_scaling"] == {"rope_type": "yarn", "factor": 4.0}  # replaced whole
    assert merged["text_config"] == {"hidden_size": 32, "num_hidden_layers": 2}  # merged
    assert raw["text_config"]["hidden_size"] == 16  # the original is left as it was


def test_overridden_model_matches_hf_on_the_overridden_config(llama_dir, make_llm, tmp_path):
    # The reference: the same weights under a config.json that says what the overrides say.
    reference_dir = tmp_path / "overridden"
    reference_dir.mkdir()
    for item in llama_dir.iterdir():
        (reference_dir / item.name).symlink_to(item)
    (reference_dir / "config.json").unlink()
    config = json.loads((llama_dir / "config.json").read_text())
    (reference_dir / "config.json").write_text(json.dumps(apply_overrides(config, OVERRIDES)))

    llm = make_llm(llama_dir, hf_overrides=OVERRIDES, max_model_len=None)
    assert llm.engine.limits.max_model_len == 1024  # from the overridden max_position_embeddings
    prompts = make_prompts(config["vocab_size"])[:4]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=5)
    plain = make_llm(llama_dir).generate([{"prompt_token_ids": p} for p in prompts], params)
    for prompt, output, base in zip(prompts, llm.generate([{"prompt_token_ids": p} for p in prompts], params), plain):
        completion = output.outputs[0]
        top5 = [sorted(entry, key=lambda t: entry[t].rank)[:5] for entry in completion.logprobs]
        assert_tokens_match(list(completion.token_ids), hf_greedy(reference_dir, prompt, 12), top5)
    assert any(o.outputs[0].token_ids != b.outputs[0].token_ids for o, b in zip(llm.generate(
        [{"prompt_token_ids": p} for p in prompts], params), plain))  # the overrides change the model


def test_bad_overrides_are_refused(llama_dir):
    from octavo.engine_args import EngineArgs, build_engine

    with pytest.raises(UnsupportedModelError, match="rope"):
        load_arch_config(llama_dir, {"rope_scaling": {"rope_type": "mystery", "factor": 2.0}})
    with pytest.raises(UnsupportedModelError, match="override rope_parameters instead"):
        load_arch_config(llama_dir, {"rope_theta": 123.0})  # its config keeps theta in rope_parameters
    overridden = load_arch_config(llama_dir, {"rope_parameters": {"rope_type": "default", "rope_theta": 123.0}})
    assert overridden.rope_theta == 123.0
    with pytest.raises(ModelLoadError):
        load_arch_config(llama_dir, {"num_attention_heads": "many"})
    with pytest.raises(InvalidArgumentError, match="hf_overrides"):
        build_engine(EngineArgs(model=str(llama_dir), hf_overrides=["rope_theta", 1.0]))
