"""Speculative decoding with EAGLE-3 heads: every draft the engine proposes
is what a plain recomputation of the head says after the same tokens (its
KV follows the target through prompt chunks and preemption, and its first
guess reads the target's hidden states); outputs never change; both
checkpoint layouts load; bad heads are refused."""

from __future__ import annotations

import pytest

from octavo import SamplingParams
from octavo.errors import InvalidArgumentError, ModelLoadError
from octavo.runtime.eagle_proposer import EagleProposer
from tests.runtime.eagle_reference import ReferenceEagle3, build_eagle3_head
from tests.runtime.test_async_scheduling import assert_same_outputs, run

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def eagle_config(path, k: int = 3, method: str | None = "eagle3") -> dict:
    config = {"model": str(path), "num_speculative_tokens": k}
    return {**config, "method": method} if method else config


@pytest.fixture(scope="module")
def eagle_head(tmp_path_factory, llama_dir):
    """EAGLE's own layout: a 300-token draft vocabulary mapped by d2t, its own embeddings."""
    return build_eagle3_head(tmp_path_factory.mktemp("eagle3"), llama_dir)


@pytest.fixture(scope="module")
def speculators_head(tmp_path_factory, llama_dir):
    """The speculators layout: the full vocabulary, the target's embeddings and LM head, norm before the residual."""
    return build_eagle3_head(
        tmp_path_factory.mktemp("speculators"), llama_dir, aux_layer_ids=(2, 0, 1), draft_vocab_size=None,
        speculators=True, own_embeddings=False,
    )


@pytest.fixture
def recorded(monkeypatch):
    """Every (known tokens, drafts) the engine proposes, the newest token last."""
    proposals = []
    propose = EagleProposer.propose

    def recording(self, output):
        propose(self, output)
        for request_id, drafts in output.draft_token_ids.items():
            known = list(self.runner.states[request_id].token_ids) + list(output.sampled_token_ids[request_id])
            proposals.append((known, drafts))

    monkeypatch.setattr(EagleProposer, "propose", recording)
    return proposals


def check_drafts(proposals, reference: ReferenceEagle3) -> None:
    assert len(proposals) > 20
    for known, drafts in proposals:
        assert drafts == reference.drafts(known, len(drafts)), f"after {len(known)} tokens"


def test_drafts_are_the_heads_and_outputs_do_not_change(llama_dir, eagle_head, make_llm, plain_outputs, recorded):
    prompts, _, expected = plain_outputs
    llm = make_llm(llama_dir, speculative_config=eagle_config(eagle_head), enable_prefix_caching=False)
    greedy = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)] * len(prompts)
    assert_same_outputs(run(llm, prompts, greedy), expected)
    stats = llm.engine.get_stats().spec_decoding
    assert stats.num_draft_tokens > 0
    check_drafts(recorded[::7], ReferenceEagle3(eagle_head, llama_dir))


def test_kv_follows_prompt_chunks_and_preemption(llama_dir, eagle_head, make_llm, plain_outputs, recorded):
    prompts, _, expected = plain_outputs
    tight = make_llm(
        llama_dir, speculative_config=eagle_config(eagle_head, k=2), num_kv_blocks=14, max_num_batched_tokens=24,
        enable_prefix_caching=False,
    )
    greedy = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)] * len(prompts)
    assert_same_outputs(run(tight, prompts, greedy), expected)
    assert tight.engine.get_stats().num_preemptions > 0
    check_drafts(recorded[::5], ReferenceEagle3(eagle_head, llama_dir))


def test_speculators_layout_with_the_targets_embeddings(llama_dir, speculators_head, make_llm, plain_outputs, recorded):
    """No method given: the checkpoint's ``speculators_model_type`` says eagle3."""
    prompts, expected, _ = plain_outputs
    llm = make_llm(llama_dir, speculative_config=eagle_config(speculators_head, method=None), enable_prefix_caching=False)
    greedy = [GREEDY] * 4
    plain = make_llm(llama_dir)
    assert run(llm, prompts[:4], greedy) == run(plain, prompts[:4], greedy)
    check_drafts(recorded[::3], ReferenceEagle3(speculators_head, llama_dir, aux_layer_ids=(2, 0, 1)))


def test_random_requests_prefix_hits_and_logprobs(llama_dir, eagle_head, make_llm, plain_outputs):
    """Prefix-cache hits reuse the head's KV of the shared blocks; sampling
    parameters of every kind keep the target's outputs."""
    from tests.runtime.conftest import LENGTHS
    from tests.runtime.test_async_scheduling import params_for

    prompts, expected, _ = plain_outputs
    llm = make_llm(llama_dir, speculative_config=eagle_config(eagle_head, k=2))
    assert_same_outputs(run(llm, prompts, params_for(LENGTHS)), expected)
    assert_same_outputs(run(llm, prompts, params_for(LENGTHS)), expected)
    stats = llm.engine.get_stats()
    assert stats.prefix_cache.num_hits > 0 and stats.spec_decoding.num_draft_tokens > 0


def test_bad_heads_are_refused(llama_dir, tmp_path):
    from octavo import LLM

    with pytest.raises(InvalidArgumentError, match="'eagle' is not supported"):
        LLM(str(llama_dir), speculative_config={"method": "eagle", "model": str(llama_dir), "num_speculative_tokens": 2})
    with pytest.raises(InvalidArgumentError, match="needs 'model'"):
        LLM(str(llama_dir), speculative_config={"method": "eagle3", "num_speculative_tokens": 2})
    # The default layers (2, L/2, L-3) do not exist in a 2-layer target.
    head = build_eagle3_head(tmp_path / "no_ids", llama_dir, aux_layer_ids=())
    with pytest.raises(ModelLoadError, match="eagle_aux_hidden_state_layer_ids"):
        LLM(str(llama_dir), dtype="float32", max_model_len=128, speculative_config=eagle_config(head))
    far = build_eagle3_head(tmp_path / "far", llama_dir, aux_layer_ids=(0, 1, 3))
    with pytest.raises(ModelLoadError, match=r"layers \[0, 1, 3\]"):
        LLM(str(llama_dir), dtype="float32", max_model_len=128, speculative_config=eagle_config(far))
