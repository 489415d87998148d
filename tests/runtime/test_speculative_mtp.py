"""Speculative decoding with a checkpoint's multi-token-prediction layer
(GLM-4.5 and DeepSeek V3: latent attention, its rotary rows reordered as
the target's are): every draft is what a plain recomputation of the layer
(transformers' decoder layer as its block) says after the same tokens;
outputs never change; vLLM's method names; checkpoints without the layer
refused."""

from __future__ import annotations

import pytest

from octavo import SamplingParams
from octavo.errors import InvalidArgumentError
from tests.runtime.mtp_reference import ReferenceMtp, build_with_mtp
from tests.runtime.proposal_recorder import record_proposals


@pytest.fixture(scope="module")
def with_mtp(tmp_path_factory, tokenizer_dir):
    built = {}

    def get(family: str):
        if family not in built:
            built[family] = build_with_mtp(tmp_path_factory.mktemp(f"{family}-mtp"), tokenizer_dir, family)
        return built[family]

    return get


@pytest.fixture
def recorded(monkeypatch):
    return record_proposals(monkeypatch)


PROMPTS = [[(7 * i + 3 * j) % 300 + 3 for j in range(5 + 9 * i)] for i in range(4)]


def outputs(llm):
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)]


@pytest.mark.parametrize("family, method", [("glm4_moe", "mtp"), ("glm4_moe", "glm4_moe_mtp"), ("deepseek_v3", "deepseek_mtp")])
def test_drafts_are_the_layers_and_outputs_do_not_change(with_mtp, make_llm, recorded, family, method):
    path, full, extra = with_mtp(family)
    expected = outputs(make_llm(path))
    llm = make_llm(path, speculative_config={"method": method, "num_speculative_tokens": 2},
                   enable_prefix_caching=False, max_num_batched_tokens=16)
    assert outputs(llm) == expected
    assert llm.engine.get_stats().spec_decoding.num_draft_tokens > 0
    reference = ReferenceMtp(path, full, extra)
    assert len(recorded) > 20
    for known, drafts in recorded[::4]:
        assert drafts == reference.drafts(known, len(drafts)), f"after {len(known)} tokens"


def test_checkpoints_without_the_layer_are_refused(llama_dir, family_dir):
    from octavo import LLM

    with pytest.raises(InvalidArgumentError, match="not of LlamaForCausalLM"):
        LLM(str(llama_dir), speculative_config={"method": "mtp", "num_speculative_tokens": 1})
    with pytest.raises(InvalidArgumentError, match="no multi-token-prediction layer"):
        LLM(str(family_dir("glm4_moe")), speculative_config={"method": "deepseek_mtp", "num_speculative_tokens": 1})


def test_tensor_parallel(with_mtp, make_llm):
    """The layer's attention and experts split over the ranks like the target's: one device's drafts."""
    from octavo import LLM
    from tests.distributed.common import engine_options

    path, _, _ = with_mtp("glm4_moe")
    config = {"method": "mtp", "num_speculative_tokens": 2}
    single = make_llm(path, speculative_config=config)
    expected = outputs(single)
    llm = LLM(str(path), **engine_options(tensor_parallel_size=2, speculative_config=config))
    try:
        assert outputs(llm) == expected
        stats, one_device = llm.engine.get_stats().spec_decoding, single.engine.get_stats().spec_decoding
        assert stats.num_draft_tokens > 0
        assert (stats.num_draft_tokens, stats.num_accepted_tokens) == (one_device.num_draft_tokens, one_device.num_accepted_tokens)
    finally:
        llm.engine.shutdown()
