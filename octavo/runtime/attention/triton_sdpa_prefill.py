"""The Triton paged backend, with one long prompt's attention through torch SDPA.

A step with a request that is a whole prompt of at least
``WHOLE_PROMPT_MIN_TOKENS`` tokens, or a chunk of ``CHUNK_MIN_TOKENS`` after
cached context (time to first token of a long prompt, alone or beside other
requests' decodes), spends most of its attention time in that request's one
big causal product. There the fused
kernels that ship with torch can beat a portable Triton kernel: on Hopper,
cuDNN's attention is a FlashAttention-3-class kernel (590-621 TFLOP/s on an
H100 at 8k-32k tokens, against 336-360 for the Triton kernel and 322-335
for FlashAttention-2; ``benchmarks/prefill_backends.py``). This backend
writes the step's keys and values into the paged cache
as ``triton_paged`` does, gathers the request's whole context (cached and
new) into contiguous K/V, and attends through torch's fused kernels, cuDNN
first (``sdpa_parts``: a chunk after cached context in two parts merged by
their log-sum-exps); the step's other requests go through the Triton
kernel, which skips the long one's rows. Every other step
(decode, shorter prompts, sliding windows, soft-capping, attention sinks,
fp8 caches, KV scales, float32 on a GPU) is ``triton_paged``'s.

Graph capture: a batch built for capture (``runtime/cuda_graphs.py``'s
``graph_inputs``) carries no per-request host lengths, so a captured prefill
step (``runtime/prefill_graphs.py``, up to 2,048 tokens by default) always
plans the Triton kernel and its replays hold for any requests; longer steps
run eagerly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo.core.attention import AttentionBatch, AttentionSpec
from octavo.runtime.attention.sdpa_parts import causal_sdpa, chunk_attention
from octavo.runtime.attention.triton_paged import FP8_KV_DTYPES, TritonPagedAttention, TritonPagedMetadata
from octavo.runtime.attention.triton_plan import SplitKvPolicy

# Measured on an H100 (round 36, benchmarks/prefill_backends.py, one layer at
# Llama-3.1-8B's heads): a whole prompt through cuDNN took 0.63x the Triton
# kernel's time at 2,048 tokens and 0.55x at 8,192; a chunk after as many
# tokens of cached context 1.16x at 4,096 tokens (with the first, plain-torch
# merge of its two parts: not measured since), 0.58x at 8,192 and 0.61x at
# 16,384 with the merge kernel.
WHOLE_PROMPT_MIN_TOKENS = 2048
CHUNK_MIN_TOKENS = 8192


@dataclass(frozen=True)
class LongPrompt:
    """The step's request ``index``: its new tokens, flat tokens from
    ``token_start``, are the last ``query_len`` of its ``seq_len``."""

    index: int
    token_start: int
    query_len: int
    seq_len: int


@dataclass
class SdpaPrefillMetadata(TritonPagedMetadata):
    long_prompt: LongPrompt | None = None  # None: the Triton kernels take the whole step (set per step)


class TritonSdpaPrefillAttention(TritonPagedAttention):
    name = "triton_sdpa_prefill"
    metadata_class = SdpaPrefillMetadata

    def __init__(self, spec: AttentionSpec, split_policy: SplitKvPolicy | None = None) -> None:
        super().__init__(spec, split_policy)
        # What the fused kernels take, fixed by the layer (the dtype also depends on the device).
        self._fused_kernels_fit = (
            spec.sliding_window is None and spec.logits_soft_cap is None and not spec.sinks
            and spec.kv_cache_dtype not in FP8_KV_DTYPES
            and spec.head_size % 8 == 0 and spec.head_size <= 256  # not MLA's latent heads, odd sizes
        )

    def build_metadata(self, batch: AttentionBatch) -> SdpaPrefillMetadata:
        metadata = super().build_metadata(batch)
        metadata.long_prompt = self._long_prompt(batch)
        return metadata

    def _long_prompt(self, batch: AttentionBatch) -> LongPrompt | None:
        """The request with the most new tokens, where it is long enough (decode
        steps stop at the first test: this runs every step)."""
        if batch.max_query_len < min(WHOLE_PROMPT_MIN_TOKENS, CHUNK_MIN_TOKENS) or not self._fused_kernels_fit:
            return None
        if batch.seq_lens_cpu is None or batch.query_start_loc_cpu is None:
            return None
        if (self.k_scale, self.v_scale) != (1.0, 1.0):
            return None  # the cache holds scaled values, which the fused kernels would read as they are
        if self.spec.dtype == torch.float32 and batch.block_table.device.type != "cpu":
            return None  # the GPU's fused kernels take 16-bit inputs only
        starts = batch.query_start_loc_cpu[: batch.num_reqs + 1]
        longest = int(starts.diff().argmax())
        token_start, token_end = int(starts[longest]), int(starts[longest + 1])
        query_len, seq_len = token_end - token_start, int(batch.seq_lens_cpu[longest])
        if query_len < (WHOLE_PROMPT_MIN_TOKENS if query_len == seq_len else CHUNK_MIN_TOKENS):
            return None
        return LongPrompt(index=longest, token_start=token_start, query_len=query_len, seq_len=seq_len)

    def _attend(self, query, kv_cache, metadata, fresh_kv=None, sinks=None) -> torch.Tensor:
        """After ``triton_paged``'s forward paths wrote the step's K/V (the cache
        then holds the long request's own keys too: ``fresh_kv`` is not needed).
        Layers with sinks never plan a long prompt (the fused kernels have none)."""
        if metadata.long_prompt is None:
            return super()._attend(query, kv_cache, metadata, fresh_kv, sinks)
        return self._attend_long_prompt(query, kv_cache, metadata)

    def _attend_long_prompt(self, query: torch.Tensor, kv_cache: torch.Tensor, metadata) -> torch.Tensor:
        """The other requests by the Triton kernel (which skips the long one's
        rows; padding rows come out as zeros), then the long one's rows by
        torch's fused kernels over its gathered context (``sdpa_parts``)."""
        from octavo.kernels.paged_attention import paged_attention

        prompt, batch = metadata.long_prompt, metadata.batch
        if batch.num_reqs > 1:
            out = paged_attention(query, kv_cache, batch, self.params, metadata.tiles, skip_request=prompt.index)
        else:
            out = torch.empty_like(query)
            out[prompt.query_len :].zero_()  # padding tokens
        block_size = kv_cache.shape[2]
        blocks = batch.block_table[prompt.index, : -(-prompt.seq_len // block_size)].long()
        # [1, heads, tokens, head_size] views of the query and of the gathered K/V.
        key, value = (kv_cache[i].index_select(0, blocks).flatten(0, 1)[: prompt.seq_len] for i in (0, 1))
        rows = slice(prompt.token_start, prompt.token_start + prompt.query_len)
        q = query[rows].unsqueeze(0).transpose(1, 2)
        k, v = key.unsqueeze(0).transpose(1, 2), value.unsqueeze(0).transpose(1, 2)
        context_len = prompt.seq_len - prompt.query_len
        if context_len == 0:
            out[rows] = causal_sdpa(q, k, v, self.spec.scale)[0].transpose(0, 1)
        else:
            context = (k[:, :, :context_len], v[:, :, :context_len])
            own = (k[:, :, context_len:], v[:, :, context_len:])
            chunk_attention(q, context, own, self.spec.scale, out[rows])
        return out
