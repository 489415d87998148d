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
from tests.runtime.proposal_recorder import record_proposals
from tests.runtime.eagle_reference import ReferenceEagle1, ReferenceEagle3, build_eagle1_head, build_eagle3_head
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


@pytest.fixture(scope="module")
def repeating_head(tmp_path_factory, llama_dir):
    """A head that guesses the target's newest token again: some drafts are accepted."""
    return build_eagle3_head(tmp_path_factory.mktemp("repeats"), llama_dir, repeats=True)


@pytest.fixture
def recorded(monkeypatch):
    """Every (known tokens, drafts) the engine proposes, the newest token last."""
    return record_proposals(monkeypatch)


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


@pytest.mark.parametrize("head", ["eagle_head", "repeating_head"])
def test_kv_follows_prompt_chunks_preemption_and_accepted_drafts(
    llama_dir, head, request, make_llm, plain_outputs, recorded
):
    """The random head's guesses depend on every KV entry it wrote; the
    repeating head's drafts are accepted (steps that keep several tokens a
    request, whose first guess comes from the last accepted draft's row)."""
    head = request.getfixturevalue(head)
    prompts, _, expected = plain_outputs
    tight = make_llm(
        llama_dir, speculative_config=eagle_config(head, k=3), num_kv_blocks=14, max_num_batched_tokens=24,
        enable_prefix_caching=False,
    )
    greedy = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)] * len(prompts)
    assert_same_outputs(run(tight, prompts, greedy), expected)
    stats = tight.engine.get_stats()
    assert stats.num_preemptions > 0
    if head.name.startswith("repeats"):
        assert stats.spec_decoding.num_accepted_tokens > 20
    check_drafts(recorded[::4], ReferenceEagle3(head, llama_dir))


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

    with pytest.raises(InvalidArgumentError, match="'suffix' is not supported"):
        LLM(str(llama_dir), speculative_config={"method": "suffix", "num_speculative_tokens": 2})
    with pytest.raises(InvalidArgumentError, match="needs 'model'"):
        LLM(str(llama_dir), speculative_config={"method": "eagle3", "num_speculative_tokens": 2})
    # The default layers (2, L/2, L-3) do not exist in a 2-layer target.
    head = build_eagle3_head(tmp_path / "no_ids", llama_dir, aux_layer_ids=())
    with pytest.raises(ModelLoadError, match="eagle_aux_hidden_state_layer_ids"):
        LLM(str(llama_dir), dtype="float32", max_model_len=128, speculative_config=eagle_config(head))
    far = build_eagle3_head(tmp_path / "far", llama_dir, aux_layer_ids=(0, 1, 3))
    with pytest.raises(ModelLoadError, match=r"layers \[0, 1, 3\]"):
        LLM(str(llama_dir), dtype="float32", max_model_len=128, speculative_config=eagle_config(far))


def test_tensor_parallel(llama_dir, eagle_head, make_llm, plain_outputs):
    """Each rank holds its share of the head's heads and MLP, and the whole
    d2t: the same drafts as on one device (the same counts accepted)."""
    from octavo import LLM
    from tests.distributed.common import engine_options

    prompts, _, expected = plain_outputs
    greedy = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)] * 3
    single = make_llm(llama_dir, speculative_config=eagle_config(eagle_head))
    run(single, prompts[:3], greedy)
    llm = LLM(str(llama_dir), **engine_options(tensor_parallel_size=2, speculative_config=eagle_config(eagle_head)))
    try:
        assert [g[0] for g in run(llm, prompts[:3], greedy)] == [e[0] for e in expected[:3]]
        stats, one_device = llm.engine.get_stats().spec_decoding, single.engine.get_stats().spec_decoding
        assert stats.num_draft_tokens > 0
        assert (stats.num_draft_tokens, stats.num_accepted_tokens) == (one_device.num_draft_tokens, one_device.num_accepted_tokens)
    finally:
        llm.engine.shutdown()


