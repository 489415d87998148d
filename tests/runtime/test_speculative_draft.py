"""Speculative decoding with a draft model: the draft model's KV follows the
target's through every kind of step, so the target's own checkpoint as the
draft has every guess accepted (chunked prefill, preemption and prefix-cache
hits included); another checkpoint as the draft leaves every output as it
is; bad drafts are refused."""

from __future__ import annotations

import pytest

from octavo import SamplingParams
from octavo.errors import InvalidArgumentError
from tests.checkpoints import build_checkpoint
from tests.runtime.test_async_scheduling import assert_same_outputs, params_for, run
from tests.runtime.conftest import LENGTHS


def draft_config(path, k: int = 3) -> dict:
    return {"model": str(path), "num_speculative_tokens": k}


@pytest.fixture(scope="module")
def other_draft(tmp_path_factory, tokenizer_dir):
    """A checkpoint of the same shapes and vocabulary with other weights."""
    return build_checkpoint(tmp_path_factory.mktemp("draft"), "llama", tokenizer_dir, seed=5)


def test_the_targets_own_weights_as_draft_are_always_accepted(llama_dir, make_llm, plain_outputs):
    prompts, _, expected = plain_outputs
    llm = make_llm(llama_dir, speculative_config=draft_config(llama_dir))
    greedy = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)] * len(prompts)
    assert_same_outputs(run(llm, prompts, greedy), expected)
    stats = llm.engine.get_stats().spec_decoding
    assert stats.num_draft_tokens > 0 and stats.num_accepted_tokens == stats.num_draft_tokens
    # Every step after the first carries three drafts a request: 4 tokens a step.
    assert stats.num_drafts <= len(prompts) * 10


def test_kv_follows_chunks_preemption_and_prefix_hits(llama_dir, make_llm, plain_outputs):
    prompts, _, expected = plain_outputs
    greedy = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)] * len(prompts)
    tight = make_llm(llama_dir, speculative_config=draft_config(llama_dir), num_kv_blocks=14, max_num_batched_tokens=24)
    assert_same_outputs(run(tight, prompts, greedy), expected)
    assert_same_outputs(run(tight, prompts, greedy), expected)  # the same prompts: prefix-cache hits
    stats = tight.engine.get_stats()
    assert stats.num_preemptions > 0 and stats.prefix_cache.num_hits > 0
    assert stats.spec_decoding.num_accepted_tokens == stats.spec_decoding.num_draft_tokens > 0


def test_another_draft_changes_no_output(llama_dir, make_llm, plain_outputs, other_draft):
    prompts, expected, _ = plain_outputs
    llm = make_llm(llama_dir, speculative_config=draft_config(other_draft, k=2))
    assert_same_outputs(run(llm, prompts, params_for(LENGTHS)), expected)
    assert llm.engine.get_stats().spec_decoding.num_draft_tokens > 0


def test_a_draft_of_another_family(llama_dir, make_llm, plain_outputs, checkpoint_dirs):
    """Qwen3 (head size 32, q/k norms: another attention backend spec and
    metadata builder) drafting for Llama: the outputs are Llama's."""
    prompts, _, expected = plain_outputs
    llm = make_llm(llama_dir, speculative_config=draft_config(checkpoint_dirs["qwen3"], k=2))
    greedy = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)] * len(prompts)
    assert_same_outputs(run(llm, prompts, greedy), expected)
    assert llm.engine.get_stats().spec_decoding.num_draft_tokens > 0


def test_random_requests_and_tensor_parallel(llama_dir, make_llm, plain_outputs):
    from octavo import LLM
    from tests.distributed.common import engine_options

    prompts, _, expected = plain_outputs
    llm = make_llm(llama_dir, speculative_config=draft_config(llama_dir), max_num_seqs=4)
    params = SamplingParams(temperature=0.5, top_k=20, max_tokens=30, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts[:4]], params)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [30] * 4
    assert llm.engine.get_stats().spec_decoding.num_accepted_tokens > 0
    parallel = LLM(str(llama_dir), **engine_options(tensor_parallel_size=2, speculative_config=draft_config(llama_dir)))
    try:
        greedy = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)] * 3
        assert [g[0] for g in run(parallel, prompts[:3], greedy)] == [e[0] for e in expected[:3]]
        stats = parallel.engine.get_stats().spec_decoding
        assert stats.num_accepted_tokens == stats.num_draft_tokens > 0
    finally:
        parallel.engine.shutdown()


