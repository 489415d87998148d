"""GPU benchmark of the Triton kernels (needs only torch and triton).

Run from the repository root on the GPU machine:

    python benchmarks/kernels_gpu.py                # attention table + layer ops
    python benchmarks/kernels_gpu.py --only sweep   # tile shapes per path (kernels_gpu_sweep.py)

Attention at Llama-3.1-8B shapes (32 query heads, 8 KV heads, head size 128,
bfloat16, KV blocks of 16 tokens): decode (batch 1/8/64/256 x context
512/2k/8k), prefill (512, 2048 tokens), a chunked-prefill chunk and a mixed
batch. For each: the one-launch kernel, for decode the direct decode kernel
(one program per token and KV head) and split-KV decode, the torch reference
backend and torch SDPA on contiguous tensors; the max error against SDPA (or
the plain-torch reference where SDPA cannot express the batch); achieved KV
bandwidth against the copy bandwidth measured at the start. Then the fused
layer ops and the KV write against their torch versions.

GPU times are medians of CUDA-event timings with the L2 cache flushed before
each run; Triton and SDPA calls are replayed from a CUDA graph so that launch
overhead is not counted. A short table goes to stdout; with ``$OUT`` set,
``$OUT/kernels_gpu.log`` (the same) and ``$OUT/kernels_gpu.jsonl`` (every
number) are written too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from octavo.core.attention import AttentionBatch, AttentionSpec  # noqa: E402
from octavo.kernels.activation import silu_and_mul  # noqa: E402
from octavo.kernels.kv_cache_write import reshape_and_cache  # noqa: E402
from octavo.kernels.paged_attention import (  # noqa: E402
    AttentionParams,
    PagedBatch,
    TileConfig,
    paged_attention,
    tiles_for,
)
from octavo.kernels.reference import (  # noqa: E402
    apply_rotary_reference,
    fused_add_rms_norm_reference,
    paged_attention_reference,
    reshape_and_cache_reference,
    rms_norm_reference,
    silu_and_mul_reference,
)
from octavo.kernels.rms_norm import fused_add_rms_norm, rms_norm  # noqa: E402
from octavo.kernels.rotary import apply_rotary  # noqa: E402
from octavo.kernels.split_kv_decode import (  # noqa: E402
    DIRECT_DECODE_TILES,
    SPLIT_TILES,
    SplitWorkspace,
    split_kv_decode,
)
from octavo.runtime.attention.torch_paged import TorchPagedAttention  # noqa: E402
from octavo.runtime.attention.torch_paged import paged_attention_reference as torch_backend_attention  # noqa: E402
from octavo.runtime.attention.triton_plan import SplitKvPolicy, num_compute_units  # noqa: E402

NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, BLOCK_SIZE = 32, 8, 128, 16
HIDDEN, INTERMEDIATE = 4096, 14336
DTYPE = torch.bfloat16
SCALE = HEAD_SIZE**-0.5
LAYER_OP_TOKENS = (1, 256, 4096)
TORCH_REF_MAX_TOKENS = 256 * 1024  # the torch backend gathers KV for every head: skip beyond this
DEVICE = torch.device("cuda")
LOG_LINES: list[str] = []
RECORDS: list[dict] = []


def say(line: str = "") -> None:
    print(line, flush=True)
    LOG_LINES.append(line)


# ---------------------------------------------------------------- timing

_FLUSH = None


def time_us(fn, use_graph: bool = True, reps: int = 30) -> float:
    """Median GPU time of ``fn`` in microseconds, L2 flushed before each run."""
    global _FLUSH
    if _FLUSH is None:
        _FLUSH = torch.empty(256 << 20, dtype=torch.uint8, device=DEVICE)
    fn()
    torch.cuda.synchronize()
    run = fn
    if use_graph:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        run = graph.replay
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        _FLUSH.zero_()
        start.record()
        run()
        end.record()
    torch.cuda.synchronize()
    return 1000 * statistics.median(s.elapsed_time(e) for s, e in events)


def copy_bandwidth() -> float:
    """Device copy bandwidth in bytes/s (bytes read + bytes written)."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(src)
    us = time_us(lambda: dst.copy_(src), use_graph=False, reps=20)
    return 2 * src.numel() / (us * 1e-6)


# ---------------------------------------------------------------- attention cases


