"""``encoder_attention`` on CUDA: torch's varlen flash attention on the flat tokens.

The reference lays a step's sequences out on a [sequences, longest] grid
and runs one masked SDPA over it: two gathers in and out, a mask, and the
padding cells' work. all-MiniLM-L6 at 256 short sentences spent half of its
step's GPU time there (0.49 of 1.03 ms on an H100, round 32). Flash
attention's varlen form reads the sequences' boundaries (``cu_seqlens``)
and attends within each directly; the grid arguments go unused.

Serves bfloat16 and float16 (flash attention's dtypes) on the CUDA platform
(not ROCm: untested there), on devices of compute capability 8.0 or more, where ``torch.nn.attention.varlen`` exists
(torch >= 2.10), for head sizes flash attention takes (a multiple of 8, at
most 256).
"""

from __future__ import annotations

import importlib.util

import torch


def supported(ctx) -> str | None:
    """Why this implementation cannot serve ``ctx`` (an ``OpContext``), or None."""
    if importlib.util.find_spec("torch.nn.attention.varlen") is None:
        return f"torch {torch.__version__} has no torch.nn.attention.varlen"
    major, _ = torch.cuda.get_device_capability(ctx.device)
    if major < 8:
        return "flash attention needs compute capability 8.0 or more"
    return None


def accepts(qkv, cu_seqlens, max_seqlen, grid_index, token_cells, key_bias, num_heads, scale) -> bool:
    head_size = qkv.shape[1] // (3 * num_heads)
    return head_size % 8 == 0 and head_size <= 256


def varlen_encoder_attention(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    grid_index: torch.Tensor,
    token_cells: torch.Tensor,
    key_bias: torch.Tensor | None,
    num_heads: int,
    scale: float,
) -> torch.Tensor:
    """``reference.encoder_attention``'s contract, on the flat tokens."""
    from torch.nn.attention.varlen import varlen_attn

    num_tokens = qkv.shape[0]
    head_size = qkv.shape[1] // (3 * num_heads)
    # Views of the fused projection: [tokens, 3, heads, head_size] -> q, k, v [tokens, heads, head_size].
    query, key, value = qkv.view(num_tokens, 3, num_heads, head_size).unbind(1)
    out = varlen_attn(query, key, value, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, scale=scale)
    return out.reshape(num_tokens, num_heads * head_size)
