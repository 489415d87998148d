"""On a CUDA GPU: ``triton_sdpa_prefill``'s long-prompt path (cuDNN or
FlashAttention through torch, ``sdpa_parts``) in bfloat16 against the
float32 reference, for a whole 8k prompt and an 8k chunk after 8k of cached
context; the default thresholds, Llama's head size. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

from octavo.core.attention import AttentionSpec
from octavo.kernels.reference import paged_attention_reference
from octavo.runtime.attention.triton_sdpa_prefill import CHUNK_MIN_TOKENS, LongPrompt, TritonSdpaPrefillAttention
from tests.kernels.batches import BatchSpec, RequestShape, make_batch

# Nothing here imports a Triton kernel module at collection: tests/kernels/conftest.py
# sets TRITON_INTERPRET on a machine without a GPU before any is imported.
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("seq_len,query_len", [(8192, 8192), (16384, 8192)])
def test_long_prompt_in_bfloat16(seq_len, query_len):
    assert query_len >= CHUNK_MIN_TOKENS
    spec = BatchSpec([RequestShape(seq_len, query_len)], num_heads=8, num_kv_heads=2, head_size=128,
                     dtype=torch.bfloat16, num_padding_tokens=5)
    batch = make_batch(spec, torch.device("cuda"))
    backend = TritonSdpaPrefillAttention(
        AttentionSpec(spec.num_heads, spec.num_kv_heads, spec.head_size, spec.head_size**-0.5, spec.dtype, spec.dtype,
                      spec.block_size)
    )
    metadata = backend.build_metadata(batch.attn_batch)
    assert metadata.long_prompt == LongPrompt(0, 0, query_len, seq_len)
    cache = batch.kv_cache.clone()
    out = backend.forward(batch.query, batch.key, batch.value, cache, metadata)
    b = batch.attn_batch
    expected = paged_attention_reference(batch.query.float(), cache.float(), b.query_start_loc, b.seq_lens,
                                         b.block_table, backend.spec.scale)
    torch.testing.assert_close(out[:query_len].float(), expected[:query_len], atol=2e-2, rtol=2e-2)
    assert out[query_len:].abs().max() == 0
