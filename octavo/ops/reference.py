"""Plain-torch references of the dense layer ops: what each op *means*.

Every implementation a plugin registers for an op is tested against the
function here (the conformance kit runs them side by side), and the
layers fall back to it wherever no implementation applies. They favour
obviousness over speed and follow Hugging Face's rounding steps, so that
a model running on the references matches ``transformers`` token for
token. Each docstring is the op's contract: shapes, dtypes, what may be
modified in place; tolerances live with the op's spec (``specs.py``).

Token-major ops take ``[num_tokens, ...]`` inputs: an implementation's
per-call ``max_tokens`` condition reads ``args[0].shape[0]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

MOE_ACTIVATIONS = ("silu", "gelu", "gelu_tanh")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / sqrt(mean(x**2) + eps)`` over the last dimension.

    ``x``: ``[..., hidden]`` (2-D, or 3-D such as per-head q/k norms on a
    strided view of a fused projection; the last dimension is contiguous),
    float32/bfloat16/float16. ``weight``: ``[hidden]``. Normalise in float32,
    round to ``x.dtype``, then multiply by ``weight`` (result dtype
    ``result_type(weight, x)``). Returns a new tensor; ``x`` is not modified.
    """
    dtype = x.dtype
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def qk_rms_norm(
    query: torch.Tensor, key: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
    weight_offset: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head RMSNorm of a step's queries ``[T, H, D]`` and keys ``[T, Hkv,
    D]`` (Qwen3's and Gemma 3's q/k norms), each head by ``q_weight`` /
    ``k_weight`` ``[D]``: ``rms_norm`` when ``weight_offset`` is None,
    ``rms_norm_f32_scale`` with that offset otherwise. Either input may be a
    strided view of the qkv projection (last dimension contiguous). Returns
    new tensors ``(query, key)``; the inputs are not modified.
    """
    if weight_offset is None:
        return rms_norm(query, q_weight, eps), rms_norm(key, k_weight, eps)
    return rms_norm_f32_scale(query, q_weight, eps, weight_offset), rms_norm_f32_scale(key, k_weight, eps, weight_offset)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual), x + residual)``.

    ``x`` and ``residual``: same shape ``[num_tokens, hidden]`` and dtype;
    the sum is rounded to that dtype (torch's add) and is both the second
    output and the norm's input. Returns new tensors; the inputs are not
    modified.
    """
    summed = x + residual
    return rms_norm(summed, weight, eps), summed


def rms_norm_f32_scale(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float) -> torch.Tensor:
    """RMSNorm scaled in float32 before rounding (Gemma, OLMo 2, as Hugging Face rounds them).

    ``x`` as for ``rms_norm``; normalise in float32, multiply by
    ``weight_offset + weight`` in float32 (Gemma stores the scale minus one:
    offset 1.0; OLMo 2: 0.0), then round to ``x.dtype``.
    """
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (x32 * (weight_offset + weight.to(torch.float32))).to(x.dtype)


def fused_add_rms_norm_f32_scale(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm_f32_scale(x + residual), x + residual)``, the sum rounded to the dtype."""
    summed = x + residual
    return rms_norm_f32_scale(summed, weight, eps, weight_offset), summed


def post_norm_add_rms_norm_f32_scale(
    x: torch.Tensor, residual: torch.Tensor, post_weight: torch.Tensor, weight: torch.Tensor, eps: float,
    weight_offset: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The norm after a block, the residual add and the norm before the next
    block (Gemma's sandwich layers): with ``summed = rms_norm_f32_scale(x,
    post_weight) + residual`` (the normed ``x`` rounded to the dtype, then
    the dtype's rounded sum), returns ``(rms_norm_f32_scale(summed, weight),
    summed)``. Both norms take ``eps`` and ``weight_offset``; shapes and
    dtypes as for ``fused_add_rms_norm_f32_scale``. Returns new tensors."""
    normed = rms_norm_f32_scale(x, post_weight, eps, weight_offset)
    return fused_add_rms_norm_f32_scale(normed, residual, weight, eps, weight_offset)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """LayerNorm over the last dimension: ``(x - mean) / sqrt(var + eps) *
    weight + bias`` (biased variance), all in float32, rounded once to
    ``x.dtype`` (as Hugging Face's Cohere norm and torch's ``LayerNorm``
    round; StarCoder 2 has a bias, Cohere none: ``bias`` None).

    ``x``: ``[num_tokens, hidden]``, or ``[num_tokens, heads, hidden]`` (a
    per-head norm, possibly a strided view of the qkv row; the last
    dimension contiguous). ``weight`` and ``bias``: ``[hidden]``, or
    ``[heads, hidden]`` for a 3-D ``x`` (Cohere's q/k norms have a weight
    per head). Returns a new tensor; ``x`` is not modified.
    """
    x32 = F.layer_norm(x.to(torch.float32), x.shape[-1:], None, None, eps)
    out = x32 * weight.to(torch.float32)
    if bias is not None:
        out = out + bias.to(torch.float32)
    return out.to(x.dtype)


