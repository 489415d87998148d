"""Skinny-batch GEMV against cuBLAS at Llama-3.1-8B shapes: ``python benchmarks/gemv_gpu_sweep.py``.

1. Sweep: every tile config (``CONFIGS``) on every linear layer of the model
   at 1 token; the configs ranked by the time of one decoder layer (qkv, o,
   gate-up fused with SiLU-and-mul, down) plus 1/32 of the LM head.
2. The best configs again at 2, 4 and 8 tokens.
3. A chain of ``CHAIN_LAYERS`` layers with distinct weights in one CUDA
   graph, as a decode step runs them: cuBLAS + the Triton SiLU-and-mul
   kernel against the GEMV with the best config, per token count. Its
   bandwidth (weight bytes over time) is what batch-1 decode gets.

Times are GPU medians with the L2 flushed before each run (weights never
stay in the L2 in a real step). Compiles run first in a pool of processes.
Writes ``gemv_gpu.log`` and ``gemv_gpu.jsonl`` to ``$OUT`` when set.
"""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from octavo.kernels.gemv import DEFAULT_CONFIG, GemvConfig, gemv  # noqa: E402

HIDDEN, INTERMEDIATE, QKV, VOCAB = 4096, 14336, 6144, 128256
# name: (out features, in features, fused silu-and-mul)
SHAPES = {
    "qkv": (QKV, HIDDEN, False),
    "o": (HIDDEN, HIDDEN, False),
    "gate_up_silu": (2 * INTERMEDIATE, HIDDEN, True),
    "down": (HIDDEN, INTERMEDIATE, False),
    "lm_head": (VOCAB, HIDDEN, False),
}
LAYER_WEIGHT = {"qkv": 1.0, "o": 1.0, "gate_up_silu": 1.0, "down": 1.0, "lm_head": 1 / 32}
CONFIGS = [
    GemvConfig(n, k, w, s, d)
    for n in (4, 8, 16) for k in (256, 512, 1024) for w in (4, 8) for s in (2, 3, 4) for d in (True, False)
]
TOKEN_COUNTS = (2, 4, 8)
NUM_FINALISTS = 6
CHAIN_LAYERS = 4
DTYPE = torch.bfloat16
DEVICE = torch.device("cuda")
LOG: list[str] = []
RECORDS: list[dict] = []


def say(line: str = "") -> None:
    print(line, flush=True)
    LOG.append(line)


_FLUSH = None


