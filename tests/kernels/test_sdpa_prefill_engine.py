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


def test_captured_prefill_steps_never_take_the_fused_path(llama_dir, make_llm, monkeypatch):
    """A prefill graph freezes the metadata built at capture, where one request
    may hold the whole bucket: a long-prompt plan made there would replay over
    every later step of that bucket, whatever its requests. Here metadata is
    frozen at "capture" as a graph freezes it; steps of several short prompts
    replay it and must give the plain path's tokens and logprobs."""
    from octavo.models.layers.attention import ForwardContext
    from tests.models.test_hf_parity import make_prompts
    from tests.runtime.test_prefill_graphs import EagerPrefillGraphs, assert_same, generate

    class FrozenPrefillGraphs(EagerPrefillGraphs):
        def capture(self) -> None:
            self.frozen = {}
            for num_tokens in self.buckets:
                self._fill_capture_inputs(num_tokens)
                input_ids, positions, batch = self.graph_inputs(num_tokens)
                metadata = self.runner.loaded.metadata_builder.build_metadata(batch)
                assert metadata.long_prompt is None
                self.frozen[num_tokens] = (input_ids, positions, metadata)

        def replay(self, num_tokens_bucket: int):
            self.replayed.append(num_tokens_bucket)
            input_ids, positions, metadata = self.frozen[num_tokens_bucket]
            return self.runner.model(input_ids, positions, ForwardContext(metadata, self.runner.kv_caches))

    monkeypatch.setenv("OCTAVO_ATTENTION_BACKEND", "triton_sdpa_prefill")
    monkeypatch.setattr(triton_sdpa_prefill, "WHOLE_PROMPT_MIN_TOKENS", 16)
    monkeypatch.setattr(triton_sdpa_prefill, "CHUNK_MIN_TOKENS", 16)
    prompts = make_prompts(vocab(llama_dir))[:5]  # 3, 9, 16, 17 and 31 tokens: 76 in one step
    options = {"overlap_decode": False, "max_num_seqs": 4, "enforce_eager": True}
    reference = generate(make_llm(llama_dir, **options), prompts)
    llm = make_llm(llama_dir, **options)
    runner = llm.engine.executor.worker.runner
    runner.prefill_graphs = graphs = FrozenPrefillGraphs(runner, [16, 32, 48, 64, 128], runner.config.max_num_seqs)
    graphs.capture()
    assert_same(generate(llm, prompts), reference)
    assert any(bucket >= 48 for bucket in graphs.replayed)