@dataclass
class AttnCase:
    name: str
    seq_lens: list[int]
    query_lens: list[int]
    results: dict = field(default_factory=dict)

    @property
    def is_decode(self) -> bool:
        return max(self.query_lens) == 1

    @property
    def kv_bytes(self) -> int:
        return sum(self.seq_lens) * NUM_KV_HEADS * HEAD_SIZE * 2 * DTYPE.itemsize

    @property
    def flops(self) -> float:
        # QK^T and PV over the causal pairs of each request.
        pairs = sum(q * (s - q) + q * (q + 1) / 2 for s, q in zip(self.seq_lens, self.query_lens))
        return 4.0 * NUM_HEADS * HEAD_SIZE * pairs


def attention_cases() -> list[AttnCase]:
    cases = [
        AttnCase(f"decode b={b} ctx={ctx}", [ctx] * b, [1] * b)
        for b in (1, 8, 64, 256)
        for ctx in (512, 2048, 8192)
    ]
    cases += [AttnCase(f"prefill {n}", [n], [n]) for n in (512, 2048)]
    cases.append(AttnCase("chunk 512 @ctx 4096", [4608], [512]))
    cases.append(AttnCase("mixed 64 dec@2k + chunk 512@4k", [2048] * 64 + [4608], [1] * 64 + [512]))
    return cases