def rotary_embedding(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``query`` ``[T, H, D]`` and ``key`` ``[T, Hkv, D]`` at ``positions``.

    GPT-NeoX "rotate half" layout: for a head ``[x1, x2]`` at position ``p``
    with ``cos_sin_cache[p] = [cos, sin]`` (float32 ``[max_position, D]``,
    each half ``D / 2``): ``x1' = x1 cos - x2 sin``, ``x2' = x2 cos + x1 sin``.
    ``positions``: int64 ``[T]``, each in ``[0, max_position)``. ``query`` and
    ``key`` may be strided views (last dimension contiguous). An
    implementation may rotate them in place: callers use the returned pair.
    A partial rotary (Phi-4-mini, GLM) passes views of each head's first
    ``D`` dims only (the head stride is then larger than ``D``), with a
    table ``D`` wide; the rest of the head is not the op's.
    """
    cos_sin = cos_sin_cache[positions]  # [T, D] = cat(cos_half, sin_half)
    half = cos_sin.shape[-1] // 2
    cos = torch.cat([cos_sin[:, :half]] * 2, dim=-1)[:, None, :]
    sin = torch.cat([cos_sin[:, half:]] * 2, dim=-1)[:, None, :]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        c, s = cos.to(x.dtype), sin.to(x.dtype)
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
        return x * c + torch.cat((-x2, x1), dim=-1) * s

    return rotate(query), rotate(key)


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store token ``t``'s key/value at ``slot_mapping[t]``; negative slots are skipped.

    ``kv_cache``: ``[2, num_blocks, block_size, Hkv, D]`` (the layout of
    ``torch_paged`` and ``triton_paged``); slot ``s`` is block
    ``s // block_size``, offset ``s % block_size``.
    """
    num_kv_heads, head_size = key.shape[1], key.shape[2]
    key_cache = kv_cache[0].view(-1, num_kv_heads, head_size)
    value_cache = kv_cache[1].view(-1, num_kv_heads, head_size)
    slots = slot_mapping[: key.shape[0]]
    valid = slots >= 0
    key_cache[slots[valid]] = key[valid].to(key_cache.dtype)
    value_cache[slots[valid]] = value[valid].to(value_cache.dtype)


def rotary_and_cache(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """``rotary_embedding`` of ``query`` and ``key``, then the rotated key and
    ``value`` stored in ``kv_cache`` at ``slot_mapping`` (``reshape_and_cache``:
    standard layout, negative slots skipped, cast to the cache's dtype).

    Returns the rotated query (an implementation may rotate ``query`` in
    place); ``key`` and ``value`` are not modified. ``slot_mapping`` may be
    longer than ``T`` (graph padding); only its first ``T`` entries count.
    Used by attention backends with ``fuses_rotary`` (one launch for both).
    """
    query, rotated_key = rotary_embedding(positions, query, key, cos_sin_cache)
    reshape_and_cache(rotated_key, value, kv_cache, slot_mapping)
    return query


def _gated(x: torch.Tensor, activation) -> torch.Tensor:
    d = x.shape[-1] // 2
    return activation(x[..., :d]) * x[..., d:]


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` with ``d = x.shape[-1] // 2`` (gate, then up).

    ``x``: ``[num_tokens, 2 * d]``; silu rounded to ``x.dtype`` before the
    product (torch's rounding in that dtype). Returns ``[num_tokens, d]``.
    """
    return _gated(x, F.silu)


def gelu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``gelu(x[..., :d]) * x[..., d:]``, exact (erf) GELU; otherwise as ``silu_and_mul``."""
    return _gated(x, F.gelu)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``gelu_tanh(x[..., :d]) * x[..., d:]``, the tanh approximation of GELU
    (Gemma's ``gelu_pytorch_tanh``); otherwise as ``silu_and_mul``."""
    return _gated(x, lambda gate: F.gelu(gate, approximate="tanh"))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight.T + bias`` for an unquantized weight.

    ``x``: ``[num_tokens, K]``, ``weight``: ``[N, K]`` (rows contiguous),
    ``bias``: ``[N]`` or None, all of one dtype. Returns ``[num_tokens, N]``.
    Registered implementations are usually for skinny batches (decode): give
    them a ``max_tokens`` condition and larger batches take the next one.
    """
    return F.linear(x, weight, bias)


def linear_silu_and_mul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``silu_and_mul(linear(x, weight, bias))``: an MLP's gate-up projection
    (``weight`` = ``[gate; up]``, ``[2 * I, K]``) with its activation.

    The gate and up products are rounded to ``x.dtype`` before the
    activation, as the unfused ops store them. Returns ``[num_tokens, I]``.
    Where no implementation applies, the layers compose the resolved
    ``linear`` and ``silu_and_mul`` instead of calling this reference.
    """
    return silu_and_mul(linear(x, weight, bias))


def linear_gelu_tanh_and_mul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``gelu_tanh_and_mul(linear(x, weight, bias))``: Gemma's GeGLU gate-up
    projection with its activation; otherwise as ``linear_silu_and_mul``
    (gate and up rounded to ``x.dtype`` first; composed where no
    implementation applies)."""
    return gelu_tanh_and_mul(linear(x, weight, bias))


def fused_add_rms_norm_linear(
    x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
    bias: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(linear(normed, weight, bias), normed, summed)`` where ``(normed,
    summed) = fused_add_rms_norm(x, residual, norm_weight, eps)``: the
    residual add and norm before an unquantized projection (a layer's qkv),
    with the normed rows too for other readers. New tensors; the inputs are
    not modified."""
    normed, summed = fused_add_rms_norm(x, residual, norm_weight, eps)
    return linear(normed, weight, bias), normed, summed


def fused_add_rms_norm_route(
    x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, router_weight: torch.Tensor,
    top_k: int, renormalize: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(topk_weights, topk_ids, normed, summed)``: the residual add and
    norm before a MoE layer, its router's logits ``linear(normed,
    router_weight, None)`` (in the activations' dtype) and
    ``moe_topk_softmax`` of them. New tensors; the inputs are not modified."""
    normed, summed = fused_add_rms_norm(x, residual, norm_weight, eps)
    weights, ids = moe_topk_softmax(linear(normed, router_weight, None), top_k, renormalize)
    return weights, ids, normed, summed


def moe_topk_softmax(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A mixture-of-experts router's choice from its logits ``[T, E]``.

    Softmax over the experts in float32, the ``top_k`` largest probabilities
    (largest first, ``torch.topk``'s order) and their expert ids, divided by
    their sum when ``renormalize``. Returns ``(weights float32 [T, K], ids
    int32 [T, K])``, new tensors.
    """
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
) -> torch.Tensor:
    """The experts' weighted sum for routed tokens (the router has already run).

    ``x``: ``[T, H]``; ``w13``: ``[E, 2 * I, H]`` (each expert's gate then
    up projection); ``w2``: ``[E, H, I]``; ``topk_weights``: ``[T, K]``
    (float32, already renormalised if the model does so); ``topk_ids``:
    ``[T, K]`` int, each in ``[0, E)``, or -1 for an expert this rank does
    not hold (expert parallelism: that slot adds nothing). ``activation``: one of
    ``MOE_ACTIVATIONS`` (``silu`` -> ``silu_and_mul``, ``gelu``,
    ``gelu_tanh``). For each token ``t``: ``sum_k topk_weights[t, k] *
    expert(topk_ids[t, k], x[t])`` with ``expert(e, v) = w2[e] @ act(w13[e]
    @ v)``. Each expert's output is computed in ``x.dtype``, scaled by the
    weight cast to ``x.dtype``, and accumulated in ``x.dtype`` in expert
    order (as Hugging Face's Mixtral and Qwen-MoE blocks do). Returns a new
    ``[T, H]`` tensor; the inputs are not modified.
    """
    act = {"silu": silu_and_mul, "gelu": gelu_and_mul, "gelu_tanh": gelu_tanh_and_mul}.get(activation)
    if act is None:
        raise ValueError(f"fused_moe activation {activation!r} is not one of {', '.join(MOE_ACTIVATIONS)}")
    out = torch.zeros_like(x)
    weights = topk_weights.to(x.dtype)
    for expert in range(w13.shape[0]):
        token_index, slot = torch.where(topk_ids == expert)
        if token_index.numel() == 0:
            continue
        hidden = act(F.linear(x[token_index], w13[expert]))
        expert_out = F.linear(hidden, w2[expert]) * weights[token_index, slot, None]
        out.index_add_(0, token_index, expert_out)
    return out


def fused_moe_routed(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    router_logits: torch.Tensor,
    top_k: int,
    renormalize: bool,
    activation: str,
) -> torch.Tensor:
    """``fused_moe`` of the tokens routed by ``moe_topk_softmax(router_logits,
    top_k, renormalize)``: the router's choice and the experts in one op, so
    that an implementation may pick the experts inside the experts' kernels.
    ``router_logits``: ``[T, E]``, every expert of ``w13`` (no expert
    parallelism). Returns a new ``[T, H]`` tensor.
    """
    weights, ids = moe_topk_softmax(router_logits, top_k, renormalize)
    return fused_moe(x, w13, w2, weights, ids, activation)


def encoder_attention(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    grid_index: torch.Tensor,
    token_cells: torch.Tensor,
    key_bias: torch.Tensor | None,
    num_heads: int,
    scale: float,
) -> torch.Tensor:
    """Bidirectional attention within each sequence of a flat batch (encoders).

    ``qkv`` [tokens, 3 * num_heads * head_size]: each token's q, k and v, one
    after another; sequence ``i`` is the tokens ``cu_seqlens[i]:cu_seqlens[i + 1]``
    (int32, ``[num_seqs + 1]``), none longer than ``max_seqlen``. Returns
    [tokens, num_heads * head_size]: each token attends to every token of its
    own sequence and to no other. Tokens past ``cu_seqlens[-1]`` (padding)
    belong to no sequence: their rows are unspecified.

    The same batch laid out on a [num_seqs, max_seqlen] grid, which this
    reference computes on (an implementation may ignore it): ``grid_index``
    [num_seqs * max_seqlen], the token in each cell (an empty cell repeats a
    token of its row); ``token_cells`` [tokens], each token's cell;
    ``key_bias`` [num_seqs, 1, 1, max_seqlen] in ``qkv``'s dtype, 0 for a real
    key and -inf for an empty cell, or None when every sequence fills its row."""
    num_tokens, num_seqs = qkv.shape[0], cu_seqlens.shape[0] - 1
    head_size = qkv.shape[1] // (3 * num_heads)
    # One gather puts q, k and v on the grid: [num_seqs, max_seqlen, 3, heads, head_size].
    grid = qkv.index_select(0, grid_index).view(num_seqs, max_seqlen, 3, num_heads, head_size)
    query, key, value = (grid[:, :, i].transpose(1, 2) for i in range(3))
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=key_bias, scale=scale)
    # One gather takes each token's row back off the grid ([seqs, heads, len, d] -> [tokens, heads, d]).
    cells = out.transpose(1, 2).reshape(num_seqs * max_seqlen, num_heads, head_size)
    return cells.index_select(0, token_cells).reshape(num_tokens, num_heads * head_size)
