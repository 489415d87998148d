"""Compile the kernels ahead of time for a GPU target, without a GPU.

Run as a script (``python -m tests.kernels.aot_compile cuda|hip
[--attention-only]``) in a process
where ``TRITON_INTERPRET`` is unset: Triton's interpreter never compiles, so
this is what catches code the GPU compiler rejects. Targets: NVIDIA sm_90
(H100/H200) and AMD gfx942 (MI300). Shapes: Llama-3.1-8B attention (32 query
heads, 8 KV heads, head 128), bfloat16, plus a padded group (7 query heads per
KV head, with a window). Prints one line per kernel: name, shared memory.
"""

from __future__ import annotations

import sys

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from octavo.kernels import (
    activation, attention_merge, fused_moe, fused_moe_gemv, gemv, kv_cache_write, moe_align, moe_decode, moe_topk,
    paged_attention, rms_norm, rotary, split_kv_decode,
)
from octavo.kernels.quant import int4_triton

INT_POINTERS = {"query_start_loc_ptr": "*i32", "seq_lens_ptr": "*i32", "block_table_ptr": "*i32",
                "slot_mapping_ptr": "*i64", "positions_ptr": "*i64", "sorted_slots_ptr": "*i32",
                "block_experts_ptr": "*i32", "ids_ptr": "*i32"}
FP32_POINTERS = {"acc_ptr", "max_ptr", "sum_ptr", "cache_ptr", "cos_sin_ptr", "weights_ptr", "lse_a_ptr", "lse_b_ptr",
                 "sinks_ptr"}
FP32_SCALARS = ("qk_scale", "eps", "weight_offset", "soft_cap", "v_scale", "k_scale_inv", "v_scale_inv")
# Pointers whose type differs by kernel: the grouped int4 layout's packed words and zero points.
KERNEL_POINTERS = {
    name: {"w_ptr": "*i32", "z_ptr": "*u8"} for name in ("_grouped_gemv_kernel", "_grouped_gemv_shared_kernel")
}


# Pointer types a case's name suffix sets: an fp8 KV cache for the attention
# kernels (" fp8"); an fp8 weight with float32 per-feature scales for the GEMV (" w8").
SUFFIX_POINTERS = {
    " fp8": {"k_cache_ptr": "*fp8e4nv", "v_cache_ptr": "*fp8e4nv"},
    " w8": {"w_ptr": "*fp8e4nv", "scale_ptr": "*fp32"},
}
# Integer arguments that are multiples of 16 at the launches that matter
# (Triton specialises them so): without it the offline build masks and loads
# element by element where the GPU's does not (a K mask of constancy 16).
# Integer arguments a launch passes divisible by 16, which Triton then specialises
# (its vectorised loads depend on it): without them the MoE GEMMs' weight loads
# compile to 16-bit scalar loads that no real launch runs.
ALIGNED_INTS = {"up_offset", "row_bytes", "K", "hidden", "inter"}


def case_pointers(name: str) -> dict[str, str]:
    """The pointer types the case ``name``'s suffix sets (none for most)."""
    return next((types for suffix, types in SUFFIX_POINTERS.items() if name.endswith(suffix)), {})


def signature(kernel, constexprs: dict, pointers: dict[str, str] | None = None) -> dict[str, str]:
    types = {}
    own = {**KERNEL_POINTERS.get(kernel.fn.__name__, {}), **(pointers or {})}
    for name in kernel.arg_names:
        if name in own:
            types[name] = own[name]
        elif name in constexprs:
            types[name] = "constexpr"
        elif name in INT_POINTERS:
            types[name] = INT_POINTERS[name]
        elif name in FP32_POINTERS:
            types[name] = "*fp32"
        elif name.endswith("_ptr"):
            types[name] = "*bf16"
        else:
            types[name] = "fp32" if name in FP32_SCALARS else "i32"
    return types


def compile_one(
    kernel, constexprs: dict, target: GPUTarget, num_warps: int = 4, num_stages: int = 2,
    pointers: dict[str, str] | None = None,
):
    # Pointers and strides 16-divisible, as Triton specialises them at launch.
    aligned = [n for n in kernel.arg_names if n.endswith("_ptr") or n.startswith("stride_") or n in ALIGNED_INTS]
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned if n not in constexprs}
    types = signature(kernel, constexprs, pointers)
    source = ASTSource(fn=kernel, signature=types, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=target, options=dict(num_warps=num_warps, num_stages=num_stages))