def time_us(fn, reps: int = 25) -> float:
    """Median GPU time of one CUDA-graph replay of ``fn``, L2 flushed before each."""
    global _FLUSH
    if _FLUSH is None:
        _FLUSH = torch.empty(256 << 20, dtype=torch.uint8, device=DEVICE)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        _FLUSH.zero_()
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in events)
    return 1000 * times[len(times) // 2]


def copy_bandwidth() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(src)
    return 2 * src.numel() / (time_us(lambda: dst.copy_(src), reps=10) * 1e-6)


def make_weights(generator: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        name: (torch.randn(n, k, device=DEVICE, generator=generator) * 0.02).to(DTYPE)
        for name, (n, k, _) in SHAPES.items()
    }


def cublas_fn(name: str, x: torch.Tensor, weight: torch.Tensor):
    from octavo.kernels.activation import silu_and_mul

    if SHAPES[name][2]:
        return lambda: silu_and_mul(F.linear(x, weight))
    return lambda: F.linear(x, weight)


def gemv_fn(name: str, x: torch.Tensor, weight: torch.Tensor, config: GemvConfig):
    return lambda: gemv(x, weight, silu_mul=SHAPES[name][2], config=config)


def inputs_for(num_tokens: int, generator: torch.Generator) -> dict[int, torch.Tensor]:
    """One activation per input width."""
    return {k: torch.randn(num_tokens, k, device=DEVICE, generator=generator).to(DTYPE) for k in (HIDDEN, INTERMEDIATE)}


def config_name(c: GemvConfig) -> str:
    return f"n{c.block_n} k{c.block_k} w{c.num_warps} s{c.num_stages} {'defer' if c.defer_reduce else 'step'}"


def layer_us(times: dict[str, float]) -> float:
    return sum(LAYER_WEIGHT[name] * us for name, us in times.items())


def time_shapes(num_tokens: int, weights, xs, config: GemvConfig | None, copy_bw: float) -> dict[str, float] | None:
    """Per-shape time of ``config`` (None: cuBLAS); None if the config fails or is wrong."""
    times = {}
    for name, weight in weights.items():
        x = xs[weight.shape[1]]
        fn = cublas_fn(name, x, weight) if config is None else gemv_fn(name, x, weight, config)
        try:
            if config is not None:
                expected = cublas_fn(name, x, weight)().float()
                error = ((fn().float() - expected).abs() - 0.02 * expected.abs()).max().item()
                if error > 0.05:  # beyond assert_close(atol=0.05, rtol=0.02)
                    raise ValueError(f"wrong result (error {error:.3f})")
            times[name] = time_us(fn)
        except Exception as exc:  # a config that does not fit (registers, shared memory)
            RECORDS.append({"tokens": num_tokens, "config": asdict(config), "failed": str(exc)[:200]})
            return None
    bw = {name: weight.numel() * weight.element_size() / (times[name] * 1e-6) / copy_bw for name, weight in weights.items()}
    RECORDS.append({"tokens": num_tokens, "config": None if config is None else asdict(config), "us": times, "frac_copy": bw})
    return times


def format_row(label: str, times: dict[str, float], base: dict[str, float]) -> str:
    cells = " ".join(f"{times[name]:8.1f}" for name in SHAPES)
    return f"{label:26s} {cells} {layer_us(times):9.1f} {layer_us(base) / layer_us(times):6.3f}x"


def run_sweep(weights, copy_bw: float) -> dict[int, GemvConfig]:
    generator = torch.Generator(device=DEVICE).manual_seed(1)
    header = f"{'config':26s} " + " ".join(f"{name[:8]:>8s}" for name in SHAPES) + f" {'layer us':>9s} {'vs cublas':>7s}"
    best: dict[int, GemvConfig] = {}
    finalists = CONFIGS
    for num_tokens in (1, *TOKEN_COUNTS):
        xs = inputs_for(num_tokens, generator)
        base = time_shapes(num_tokens, weights, xs, None, copy_bw)
        results = [(c, t) for c in finalists if (t := time_shapes(num_tokens, weights, xs, c, copy_bw)) is not None]
        results.sort(key=lambda ct: layer_us(ct[1]))
        say(f"\n{num_tokens} token(s): {len(results)} of {len(finalists)} configs ran; times in us")
        say(header)
        say(format_row("cublas (+ silu_and_mul)", base, base))
        default = next((t for c, t in results if c == DEFAULT_CONFIG), None)
        if default is not None:
            say(format_row("default " + config_name(DEFAULT_CONFIG), default, base))
        for config, times in results[:5]:
            say(format_row(config_name(config), times, base))
        frac = {n: weights[n].numel() * 2 / (results[0][1][n] * 1e-6) / copy_bw for n in SHAPES}
        say("best config, % of copy bandwidth: " + " ".join(f"{n} {100 * f:.0f}%" for n, f in frac.items()))
        best[num_tokens] = results[0][0]
        if num_tokens == 1:
            finalists = [c for c, _ in results[:NUM_FINALISTS]]
            finalists += [DEFAULT_CONFIG] if DEFAULT_CONFIG not in finalists else []
            precompile([(m, silu, c) for m in TOKEN_COUNTS for silu in (False, True) for c in finalists])
    return best


def run_chain(best: dict[int, GemvConfig], copy_bw: float) -> None:
    """``CHAIN_LAYERS`` decoder layers' linears in one graph, cuBLAS against the GEMV."""
    generator = torch.Generator(device=DEVICE).manual_seed(2)
    layers = [{n: w for n, w in make_weights(generator).items() if n != "lm_head"} for _ in range(CHAIN_LAYERS)]
    nbytes = sum(w.numel() * w.element_size() for layer in layers for w in layer.values())
    say(f"\nchain of {CHAIN_LAYERS} layers ({nbytes / 1e9:.2f} GB of weights) in one CUDA graph")
    say(f"{'tokens':>6} {'cublas us':>10} {'gemv us':>10} {'speed-up':>8} {'cublas %copy':>12} {'gemv %copy':>10}  config")
    for num_tokens in (1, *TOKEN_COUNTS):
        xs = inputs_for(num_tokens, generator)
        config = best.get(num_tokens, DEFAULT_CONFIG)

        def chain(use_gemv: bool, xs=xs, config=config):
            fns = [
                gemv_fn(name, xs[w.shape[1]], w, config) if use_gemv else cublas_fn(name, xs[w.shape[1]], w)
                for layer in layers
                for name, w in layer.items()
            ]
            return lambda: [fn() for fn in fns]

        cublas_us, gemv_us = time_us(chain(False), reps=15), time_us(chain(True), reps=15)
        frac = lambda us: 100 * nbytes / (us * 1e-6) / copy_bw  # noqa: E731
        say(f"{num_tokens:6d} {cublas_us:10.1f} {gemv_us:10.1f} {cublas_us / gemv_us:7.3f}x "
            f"{frac(cublas_us):11.1f}% {frac(gemv_us):9.1f}%  {config_name(config)}")
        RECORDS.append({"chain_tokens": num_tokens, "cublas_us": cublas_us, "gemv_us": gemv_us, "bytes": nbytes,
                        "config": asdict(config)})


# ---------------------------------------------------------------- parallel compile


def _compile_job(job: tuple) -> str | None:
    """Worker: run one (tokens, silu, config) once so that it lands in Triton's disk cache."""
    num_tokens, silu, config = job
    x = torch.randn(num_tokens, HIDDEN, device=DEVICE).to(DTYPE)
    weight = torch.randn(512, HIDDEN, device=DEVICE).to(DTYPE)
    try:
        gemv(x, weight, silu_mul=silu, config=config)
        torch.cuda.synchronize()
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc)[:100]}"
    return None


