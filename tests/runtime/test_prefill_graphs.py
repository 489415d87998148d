"""Prefill graphs: steps padded to a token bucket (padding requests with no
tokens, padding tokens with no request) give exactly the plain path's tokens
and logprobs. On the CPU the "graph" is replaced by an eager forward over the
very buffers a captured graph reads, which checks the padding itself."""

from __future__ import annotations

import pytest

from octavo import SamplingParams
from octavo.runtime.prefill_graphs import PrefillGraphs, prefill_graph_buckets
from tests.models.test_hf_parity import make_prompts
from tests.runtime.test_decode_overlap import vocab


class EagerPrefillGraphs(PrefillGraphs):
    """Replays by running the model eagerly on the graph's static inputs."""

    def __init__(self, runner, buckets, max_num_reqs) -> None:
        super().__init__(runner, buckets, max_num_reqs)
        self.replayed: list[int] = []

    def replay(self, num_tokens_bucket: int):
        self.replayed.append(num_tokens_bucket)
        self.num_replays += 1
        return self.forward(*self.graph_inputs(num_tokens_bucket))


def test_buckets():
    buckets = prefill_graph_buckets(2048)
    assert buckets[:8] == [16, 32, 48, 64, 80, 96, 112, 128]
    assert buckets[8:11] == [256, 384, 512] and buckets[-1] == 2048
    assert prefill_graph_buckets(100) == [16, 32, 48, 64, 80, 96, 100]
    assert prefill_graph_buckets(8) == []
    graphs = PrefillGraphs(runner=None, buckets=[16, 32, 64], max_num_reqs=4)
    assert graphs.bucket_for(1, 1) == 16 and graphs.bucket_for(17, 4) == 32
    assert graphs.bucket_for(65, 1) is None  # too many tokens: eager
    assert graphs.bucket_for(10, 5) is None  # too many requests: eager


def generate(llm, prompts, **extra):
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=2, **extra)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    return [(o.outputs[0].token_ids, [sorted(d.items()) for d in o.outputs[0].logprobs]) for o in outputs]


def install(llm, buckets) -> EagerPrefillGraphs:
    runner = llm.engine.executor.worker.runner
    runner.prefill_graphs = EagerPrefillGraphs(runner, buckets, runner.config.max_num_seqs)
    return runner.prefill_graphs


def assert_same(got, expected):
    for (tokens, logprobs), (ref_tokens, ref_logprobs) in zip(got, expected, strict=True):
        assert tokens == ref_tokens
        for row, ref_row in zip(logprobs, ref_logprobs, strict=True):
            assert [t for t, _ in row] == [t for t, _ in ref_row]
            assert all(abs(a.logprob - b.logprob) < 1e-4 for (_, a), (_, b) in zip(row, ref_row))


@pytest.mark.parametrize("options", [{}, {"max_num_batched_tokens": 40}], ids=["whole", "chunked"])
def test_padded_steps_match_plain_path(llama_dir, make_llm, options):
    prompts = make_prompts(vocab(llama_dir))
    again = [p + [5, 6, 7] for p in prompts[:3]]  # second round: prefix-cache hits
    plain = make_llm(llama_dir, overlap_decode=False, **options)
    reference = [generate(plain, prompts), generate(plain, again)]
    llm = make_llm(llama_dir, overlap_decode=False, **options)
    graphs = install(llm, [16, 32, 48, 64, 128, 256])
    assert_same(generate(llm, prompts), reference[0])
    assert_same(generate(llm, again), reference[1])
    assert len(graphs.replayed) > 5  # prefill, mixed and decode steps all replayed
    assert llm.engine.get_stats().prefix_cache.num_hits > 0


def test_capture_spreads_tokens_so_no_request_outgrows_max_model_len():
    """A bucket larger than max_model_len is captured over several requests:
    one request holding it all would make attention read past its block-table
    row (past the whole table with max_num_seqs=1, an illegal address on CUDA)."""
    from octavo.runtime.prefill_graphs import capture_lengths

    assert capture_lengths(2048, 4, 640) == [640, 640, 640, 128]
    assert capture_lengths(100, 3, 640) == [100, 0, 0]
    assert capture_lengths(640, 1, 640) == [640]
    with pytest.raises(ValueError):
        capture_lengths(641, 1, 640)
