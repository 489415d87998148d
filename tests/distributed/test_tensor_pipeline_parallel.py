"""TP=2 and PP=2 over gloo (two worker processes each) against the
single-process engine, in float32, for the four architectures.

Greedy tokens must be identical and logprobs within 1e-5 (the TP all-reduce
sums partial products in another order, so logits may differ in the last
bits). Mistral's checkpoint has one KV head: at TP=2 it is replicated.
Seeded random sampling gives the same tokens, and prompt logprobs agree
(Llama).
"""

from __future__ import annotations

import pytest

from octavo import LLM, SamplingParams
from octavo.runtime.executors.multiproc import MultiprocExecutor
from tests.checkpoints import ARCHITECTURES
from tests.distributed.common import (
    NUM_NEW_TOKENS,
    engine_options,
    generate,
    greedy,
    make_prompts,
    reference,
    token_ids,
    vocab_size,
)

SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=1234, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
PROMPT_LOGPROBS = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, prompt_logprobs=2)


def assert_logprobs_close(outputs, expected, tolerance: float = 1e-5) -> None:
    for output, ref in zip(outputs, expected):
        for got, want in zip(output.outputs[0].logprobs, ref.outputs[0].logprobs):
            assert got.keys() == want.keys()
            for token_id, logprob in want.items():
                assert abs(got[token_id].logprob - logprob.logprob) < tolerance


@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2)], ids=["tp2", "pp2"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_parallel_matches_single_process(arch, tp, pp, checkpoint_dirs):
    path = checkpoint_dirs[arch]
    prompts = make_prompts(vocab_size(path))
    expected = reference(path, prompts, greedy(logprobs=2))
    seeded_expected = reference(path, prompts[:2], SEEDED) if arch == "llama" else None
    scored_expected = reference(path, prompts[1:3], PROMPT_LOGPROBS) if arch == "llama" else None

    llm = LLM(str(path), **engine_options(tensor_parallel_size=tp, pipeline_parallel_size=pp))
    executor = llm.engine.executor
    try:
        assert isinstance(executor, MultiprocExecutor) and executor.world_size == 2
        # What the server's configuration panel reports, asked of the workers.
        info = llm.engine.info
        assert (info.attention_backends, info.tensor_parallel_size, info.pipeline_parallel_size) == (("torch_paged",), tp, pp)
        outputs = generate(llm, prompts, greedy(logprobs=2))
        seeded = generate(llm, prompts[:2], SEEDED) if seeded_expected else None
        scored = generate(llm, prompts[1:3], PROMPT_LOGPROBS) if scored_expected else None
        kv = llm.engine.scheduler.kv
        assert kv.num_free_blocks == kv.num_blocks
    finally:
        llm.engine.shutdown()

    assert token_ids(outputs) == token_ids(expected)
    assert_logprobs_close(outputs, expected)
    if seeded_expected:
        assert token_ids(seeded) == token_ids(seeded_expected)
        for output, ref in zip(scored, scored_expected):
            assert len(output.prompt_logprobs) == len(ref.prompt_logprobs) == len(output.prompt_token_ids)
            for got, want in zip(output.prompt_logprobs[1:], ref.prompt_logprobs[1:]):
                assert got.keys() == want.keys()
                assert all(abs(got[t].logprob - want[t].logprob) < 1e-5 for t in want)
    if pp == 2:
        # Two stages: the engine kept two batches in flight.
        assert llm.engine.max_concurrent_batches == 2
        assert executor.max_batches_in_flight == 2
    assert all(not w.process.is_alive() for w in executor._workers)