def test_the_row_each_request_follows_from():
    """A request verifying drafts follows from its last accepted draft's row
    (reading the bonus token); a one-token step from its only row; a prompt
    chunk from its last row (reading the next prompt token); a request
    without a known next token from nowhere."""
    from types import SimpleNamespace

    from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput

    states = {
        "verify": SimpleNamespace(num_computed_tokens=10, token_ids=list(range(11))),
        "decode": SimpleNamespace(num_computed_tokens=6, token_ids=list(range(7))),
        "chunk": SimpleNamespace(num_computed_tokens=0, token_ids=list(range(100, 120))),
        "last_chunk": SimpleNamespace(num_computed_tokens=16, token_ids=list(range(100, 120))),
    }
    step = SchedulerOutput(
        num_scheduled_tokens={"verify": 4, "decode": 1, "chunk": 5, "last_chunk": 4},
        spec_token_ids={"verify": [7, 8, 9]},
    )
    # "verify" kept two drafts and a bonus; "last_chunk" sampled after its prompt.
    output = ModelRunnerOutput(sampled_token_ids={"verify": [7, 8, 42], "decode": [43], "last_chunk": [44]})
    proposer = SimpleNamespace(runner=SimpleNamespace(states=states))
    rows = EagleProposer._last_kept_rows(proposer, step, output)
    assert rows == {"verify": (2, 42), "decode": (4, 43), "chunk": (9, 105), "last_chunk": (13, 44)}
    # Nothing accepted: the row of the newest known token reads the bonus.
    output.sampled_token_ids["verify"] = [50]
    assert EagleProposer._last_kept_rows(proposer, step, output)["verify"] == (0, 50)


def test_the_targets_graph_steps_write_the_hidden_states(sandbox, llama_dir, eagle_head, make_llm, plain_outputs, recorded):
    """On a platform whose graph runner replays the target's decode steps
    (the contract test's CPU stand-in), the head reads the hidden states the
    replays wrote into the persistent buffer, and its own one-token steps
    are replayed too: every draft is still the plain recomputation's."""
    from octavo.plugins.manager import reset_plugin_manager
    from tests.platforms.test_platform_contract import GRAPH_PLATFORM

    prompts, _, expected = plain_outputs
    sandbox.add("graph_platform", GRAPH_PLATFORM)
    reset_plugin_manager()
    llm = make_llm(llama_dir, platform="graph_cpu", max_num_seqs=8, max_prefill_graph_tokens=0,
                   speculative_config=eagle_config(eagle_head), enable_prefix_caching=False)
    from graph_platform import EagerGraphs

    greedy = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)] * len(prompts)
    assert_same_outputs(run(llm, prompts, greedy), expected)
    target_graphs, head_graphs = EagerGraphs.made
    assert head_graphs is llm.engine.executor.worker.runner.draft.graphs
    assert target_graphs.replays and head_graphs.replays
    check_drafts(recorded[::5], ReferenceEagle3(eagle_head, llama_dir))


@pytest.mark.parametrize("hass", [False, True])
def test_eagle1_heads(llama_dir, make_llm, plain_outputs, recorded, tmp_path, hass):
    """EAGLE-1 (method eagle): the target's final hidden state and the next
    token's embedding through fc and one layer, the target's LM head over its
    stream; HASS's variant norms both inputs first (and here has embeddings of
    its own and no fc bias). Every draft is the recomputation's, outputs unchanged."""
    head = build_eagle1_head(tmp_path / "eagle1", llama_dir, para_norms=hass, own_embeddings=hass, fc_bias=not hass)
    prompts, _, expected = plain_outputs
    llm = make_llm(llama_dir, speculative_config=eagle_config(head, k=3, method="eagle"), enable_prefix_caching=False,
                   max_num_batched_tokens=24)
    greedy = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)] * len(prompts)
    assert_same_outputs(run(llm, prompts, greedy), expected)
    check_drafts(recorded[::5], ReferenceEagle1(head, llama_dir))