def precompile(jobs: list[tuple]) -> None:
    started = time.perf_counter()
    workers = max(1, min(len(jobs), (os.cpu_count() or 2) - 2, 14))
    try:
        context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
            errors = [e for e in pool.map(_compile_job, jobs, chunksize=4) if e]
    except Exception as exc:  # the timing process compiles what is missing
        say(f"parallel compile failed ({type(exc).__name__}: {str(exc)[:100]})")
        return
    say(f"compiled {len(jobs)} kernels in {workers} processes in {time.perf_counter() - started:.0f} s "
        f"({len(errors)} did not run)")


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA device")
    started = time.perf_counter()
    copy_bw = copy_bandwidth()
    say(f"{torch.cuda.get_device_name()}: copy bandwidth {copy_bw / 1e12:.2f} TB/s (read + write)")
    precompile([(1, silu, c) for silu in (False, True) for c in CONFIGS])
    weights = make_weights(torch.Generator(device=DEVICE).manual_seed(0))
    best = run_sweep(weights, copy_bw)
    del weights
    torch.cuda.empty_cache()
    run_chain(best, copy_bw)
    say(f"\ntook {time.perf_counter() - started:.0f} s")
    out_dir = os.environ.get("OUT")
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "gemv_gpu.log").write_text("\n".join(LOG) + "\n")
        # For the next steps of a round: OCTAVO_GEMV=$(cat $OUT/gemv_best_1token)
        c = best[1]
        (Path(out_dir) / "gemv_best_1token").write_text(
            f"{c.block_n},{c.block_k},{c.num_warps},{c.num_stages},{int(c.defer_reduce)}\n"
        )
        with open(Path(out_dir) / "gemv_gpu.jsonl", "w") as f:
            for record in RECORDS:
                f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
