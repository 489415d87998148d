"""N-gram speculative decoding with pipeline parallelism: the drafts the
scheduler proposes run through every stage (each stage writes their KV,
the last verifies them), two batches in flight; greedy outputs equal one
device's, drafts accepted. Draft models and heads stay refused there (they
run beside the whole target)."""

from __future__ import annotations

import pytest

from octavo import LLM, SamplingParams
from octavo.errors import InvalidArgumentError
from tests.distributed.common import engine_options, generate, token_ids

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
PROMPTS = [[(7 * i + 3 * j) % 300 + 3 for j in range(5 + 9 * i)] for i in range(6)]


def test_ngram_drafts_through_the_stages(llama_dir):
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    expected = token_ids(generate(LLM(str(llama_dir), **engine_options()), PROMPTS, params))
    llm = LLM(str(llama_dir), **engine_options(pipeline_parallel_size=2, speculative_config=NGRAM))
    try:
        assert token_ids(generate(llm, PROMPTS, params)) == expected
        stats = llm.engine.get_stats().spec_decoding
        assert stats.num_accepted_tokens > 0
        assert llm.engine.executor.max_batches_in_flight == 2
    finally:
        llm.engine.shutdown()
    with pytest.raises(InvalidArgumentError, match="pipeline_parallel_size 1"):
        LLM(str(llama_dir), **engine_options(pipeline_parallel_size=2,
                                             speculative_config={"model": str(llama_dir), "num_speculative_tokens": 2}))