def build_batch(case: AttnCase, generator: torch.Generator):
    blocks_per_req = [-(-s // BLOCK_SIZE) for s in case.seq_lens]
    num_blocks = sum(blocks_per_req)
    kv_cache = torch.randn(2, num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE, dtype=DTYPE, device=DEVICE)
    order = torch.randperm(num_blocks, generator=generator).to(DEVICE, torch.int32)
    # A width that is a multiple of 16, like the runtime's (max_model_len / block
    # size): Triton specialises on it, and one width keeps one compile per tile shape.
    width = -(-max(blocks_per_req) // 16) * 16
    block_table = torch.zeros(len(case.seq_lens), width, dtype=torch.int32, device=DEVICE)
    start = 0
    for i, n in enumerate(blocks_per_req):
        block_table[i, :n] = order[start : start + n]
        start += n
    query_start_loc = torch.tensor([0] + torch.tensor(case.query_lens).cumsum(0).tolist(), dtype=torch.int32)
    seq_lens = torch.tensor(case.seq_lens, dtype=torch.int32)
    attn_batch = AttentionBatch(
        query_start_loc=query_start_loc.to(DEVICE),
        seq_lens=seq_lens.to(DEVICE),
        block_table=block_table,
        slot_mapping=torch.zeros(sum(case.query_lens), dtype=torch.int64, device=DEVICE),
        num_reqs=len(case.seq_lens),
        num_actual_tokens=sum(case.query_lens),
        max_query_len=max(case.query_lens),
        max_seq_len=max(case.seq_lens),
        query_start_loc_cpu=query_start_loc,
        seq_lens_cpu=seq_lens,
    )
    query = torch.randn(sum(case.query_lens), NUM_HEADS, HEAD_SIZE, dtype=DTYPE, device=DEVICE)
    return query, kv_cache, attn_batch


def gathered_kv(kv_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each request's first ``seq_len`` keys and values out of the paged cache: [B, seq_len, Hkv, D]."""
    table = block_table.long()
    return tuple(kv_cache[i][table].reshape(table.shape[0], -1, NUM_KV_HEADS, HEAD_SIZE)[:, :seq_len] for i in (0, 1))


def sdpa_fn(case: AttnCase, query, kv_cache, attn_batch):
    """SDPA over contiguous K/V, or None when it cannot express the batch."""
    uniform = len(set(case.seq_lens)) == 1 and len(set(case.query_lens)) == 1
    if not uniform or case.query_lens[0] not in (1, case.seq_lens[0]):
        return None, None
    batch, seq_len, q_len = len(case.seq_lens), case.seq_lens[0], case.query_lens[0]
    k, v = (t.transpose(1, 2).contiguous() for t in gathered_kv(kv_cache, attn_batch.block_table, seq_len))
    q = query.view(batch, q_len, NUM_HEADS, HEAD_SIZE).transpose(1, 2)
    causal = q_len > 1
    try:
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=SCALE, enable_gqa=True)
        kind = "gqa"
    except (RuntimeError, TypeError):
        k, v = k.repeat_interleave(NUM_HEADS // NUM_KV_HEADS, 1), v.repeat_interleave(NUM_HEADS // NUM_KV_HEADS, 1)
        kind = "expanded"

    def run():
        extra = {"enable_gqa": True} if kind == "gqa" else {}
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=SCALE, **extra)
        return out.transpose(1, 2).reshape(-1, NUM_HEADS, HEAD_SIZE)

    return run, kind


def max_error(out: torch.Tensor, expected: torch.Tensor) -> float:
    return float((out.float() - expected.float()).abs().max())


@dataclass
class AttnInputs:
    query: torch.Tensor
    kv_cache: torch.Tensor
    attn_batch: AttentionBatch

    @property
    def paged(self) -> PagedBatch:
        b = self.attn_batch
        return PagedBatch(b.query_start_loc, b.seq_lens, b.block_table, b.num_reqs)


TRITON_PATHS = ("one_launch", "direct", "split")


def triton_path(case: AttnCase, inputs: AttnInputs, key: str, tiles: TileConfig | None = None):
    """(call, extra results) of one Triton path with ``tiles`` (None: its default).

    "one_launch": the paged-attention kernel (any batch); "direct": the decode
    kernel, one program per (token, KV head); "split": split-KV decode with the
    policy's split count (4 where the policy would not split); "split<N>": with N;
    "fresh": the paged-attention kernel reading each request's new tokens from
    contiguous K/V (``fresh_kv``) rather than through the block table.
    """
    query, kv_cache, paged, params = inputs.query, inputs.kv_cache, inputs.paged, AttentionParams(SCALE)
    if key == "one_launch":
        tiles = tiles or tiles_for(max(case.query_lens), HEAD_SIZE)
        return (lambda: paged_attention(query, kv_cache, paged, params, tiles)), {}
    if key == "fresh":
        tiles = tiles or tiles_for(max(case.query_lens), HEAD_SIZE)
        fresh = fresh_kv_of(case, inputs)
        return (lambda: paged_attention(query, kv_cache, paged, params, tiles, fresh_kv=fresh)), {}
    if key == "direct":
        tiles = tiles or DIRECT_DECODE_TILES
        return (lambda: split_kv_decode(query, kv_cache, paged, params, None, tiles)), {}
    policy_splits = policy_num_splits(case)
    splits = policy_splits if policy_splits > 1 else 4
    if key != "split":  # "split<N>": N splits, whatever the policy says
        splits = int(key.removeprefix("split"))
    workspace = SplitWorkspace.allocate(query.shape[0], NUM_HEADS, HEAD_SIZE, splits, DEVICE)
    tiles = tiles or SPLIT_TILES
    return (lambda: split_kv_decode(query, kv_cache, paged, params, workspace, tiles)), {"splits": splits}


def fresh_kv_of(case: AttnCase, inputs: AttnInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Each request's new tokens' keys and values as contiguous [T, Hkv, D] tensors
    (a prefill step's own K/V, ``paged_attention``'s ``fresh_kv``), gathered from the cache."""
    keys, values = [], []
    for i, (seq_len, query_len) in enumerate(zip(case.seq_lens, case.query_lens)):
        positions = torch.arange(seq_len - query_len, seq_len, device=DEVICE)
        blocks = inputs.attn_batch.block_table[i, positions // BLOCK_SIZE].long()
        keys.append(inputs.kv_cache[0][blocks, positions % BLOCK_SIZE])
        values.append(inputs.kv_cache[1][blocks, positions % BLOCK_SIZE])
    return torch.cat(keys), torch.cat(values)


def policy_num_splits(case: AttnCase) -> int:
    """The runtime's split count for this decode batch (1: the direct kernel)."""
    num_sms = num_compute_units(DEVICE)
    return SplitKvPolicy().num_splits(len(case.seq_lens), NUM_KV_HEADS, 1, max(case.seq_lens), num_sms)


def time_triton_paths(
    case: AttnCase, inputs: AttnInputs, overrides: dict, paths=TRITON_PATHS, reps: int = 30
) -> dict[str, torch.Tensor]:
    """Time the one-launch kernel (and, for decode, the direct and split kernels); return their outputs."""
    outputs = {}
    for key in paths:
        if key not in ("one_launch", "fresh") and not case.is_decode:
            continue
        call, extra = triton_path(case, inputs, key, overrides.get(key))
        case.results[f"{key}_us"] = time_us(call, reps=reps)
        case.results.update(extra)
        outputs[key] = call()
    if case.is_decode:
        policy_splits = policy_num_splits(case)
        case.results["policy"] = f"split({policy_splits})" if policy_splits > 1 else "direct"
    return outputs


def time_baselines(case: AttnCase, inputs: AttnInputs) -> torch.Tensor:
    """Time SDPA and the torch backend; return the output to check against."""
    query, kv_cache, attn_batch = inputs.query, inputs.kv_cache, inputs.attn_batch
    sdpa, sdpa_kind = sdpa_fn(case, query, kv_cache, attn_batch)
    expected = None
    if sdpa is not None:
        case.results.update(sdpa_us=time_us(sdpa), sdpa_kind=sdpa_kind, error_against="sdpa")
        expected = sdpa()
    if sum(case.seq_lens) <= TORCH_REF_MAX_TOKENS:
        backend = TorchPagedAttention(AttentionSpec(NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, SCALE, DTYPE, DTYPE, BLOCK_SIZE))
        metadata = backend.build_metadata(attn_batch)
        ref = lambda: torch_backend_attention(query, kv_cache, metadata, backend.spec)  # noqa: E731
        case.results["torch_ref_us"] = time_us(ref, use_graph=False, reps=5)
    if expected is None:
        case.results["error_against"] = "reference"
        b = attn_batch
        expected = paged_attention_reference(query, kv_cache, b.query_start_loc, b.seq_lens, b.block_table, SCALE)
    return expected


def run_attention_case(case: AttnCase, copy_bw: float) -> None:
    inputs = AttnInputs(*build_batch(case, torch.Generator().manual_seed(0)))
    outputs = time_triton_paths(case, inputs, {})
    expected = time_baselines(case, inputs)
    res = case.results
    for path, out in outputs.items():
        res[f"{path}_max_err"] = max_error(out, expected)
    best = min(res[f"{key}_us"] for key in TRITON_PATHS if f"{key}_us" in res)
    res["kv_bytes"] = case.kv_bytes
    res["best_bw_tbs"] = case.kv_bytes / (best * 1e-6) / 1e12
    res["best_bw_frac"] = case.kv_bytes / (best * 1e-6) / copy_bw
    res["best_tflops"] = case.flops / (best * 1e-6) / 1e12
    del inputs, outputs, expected
    torch.cuda.empty_cache()


def format_attention(case: AttnCase) -> str:
    r = case.results

    def us(key):
        return f"{r[key]:9.1f}" if key in r else f"{'-':>9}"

    split = f"{r['split_us']:9.1f}/{r['splits']:<2d}" if "split_us" in r else f"{'-':>12}"
    errors = max(v for k, v in r.items() if k.endswith("_max_err"))
    return (
        f"{case.name:32s} {r['kv_bytes'] / 1e6:9.1f} {us('one_launch_us')} {us('direct_us')} {split} {us('sdpa_us')} "
        f"{us('torch_ref_us')} {r['best_bw_tbs']:6.2f} {100 * r['best_bw_frac']:5.1f}% {r['best_tflops']:7.1f} "
        f"{r.get('policy', '-'):>10s} {errors:8.4f} ({r['error_against']})"
    )


ATTN_HEADER = (
    f"{'case':32s} {'KV MB':>9} {'1-launch':>9} {'direct':>9} {'split/n':>12} {'sdpa':>9} {'torch-ref':>9} "
    f"{'TB/s':>6} {'%copy':>6} {'TFLOP/s':>7} {'policy':>10} {'max err':>8}"
)


# ---------------------------------------------------------------- layer ops


def layer_op_rows(num_tokens: int) -> list[tuple[str, object, object, int]]:
    """(name, triton fn, torch fn, bytes moved) for one token count."""
    x = torch.randn(num_tokens, HIDDEN, dtype=DTYPE, device=DEVICE)
    residual = torch.randn_like(x)
    weight = torch.randn(HIDDEN, dtype=DTYPE, device=DEVICE)
    gate_up = torch.randn(num_tokens, 2 * INTERMEDIATE, dtype=DTYPE, device=DEVICE)
    qkv = torch.randn(num_tokens, (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_SIZE, dtype=DTYPE, device=DEVICE)
    q = qkv[:, : NUM_HEADS * HEAD_SIZE].view(num_tokens, NUM_HEADS, HEAD_SIZE)
    k = qkv[:, NUM_HEADS * HEAD_SIZE : (NUM_HEADS + NUM_KV_HEADS) * HEAD_SIZE].view(num_tokens, NUM_KV_HEADS, HEAD_SIZE)
    v = qkv[:, (NUM_HEADS + NUM_KV_HEADS) * HEAD_SIZE :].view(num_tokens, NUM_KV_HEADS, HEAD_SIZE)
    cos_sin = torch.randn(8192, HEAD_SIZE, dtype=torch.float32, device=DEVICE)
    positions = torch.randint(0, 8192, (num_tokens,), device=DEVICE)
    num_slots = max(num_tokens, 1) * 4
    kv_cache = torch.zeros(2, num_slots // BLOCK_SIZE + 1, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE, dtype=DTYPE, device=DEVICE)
    slots = torch.randperm(num_slots, device=DEVICE)[:num_tokens]
    e = DTYPE.itemsize
    rows = [
        ("rms_norm", lambda: rms_norm(x, weight, 1e-5), lambda: rms_norm_reference(x, weight, 1e-5), 2 * x.numel() * e),
        ("fused_add_rms_norm", lambda: fused_add_rms_norm(x, residual, weight, 1e-5),
         lambda: fused_add_rms_norm_reference(x, residual, weight, 1e-5), 4 * x.numel() * e),
        ("silu_and_mul", lambda: silu_and_mul(gate_up), lambda: silu_and_mul_reference(gate_up), 3 * gate_up.numel() // 2 * e),
        ("rotary", lambda: apply_rotary(positions, q, k, cos_sin), lambda: apply_rotary_reference(positions, q, k, cos_sin),
         2 * (q.numel() + k.numel()) * e),
        ("reshape_and_cache", lambda: reshape_and_cache(k, v, kv_cache, slots),
         lambda: reshape_and_cache_reference(k, v, kv_cache, slots), 4 * k.numel() * e),
    ]
    return rows


def run_layer_ops(copy_bw: float) -> None:
    say(f"{'op':20s} {'tokens':>6} {'triton us':>10} {'torch us':>10} {'speedup':>8} {'triton %copy':>12}")
    for num_tokens in LAYER_OP_TOKENS:
        for name, triton_fn, torch_fn, nbytes in layer_op_rows(num_tokens):
            # Rotary works in place: timing it repeatedly keeps rotating, which is fine for timing.
            triton_us = time_us(triton_fn)
            torch_us = time_us(torch_fn, use_graph=name != "reshape_and_cache")
            frac = nbytes / (triton_us * 1e-6) / copy_bw
            say(f"{name:20s} {num_tokens:6d} {triton_us:10.1f} {torch_us:10.1f} {torch_us / triton_us:7.2f}x {100 * frac:11.1f}%")
            RECORDS.append({"op": name, "tokens": num_tokens, "triton_us": triton_us, "torch_us": torch_us, "bytes": nbytes})


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("attention", "ops", "sweep", "sweep_long"), help="run one part only")
    parser.add_argument("--env-file", help="sweep_long: write the winners as OCTAVO_TILES_* lines here")
    parser.add_argument("--sweep", action="store_true", help="also time other tile shapes for a few cases")
    args = parser.parse_args()
    parts = {args.only} if args.only else {"attention", "ops"} | ({"sweep"} if args.sweep else set())
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA (or ROCm) device")
    import triton

    props = torch.cuda.get_device_properties(DEVICE)
    copy_bw = copy_bandwidth()
    say(f"device {props.name}, {props.multi_processor_count} SMs; torch {torch.__version__}, triton {triton.__version__}")
    say(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s (read + write); times in us (GPU, median, L2 flushed)")
    if "attention" in parts:
        say()
        say(ATTN_HEADER)
        for case in attention_cases():
            run_attention_case(case, copy_bw)
            say(format_attention(case))
            RECORDS.append({"case": case.name, "seq_lens": sorted(set(case.seq_lens)), **case.results})
    if parts & {"sweep", "sweep_long"}:
        from kernels_gpu_sweep import run_sweep  # benchmarks/ is on the path when run as a script

        say()
        run_sweep(sys.modules[__name__], copy_bw, long_context="sweep_long" in parts, env_file=args.env_file)
    if "ops" in parts:
        say()
        run_layer_ops(copy_bw)
    write_logs()


def write_logs() -> None:
    out_dir = os.environ.get("OUT")
    if not out_dir:
        return
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / "kernels_gpu.log").write_text("\n".join(LOG_LINES) + "\n")
    with open(Path(out_dir) / "kernels_gpu.jsonl", "w") as f:
        for record in RECORDS:
            f.write(json.dumps(record, default=str) + "\n")


if __name__ == "__main__":
    main()