def test_bad_drafts_are_refused(llama_dir, tmp_path):
    import json

    from octavo.engine_args import EngineArgs, build_engine

    other_vocab = tmp_path / "other-vocab"  # only its config is read before the refusal
    other_vocab.mkdir()
    config = json.loads((llama_dir / "config.json").read_text())
    (other_vocab / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] + 64}))
    for config, message in [
        (draft_config(other_vocab), "vocabulary"),
        ({**draft_config(llama_dir), "draft_tensor_parallel_size": 2}, "draft_tensor_parallel_size"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "needs 'model'"),
        ({**draft_config(llama_dir), "prompt_lookup_max": 3}, "for method 'ngram'"),
        ({"method": "ngram", "model": str(llama_dir), "num_speculative_tokens": 2}, "is for methods .'draft_model'"),
    ]:
        with pytest.raises(InvalidArgumentError, match=message):
            build_engine(EngineArgs(model=str(llama_dir), dtype="float32", speculative_config=config))



def test_draft_steps_replay_the_platforms_graphs(sandbox, llama_dir, make_llm, plain_outputs):
    """On a platform whose graph runner replays steps (the contract test's
    CPU stand-in), the draft's one-token steps are captured and replayed:
    its guesses and its KV for the target's graph-replayed decode steps come
    from the replays, and every guess is still accepted."""
    from octavo.plugins.manager import reset_plugin_manager
    from tests.platforms.test_platform_contract import GRAPH_PLATFORM

    prompts, _, expected = plain_outputs
    sandbox.add("graph_platform", GRAPH_PLATFORM)
    reset_plugin_manager()
    llm = make_llm(llama_dir, platform="graph_cpu", max_num_seqs=8, max_prefill_graph_tokens=0,
                   speculative_config=draft_config(llama_dir))
    from graph_platform import EagerGraphs

    greedy = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)] * len(prompts)
    assert_same_outputs(run(llm, prompts, greedy), expected)
    target_graphs, draft_graphs = EagerGraphs.made
    assert draft_graphs is llm.engine.executor.worker.runner.draft.graphs and draft_graphs.replays
    stats = llm.engine.get_stats().spec_decoding
    assert stats.num_accepted_tokens == stats.num_draft_tokens > 0


def test_draft_follows_the_targets_prefill_graph_steps(llama_dir, make_llm, plain_outputs):
    """Steps the target replays from a prefill graph (padded to a token
    bucket) are followed by the draft's prefill graph of that bucket, on the
    same padded inputs: every guess is still accepted."""
    from octavo.runtime.draft_model import _DraftCaptureView
    from tests.runtime.test_prefill_graphs import EagerPrefillGraphs

    prompts, _, expected = plain_outputs
    llm = make_llm(llama_dir, speculative_config=draft_config(llama_dir))
    runner = llm.engine.executor.worker.runner
    buckets = [16, 32, 48, 64, 128, 256]
    runner.prefill_graphs = EagerPrefillGraphs(runner, buckets, runner.config.max_num_seqs)
    draft_graphs = runner.draft.prefill_graphs = EagerPrefillGraphs(
        _DraftCaptureView(runner.draft), buckets, runner.config.max_num_seqs
    )
    greedy = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)] * len(prompts)
    assert_same_outputs(run(llm, prompts, greedy), expected)
    assert len(draft_graphs.replayed) == len(runner.prefill_graphs.replayed) > 5
    stats = llm.engine.get_stats().spec_decoding
    assert stats.num_accepted_tokens == stats.num_draft_tokens > 0
