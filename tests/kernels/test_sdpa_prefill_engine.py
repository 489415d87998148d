"""The ``triton_sdpa_prefill`` backend inside the engine: a Llama whose long
prompts (thresholds lowered to 40 tokens) are chunked so that steps take
every path: a whole first chunk through the fused kernels, a chunk after
cached context in two merged parts, the Triton kernel for short chunks and
decodes, and the long request beside another's decode (the Triton kernel
skipping its rows). Greedy tokens against Hugging Face in float32 on the
CPU. Here, not in tests/models, because this directory turns Triton's
interpreter on."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("triton")

from octavo import SamplingParams  # noqa: E402
from octavo.runtime.attention import triton_sdpa_prefill  # noqa: E402
from tests.hf_reference import assert_tokens_match, hf_greedy  # noqa: E402
from tests.runtime.test_decode_overlap import vocab  # noqa: E402


def test_long_prompts_match_hf(llama_dir, make_llm, monkeypatch):
    monkeypatch.setenv("OCTAVO_ATTENTION_BACKEND", "triton_sdpa_prefill")
    monkeypatch.setattr(triton_sdpa_prefill, "WHOLE_PROMPT_MIN_TOKENS", 40)
    monkeypatch.setattr(triton_sdpa_prefill, "CHUNK_MIN_TOKENS", 40)
    taken = []
    attend = triton_sdpa_prefill.TritonSdpaPrefillAttention._attend_long_prompt

    def counted(self, query, kv_cache, metadata):
        taken.append((metadata.batch.num_reqs, metadata.long_prompt.seq_len - metadata.long_prompt.query_len))
        return attend(self, query, kv_cache, metadata)

    monkeypatch.setattr(triton_sdpa_prefill.TritonSdpaPrefillAttention, "_attend_long_prompt", counted)
    rng = random.Random(3)
    prompts = [[rng.randrange(3, vocab(llama_dir)) for _ in range(n)] for n in (20, 130)]
    llm = make_llm(llama_dir, max_num_batched_tokens=64, max_num_seqs=2, enforce_eager=True, overlap_decode=False)
    assert llm.engine.executor.worker.runner.loaded.layer_backends[0].name == "triton_sdpa_prefill"
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=5)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    for prompt, output in zip(prompts, outputs):
        completion = output.outputs[0]
        top5 = [sorted(step, key=lambda t: step[t].rank)[:5] for step in completion.logprobs]
        assert_tokens_match(list(completion.token_ids), hf_greedy(llama_dir, prompt, 6), top5)
    # Per layer: the 130-token prompt's whole first chunk beside the short prompt, then its chunk
    # after 44 tokens of context beside the short prompt's decode (the last 23 stay on Triton).
    assert {context for _, context in taken} == {0, 44} and {reqs for reqs, _ in taken} == {2}