class GemvTiles:
    """Launch options of a kernel whose config has no ``num_stages`` (its loop has no dot to pipeline)."""

    def __init__(self, num_warps: int, num_stages: int = 2) -> None:
        self.num_warps, self.num_stages = num_warps, num_stages


def cases(attention_only: bool = False):
    pa, sk = paged_attention, split_kv_decode
    for group, window in ((4, False), (7, True)):
        group_pad = triton.next_power_of_2(group)
        for tiles in (pa.DECODE_TILES, pa.PREFILL_TILES):
            consts = dict(GROUP=group, GROUP_PAD=group_pad, HEAD_SIZE=128, HEAD_PAD=128, BLOCK_SIZE=16,
                          BLOCK_Q=tiles.block_m // group_pad, BLOCK_N=tiles.block_n, USE_WINDOW=window,
                          USE_SOFT_CAP=False, DOT_DTYPE=tl.bfloat16, PRECISION=None, FRESH_KV=False,
                          CACHE_DOT_DTYPE=tl.bfloat16, USE_SINKS=False)
            yield f"paged_attention G{group} {tiles}", pa._paged_attention_kernel, consts, tiles
    # Prefill over an fp8 cache: the step's own keys from its bf16 K/V.
    # (its cached context in float16 products: cache_dot_dtype)
    yield "paged_attention fresh fp8", pa._paged_attention_kernel, dict(consts, FRESH_KV=True, CACHE_DOT_DTYPE=tl.float16), \
        pa.PREFILL_TILES
    # Gemma 2: head size 256, soft-capped logits, a sliding window.
    tiles = pa.LARGE_HEAD_PREFILL_TILES
    consts = dict(GROUP=2, GROUP_PAD=2, HEAD_SIZE=256, HEAD_PAD=256, BLOCK_SIZE=16, BLOCK_Q=tiles.block_m // 2,
                  BLOCK_N=tiles.block_n, USE_WINDOW=True, USE_SOFT_CAP=True, DOT_DTYPE=tl.bfloat16, PRECISION=None,
                  FRESH_KV=False, CACHE_DOT_DTYPE=tl.bfloat16, USE_SINKS=False)
    yield f"paged_attention gemma2 {tiles}", pa._paged_attention_kernel, consts, tiles
    # gpt-oss: attention sinks, 8 query heads per KV head, head 64, a window.
    tiles = pa.PREFILL_TILES
    consts = dict(consts, GROUP=8, GROUP_PAD=8, HEAD_SIZE=64, HEAD_PAD=64, BLOCK_Q=tiles.block_m // 8,
                  BLOCK_N=tiles.block_n, USE_SOFT_CAP=False, USE_SINKS=True)
    yield "paged_attention gpt-oss sinks", pa._paged_attention_kernel, consts, tiles
    consts = dict(GROUP=4, ROWS=16, HEAD_SIZE=128, HEAD_PAD=128, BLOCK_SIZE=16, BLOCK_N=64, NUM_SPLITS=16,
                  USE_WINDOW=True, USE_SOFT_CAP=False, DOT_DTYPE=tl.bfloat16, PRECISION=None, PDL=False,
                  USE_SINKS=False)
    yield "split_kv", sk._split_kv_kernel, consts, sk.SPLIT_TILES
    yield "split_kv gpt-oss sinks", sk._split_kv_kernel, dict(consts, GROUP=8, HEAD_SIZE=64, HEAD_PAD=64,
                                                              USE_SINKS=True), sk.SPLIT_TILES
    # An fp8 cache: float16 products (cache_dot_dtype).
    fp8 = dict(consts, BLOCK_N=sk.FP8_SPLIT_TILES.block_n, USE_WINDOW=False, NUM_SPLITS=32, DOT_DTYPE=tl.float16)
    yield "split_kv fp8", sk._split_kv_kernel, fp8, sk.FP8_SPLIT_TILES
    yield "direct decode fp8", sk._split_kv_kernel, dict(fp8, NUM_SPLITS=1), sk.FP8_DIRECT_DECODE_TILES
    consts = dict(consts, GROUP=2, HEAD_SIZE=256, HEAD_PAD=256, USE_SOFT_CAP=True)
    yield "split_kv gemma2", sk._split_kv_kernel, consts, sk.SPLIT_TILES
    if attention_only:
        return
    yield "merge_splits", sk._merge_splits_kernel, dict(HEAD_SIZE=128, HEAD_PAD=128, NUM_SPLITS=16, PDL=False), None
    yield "attention_merge", attention_merge._merge_parts_kernel, dict(
        HEAD_SIZE=128, HEAD_PAD=128, BLOCK_Q=attention_merge.BLOCK_Q), None
    yield "reshape_and_cache", kv_cache_write._reshape_and_cache_kernel, dict(
        NUM_KV_HEADS=8, HEADS_PAD=8, HEAD_SIZE=128, HEAD_PAD=128, BLOCK_SIZE=16, PRE_ROUND=False), None
    yield "rms_norm+residual", rms_norm._rms_norm_kernel, dict(
        HIDDEN=4096, BLOCK=4096, HAS_RESIDUAL=True, SCALE_F32=False, PRE_NORM=False, PDL=False), None
    yield "rms_norm f32 scale (gemma)", rms_norm._rms_norm_kernel, dict(
        HIDDEN=3584, BLOCK=4096, HAS_RESIDUAL=True, SCALE_F32=True, PRE_NORM=False, PDL=False), None
    yield "norm, add, norm (gemma sandwich)", rms_norm._rms_norm_kernel, dict(
        HIDDEN=3584, BLOCK=4096, HAS_RESIDUAL=True, SCALE_F32=True, PRE_NORM=True, PDL=False), None
    yield "rotary", rotary._rotary_kernel, dict(
        NUM_HEADS=32, NUM_KV_HEADS=8, HEADS_PAD=32, KV_HEADS_PAD=8, HALF=64, HALF_PAD=64), None
    yield "rotary+cache", rotary._rotary_cache_kernel, dict(
        NUM_HEADS=32, NUM_KV_HEADS=8, HEADS_PAD=32, KV_HEADS_PAD=8, HALF=64, HALF_PAD=64, BLOCK_SIZE=16,
        PRE_ROUND=False, PDL=False), None
    yield "direct decode", sk._split_kv_kernel, dict(
        GROUP=4, ROWS=16, HEAD_SIZE=128, HEAD_PAD=128, BLOCK_SIZE=16, BLOCK_N=32, NUM_SPLITS=1,
        USE_WINDOW=False, USE_SOFT_CAP=False, DOT_DTYPE=tl.bfloat16, PRECISION=None, PDL=False,
        USE_SINKS=False), sk.FULL_GPU_DECODE_TILES
    # The batch-1 decode chain with programmatic dependent launch (octavo/kernels/pdl.py).
    yield "split_kv pdl", sk._split_kv_kernel, dict(consts, PDL=True), sk.SPLIT_TILES
    yield "merge_splits pdl", sk._merge_splits_kernel, dict(HEAD_SIZE=128, HEAD_PAD=128, NUM_SPLITS=16, PDL=True), None
    yield "rms_norm+residual pdl", rms_norm._rms_norm_kernel, dict(
        HIDDEN=4096, BLOCK=4096, HAS_RESIDUAL=True, SCALE_F32=False, PRE_NORM=False, PDL=True), None
    for pdl in (False, True):  # Qwen3's q and k head norms, one launch
        yield f"qk_rms_norm{' pdl' if pdl else ''}", rms_norm._qk_rms_norm_kernel, dict(
            HEAD=128, BLOCK=128, SCALE_F32=False, PDL=pdl), None
    yield "rotary+cache pdl", rotary._rotary_cache_kernel, dict(
        NUM_HEADS=32, NUM_KV_HEADS=8, HEADS_PAD=32, KV_HEADS_PAD=8, HALF=64, HALF_PAD=64, BLOCK_SIZE=16,
        PRE_ROUND=False, PDL=True), None
    for act_name, act in (("silu", activation.SILU), ("gelu", activation.GELU), ("gelu_tanh", activation.GELU_TANH)):
        yield f"{act_name}_and_mul", activation._gated_kernel, dict(INTERMEDIATE=14336, BLOCK=1024, ACT=act), None
    step = gemv.GemvConfig(4, 256, 4, 3, defer_reduce=False)
    prefetch = gemv.GemvConfig(8, 1024, 4, 2, prefetch=True)
    for block_m, gated, config in ((1, "silu", gemv.DEFAULT_SILU_CONFIG), (1, "gelu_tanh", gemv.DEFAULT_SILU_CONFIG),
                                   (4, None, gemv.DEFAULT_CONFIG), (2, "silu", step), (1, None, prefetch),
                                   (4, "silu", gemv.gated_rows_config(4))):
        consts = dict(BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, HAS_BIAS=True,
                      GATED=gated is not None, ACT=gemv.GATED_ACTIVATIONS.get(gated, activation.SILU),
                      DEFER_REDUCE=config.defer_reduce, EVEN_K=True, HAS_SCALE=False, PREFETCH=config.prefetch,
                      STAGES=1, PDL=False)
        yield f"gemv M{block_m} gated={gated} {config}", gemv._gemv_kernel, consts, config
        if block_m == 1 and gated is None:  # with programmatic dependent launch (octavo/kernels/pdl.py)
            yield f"gemv M1 pdl {config}", gemv._gemv_kernel, dict(consts, PDL=True), config
    # The 8-bit weight-only GEMV (fp8 weight, float32 per-feature scales) at its default tiles.
    config = gemv.DEFAULT_8BIT_CONFIG
    consts = dict(BLOCK_M=1, BLOCK_N=config.block_n, BLOCK_K=config.block_k, HAS_BIAS=False, GATED=False,
                  ACT=activation.SILU, DEFER_REDUCE=config.defer_reduce, EVEN_K=True, HAS_SCALE=True,
                  PREFETCH=config.prefetch, STAGES=1, PDL=False)
    yield f"gemv 8-bit {config} w8", gemv._gemv_kernel, consts, config
    for tiles in (fused_moe.moe_tiles(1, 8, 128), fused_moe.moe_tiles(8192, 2, 8)):  # decode, prefill
        consts = dict(BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
                      DOT_DTYPE=tl.bfloat16, PRECISION=None)
        # Defaulted constexprs named too: a launch takes their defaults as constexprs, ASTSource would not.
        rows = dict(ACT=0, E_PAD=1, SLOTS_PAD=1, PDL=False, TOP_K=1, K_PAD=1)
        yield f"fused_moe gate_up {tiles}", fused_moe._gate_up_kernel, dict(consts, ROWS=0, **rows), tiles
        yield f"fused_moe down {tiles}", fused_moe._down_kernel, consts, tiles
        yield f"fused_moe gate_up per slot {tiles}", fused_moe._gate_up_kernel, dict(consts, ROWS=1, **rows), tiles
    # The decode form's gate-up, a link of the PDL chain (one slot a block at one token).
    tiles = fused_moe.moe_tiles(1, 8, 128)
    consts = dict(BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, DOT_DTYPE=tl.bfloat16,
                  PRECISION=None, ACT=0, ROWS=1, E_PAD=1, SLOTS_PAD=1, PDL=True, TOP_K=1, K_PAD=1)
    yield f"fused_moe gate_up per slot pdl {tiles}", fused_moe._gate_up_kernel, consts, tiles
    # ... and routing for itself from Qwen3-MoE's 128 logits (moe_routed.py).
    consts = dict(consts, ROWS=3, E_PAD=128, TOP_K=8, K_PAD=8)
    yield f"fused_moe gate_up routed pdl {tiles}", fused_moe._gate_up_kernel, consts, tiles
    # The decode form at a few tokens: each program its own block of the alignment (Qwen3-MoE, 16 tokens).
    tiles = fused_moe.moe_tiles(16, 8, 128)
    consts = dict(BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, DOT_DTYPE=tl.bfloat16,
                  PRECISION=None, ACT=0, ROWS=2, E_PAD=128, SLOTS_PAD=128, PDL=False, TOP_K=1, K_PAD=1)
    yield f"fused_moe gate_up aligned in kernel {tiles}", fused_moe._gate_up_kernel, consts, tiles
    # The decode form's down kernel at Qwen3-30B-A3B's (top-8, width 768) and Mixtral's (top-2, 14,336).
    block_n, warps = moe_decode.down_tiles()[:2]
    for top_k, k_pad, block_k in ((8, 8, 256), (2, 2, 1024), (6, 8, 256)):
        consts = dict(TOP_K=top_k, K_PAD=k_pad, BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=True, PDL=False,
                      ROUTED=False, E_PAD=1, RENORMALIZE=False, STAGES=1)
        yield f"moe decode down top-{top_k}", moe_decode._down_topk_sum_kernel, consts, GemvTiles(warps)
    consts = dict(consts, TOP_K=8, K_PAD=8, BLOCK_K=256, PDL=True, ROUTED=True, E_PAD=128, RENORMALIZE=True)
    yield "moe decode down routed pdl top-8", moe_decode._down_topk_sum_kernel, consts, GemvTiles(warps)
    yield "fused_moe align", moe_align._align_kernel, dict(E_PAD=128, BLOCK=64, BLOCK_M=16, FILL_BLOCK=1024, COUNT_BLOCK=1024), None
    yield "fused_moe sum over top-k", fused_moe._sum_over_topk_kernel, dict(TOP_K=8, BLOCK=1024), None
    block_n, block_k, _, down_n, down_k, _ = fused_moe_gemv.moe_gemv_tiles()
    for pdl in (False, True):  # and with programmatic dependent launch (octavo/kernels/pdl.py)
        suffix = " pdl" if pdl else ""
        yield f"fused_moe_gemv gate_up{suffix}", fused_moe_gemv._gate_up_gemv_kernel, dict(
            BLOCK_N=block_n, BLOCK_K=block_k, ACT=0, EVEN_K=True, PDL=pdl), None
        yield f"fused_moe_gemv down{suffix}", fused_moe_gemv._down_gemv_kernel, dict(
            BLOCK_N=down_n, BLOCK_K=down_k, EVEN_K=True, PDL=pdl), None
        yield f"moe topk_softmax{suffix}", moe_topk._topk_softmax_kernel, dict(
            TOP_K=8, K_PAD=8, E_PAD=128, RENORMALIZE=True, PDL=pdl), None
    wide = int4_triton.GroupedGemvConfig(4, 32, 8, deferred=True)
    paired = int4_triton.GroupedGemvConfig(4, 8, 4, deferred=True, row_groups=2)
    for config in (int4_triton.GroupedGemvConfig(4, 4, 4), int4_triton.GEMV_CONFIG, wide, paired):
        consts = dict(BITS=4, P=16, BLOCK_M=1, BLOCK_N=config.block_n, BLOCKS=config.blocks, HAS_BIAS=False,
                      ROW_GROUPS=config.row_groups, PLANE_SCALES=not config.deferred, PDL=False)
        yield f"int4 gemv {config}", int4_triton._grouped_gemv_kernel, consts, GemvTiles(config.num_warps)
    consts = dict(consts, PDL=True)  # the last config with programmatic dependent launch
    yield f"int4 gemv pdl {config}", int4_triton._grouped_gemv_kernel, consts, GemvTiles(config.num_warps)
    # The default: the shared-activation form (its loop keeps barriers: named apart from "int4 gemv").
    config = int4_triton.GEMV_CONFIG
    consts = dict(BITS=4, P=16, BLOCK_M=1, BLOCK_N=config.block_n, BLOCKS=config.blocks, HAS_BIAS=False)
    for pdl in (False, True):
        yield f"int4 common-x gemv{' pdl' if pdl else ''} {config}", int4_triton._grouped_gemv_shared_kernel, \
            dict(consts, PDL=pdl), GemvTiles(config.num_warps)


def main(target_name: str, attention_only: bool) -> None:
    target = GPUTarget("cuda", 90, 32) if target_name == "cuda" else GPUTarget("hip", "gfx942", 64)
    for name, kernel, consts, tiles in cases(attention_only):
        options = dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages) if tiles else {}
        compiled = compile_one(kernel, consts, target, **options, pointers=case_pointers(name))
        print(f"{target_name} {name}: shared {compiled.metadata.shared} bytes", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], attention_only="--attention-only" in sys.argv)
