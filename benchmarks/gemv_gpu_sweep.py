"""Skinny-batch GEMV against cuBLAS at Llama-3.1-8B shapes: ``python benchmarks/gemv_gpu_sweep.py``.

1. Sweep at 1 token: every tile config (``CONFIGS``) on every linear layer
   of the model; plain configs ranked by the time of one decoder layer's
   qkv, o and down projections plus 1/32 of the LM head, fused configs
   by the gate-up projection fused with its activation (SiLU-and-mul;
   GeGLU, ``gate_up_gelu``, for a ``gelu_pytorch_tanh`` model such as Gemma).
2. A chain of ``CHAIN_LAYERS`` layers with distinct weights in one CUDA
   graph, as a decode step runs them: cuBLAS + the Triton SiLU-and-mul
   kernel, against the GEMV with the default and the best configs (fused
   and unfused SiLU). Its bandwidth (weight bytes over time) is what
   batch-1 decode gets.

Round 15 found cuBLAS faster from 2 tokens on (the runtime uses the GEMV at
1 token only); ``--tokens 2,4`` times those again. ``--model DIR`` takes the
shapes from another checkpoint's ``config.json`` (e.g. Gemma-2-9B: 3,584
inputs, which 2,048-wide K tiles do not divide; its GeGLU gate-up is fused
as the runtime fuses it, ``linear_gelu_tanh_and_mul``; an exact-GELU
model's gate-up is a plain GEMV and counts in "plain"); ``--env-file F`` writes the winners as
``OCTAVO_GEMV=...`` / ``OCTAVO_GEMV_SILU=...`` lines for a run that follows.

Times are GPU medians with the L2 flushed before each run (weights never
stay in the L2 in a real step). Compiles run first in a pool of processes.
Writes ``gemv_gpu.log`` and ``gemv_gpu.jsonl`` to ``$OUT`` when set, and
the best configs as ``gemv_best`` / ``gemv_best_silu`` (``OCTAVO_GEMV`` /
``OCTAVO_GEMV_SILU`` values for the next steps of a round).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernels_gpu import copy_bandwidth, time_us  # noqa: E402  (benchmarks/ is on the path when run as a script)
from kernels_gpu_sweep import compile_in_pool  # noqa: E402

from octavo.kernels.activation import gelu_tanh_and_mul, silu_and_mul  # noqa: E402
from octavo.kernels.gemv import DEFAULT_CONFIG, DEFAULT_SILU_CONFIG, GemvConfig, gemv  # noqa: E402

HIDDEN, INTERMEDIATE, QKV, VOCAB = 4096, 14336, 6144, 128256
# name: (out features, in features, the gated activation fused in or None)
SHAPES = {
    "qkv": (QKV, HIDDEN, None),
    "o": (HIDDEN, HIDDEN, None),
    "gate_up": (2 * INTERMEDIATE, HIDDEN, None),
    "gate_up_silu": (2 * INTERMEDIATE, HIDDEN, "silu"),
    "down": (HIDDEN, INTERMEDIATE, None),
    "lm_head": (VOCAB, HIDDEN, None),
}
FUSED = "gate_up_silu"  # the fused gate-up shape's name: "gate_up_gelu" for GeGLU models
GATED_OPS = {"silu": silu_and_mul, "gelu_tanh": gelu_tanh_and_mul}  # the unfused activation launches
PLAIN_WEIGHT = {"qkv": 1.0, "o": 1.0, "down": 1.0, "lm_head": 1 / 32}  # a layer, less its gate-up
WIDTHS = (HIDDEN, INTERMEDIATE)  # the input widths of SHAPES


def use_model(config_dir: str) -> str:
    """Point SHAPES, PLAIN_WEIGHT and WIDTHS at a checkpoint's linear layers; its name."""
    global SHAPES, PLAIN_WEIGHT, WIDTHS, FUSED
    config = json.loads((Path(config_dir) / "config.json").read_text())
    hidden, inter, heads = config["hidden_size"], config["intermediate_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    q, kv = heads * head_dim, config.get("num_key_value_heads", heads) * head_dim
    act = config.get("hidden_activation") or config.get("hidden_act", "silu")
    gated = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}.get(act)
    FUSED = "gate_up_gelu" if gated == "gelu_tanh" else "gate_up_silu"
    SHAPES = {
        "qkv": (q + 2 * kv, hidden, None), "o": (hidden, q, None), "gate_up": (2 * inter, hidden, None),
        FUSED: (2 * inter, hidden, gated or "silu"), "down": (hidden, inter, None),
        "lm_head": (config["vocab_size"], hidden, None),
    }
    PLAIN_WEIGHT = {"qkv": 1.0, "o": 1.0, "down": 1.0, "lm_head": 1 / config["num_hidden_layers"]}
    if gated is None:  # exact GELU: the runtime runs a plain gate-up GEMV, then its activation
        PLAIN_WEIGHT["gate_up"] = 1.0
    WIDTHS = tuple(sorted({shape[1] for shape in SHAPES.values()}))
    return Path(config_dir).name


CONFIGS = [
    GemvConfig(n, k, w, 2, d) for n in (1, 2, 4, 8) for k in (512, 1024, 2048) for w in (2, 4, 8) for d in (True, False)
] + [  # the next K step's loads issued before this step's arithmetic
    GemvConfig(n, k, w, 2, d, prefetch=True) for n in (1, 2, 4, 8) for k in (512, 1024, 2048) for w in (2, 4)
    for d in (True, False)
] + [  # pipelined by Triton: the loop's loads through shared memory, stages - 1 steps ahead
    GemvConfig(n, k, w, st, True, pipelined=True) for n, k, w, st in (
        (4, 1024, 4, 4), (4, 2048, 4, 3), (2, 1024, 4, 4), (8, 512, 4, 4), (4, 512, 4, 4), (1, 2048, 2, 3))
]
CHAIN_LAYERS = 4
DTYPE = torch.bfloat16
DEVICE = torch.device("cuda")
LOG: list[str] = []
RECORDS: list[dict] = []


def say(line: str = "") -> None:
    print(line, flush=True)
    LOG.append(line)


def make_weights(generator: torch.Generator, names: tuple[str, ...] | None = None) -> dict[str, torch.Tensor]:
    # SHAPES read at the call: --model replaces it (and renames the fused shape).
    return {
        name: (torch.randn(*SHAPES[name][:2], device=DEVICE, generator=generator) * 0.02).to(DTYPE)
        for name in names or tuple(SHAPES)
        if name != FUSED
    }


def weight_of(weights: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    return weights["gate_up" if name == FUSED else name]


def cublas_fn(name: str, x: torch.Tensor, weight: torch.Tensor):
    if SHAPES[name][2]:
        act = GATED_OPS[SHAPES[name][2]]
        return lambda: act(F.linear(x, weight))
    return lambda: F.linear(x, weight)


def gemv_fn(name: str, x: torch.Tensor, weight: torch.Tensor, config: GemvConfig):
    return lambda: gemv(x, weight, gated=SHAPES[name][2], config=config)


def inputs_for(num_tokens: int, generator: torch.Generator) -> dict[int, torch.Tensor]:
    """One activation per input width."""
    return {k: torch.randn(num_tokens, k, device=DEVICE, generator=generator).to(DTYPE) for k in WIDTHS}


def config_name(c: GemvConfig) -> str:
    return (f"n{c.block_n} k{c.block_k} w{c.num_warps} {'defer' if c.defer_reduce else 'step'}{' pf' if c.prefetch else ''}"
            f"{f' st{c.num_stages}' if c.pipelined else ''}")


def plain_us(times: dict[str, float]) -> float:
    return sum(w * times[name] for name, w in PLAIN_WEIGHT.items())


def time_shapes(num_tokens: int, weights, xs, config: GemvConfig | None) -> dict[str, float] | None:
    """Per-shape time of ``config`` (None: cuBLAS); None if the config fails or is wrong."""
    times = {}
    for name in SHAPES:
        weight = weight_of(weights, name)
        x = xs[weight.shape[1]]
        fn = cublas_fn(name, x, weight) if config is None else gemv_fn(name, x, weight, config)
        try:
            if config is not None:
                expected = cublas_fn(name, x, weight)().float()
                error = ((fn().float() - expected).abs() - 0.02 * expected.abs()).max().item()
                if error > 0.05:  # beyond assert_close(atol=0.05, rtol=0.02)
                    raise ValueError(f"wrong result (error {error:.3f})")
            times[name] = time_us(fn, reps=25)
        except Exception as exc:  # a config that does not fit (registers, shared memory)
            RECORDS.append({"tokens": num_tokens, "config": asdict(config), "failed": str(exc)[:200]})
            return None
    RECORDS.append({"tokens": num_tokens, "config": None if config is None else asdict(config), "us": times})
    return times


def format_row(label: str, times: dict[str, float], base: dict[str, float]) -> str:
    cells = " ".join(f"{times[name]:8.1f}" for name in SHAPES)
    return f"{label:24s} {cells} {plain_us(times):8.1f} {plain_us(base) / plain_us(times):6.3f}x"


def run_sweep(num_tokens: int, weights, configs) -> tuple[GemvConfig, GemvConfig]:
    """The best (plain, fused SiLU) configs at ``num_tokens``."""
    xs = inputs_for(num_tokens, torch.Generator(device=DEVICE).manual_seed(1))
    base = time_shapes(num_tokens, weights, xs, None)
    results = [(c, t) for c in configs if (t := time_shapes(num_tokens, weights, xs, c)) is not None]
    say(f"\n{num_tokens} token(s): {len(results)} of {len(configs)} configs ran; times in us, "
        "'plain' = " + " + ".join(name if w == 1 else f"{name} x {w:.3g}" for name, w in PLAIN_WEIGHT.items()))
    say(f"{'config':24s} " + " ".join(f"{name[:8]:>8s}" for name in SHAPES) + f" {'plain':>8s} {'vs cublas':>7s}")
    say(format_row(f"cublas (+ {SHAPES[FUSED][2]}_and_mul)", base, base))
    for label, key in (("plain", plain_us), (FUSED, lambda t: t[FUSED])):
        ranked = sorted(results, key=lambda ct: key(ct[1]))
        say(f"best {label}:")
        for config, times in ranked[:4]:
            say(format_row(config_name(config), times, base))
    best_plain = min(results, key=lambda ct: plain_us(ct[1]))[0]
    best_silu = min(results, key=lambda ct: ct[1][FUSED])[0]
    return best_plain, best_silu


def run_chain(num_tokens: int, variants: dict[str, tuple], copy_bw: float) -> None:
    """``CHAIN_LAYERS`` decoder layers' linears in one graph, per variant (plain config, silu config or None)."""
    generator = torch.Generator(device=DEVICE).manual_seed(2)
    layer_names = ("qkv", "o", "gate_up", "down")
    layers = [make_weights(generator, layer_names) for _ in range(CHAIN_LAYERS)]
    xs = inputs_for(num_tokens, generator)
    nbytes = sum(w.numel() * w.element_size() for layer in layers for w in layer.values())
    say(f"\nchain of {CHAIN_LAYERS} layers ({nbytes / 1e9:.2f} GB of weights) in one CUDA graph, {num_tokens} token(s)")
    say(f"{'variant':34s} {'us':>8s} {'TB/s':>6s} {'vs cublas':>9s}")
    cublas_us = None
    for label, (plain, silu, fused) in variants.items():
        fns = []
        for layer in layers:
            for name, w in layer.items():
                x = xs[w.shape[1]]
                if plain is None:
                    fns.append(cublas_fn(FUSED if name == "gate_up" else name, x, w))
                elif name == "gate_up" and fused:
                    fns.append(gemv_fn(FUSED, x, w, silu))
                elif name == "gate_up":
                    act = GATED_OPS[SHAPES[FUSED][2]]
                    fns.append(lambda x=x, w=w, c=plain, act=act: act(gemv(x, w, config=c)))
                else:
                    fns.append(gemv_fn(name, x, w, plain))
        us = time_us(lambda fns=fns: [fn() for fn in fns], reps=15)
        cublas_us = cublas_us or us
        say(f"{label:34s} {us:8.1f} {nbytes / (us * 1e-6) / 1e12:6.2f} {cublas_us / us:8.3f}x")
        RECORDS.append({"chain_tokens": num_tokens, "variant": label, "us": us, "bytes": nbytes, "copy_bw": copy_bw})


# ---------------------------------------------------------------- parallel compile


def _compile_job(job: tuple) -> str | None:
    """Worker: run one (tokens, gated activation or None, config) once so that it lands in Triton's disk cache."""
    num_tokens, gated, config, widths = job
    try:
        for width in widths:  # EVEN_K differs by width
            x = torch.randn(num_tokens, width, device=DEVICE).to(DTYPE)
            gemv(x, torch.randn(512, width, device=DEVICE).to(DTYPE), gated=gated, config=config)
        torch.cuda.synchronize()
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc)[:100]}"
    return None


def precompile(jobs: list[tuple]) -> None:
    compile_in_pool(_compile_job, jobs, say, time.perf_counter(), chunksize=4)


def config_value(c: GemvConfig) -> str:
    return f"{c.block_n},{c.block_k},{c.num_warps},{c.num_stages},{int(c.defer_reduce)},{int(c.prefetch)},{int(c.pipelined)}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="1", help="token counts to sweep, e.g. 1,2,4")
    parser.add_argument("--model", help="a checkpoint directory whose config.json gives the shapes")
    parser.add_argument("--env-file", help="write the best configs as OCTAVO_GEMV / OCTAVO_GEMV_SILU lines")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA device")
    started = time.perf_counter()
    copy_bw = copy_bandwidth()
    say(f"{torch.cuda.get_device_name()}: copy bandwidth {copy_bw / 1e12:.2f} TB/s (read + write)")
    say(f"shapes of {use_model(args.model) if args.model else 'llama-3.1-8b'}: "
        + ", ".join(f"{name} {n}x{k}" for name, (n, k, _) in SHAPES.items()))
    token_counts = [int(t) for t in args.tokens.split(",")]
    gated_forms = (None, SHAPES[FUSED][2])
    precompile([(m, gated, c, WIDTHS) for m in token_counts for gated in gated_forms for c in CONFIGS])
    weights = make_weights(torch.Generator(device=DEVICE).manual_seed(0))
    best = {m: run_sweep(m, weights, CONFIGS) for m in token_counts}
    del weights
    torch.cuda.empty_cache()
    for m, (plain, silu) in best.items():
        run_chain(m, {
            f"cublas + {SHAPES[FUSED][2]}_and_mul": (None, None, False),
            f"default {config_name(DEFAULT_CONFIG)}": (DEFAULT_CONFIG, DEFAULT_SILU_CONFIG, True),
            f"best {config_name(plain)} / {config_name(silu)}": (plain, silu, True),
            f"best {config_name(plain)}, unfused {SHAPES[FUSED][2]}": (plain, None, False),
        }, copy_bw)
    say(f"\ntook {time.perf_counter() - started:.0f} s")
    if args.env_file:
        plain, silu = best[token_counts[0]]
        Path(args.env_file).write_text(f"OCTAVO_GEMV={config_value(plain)}OCTAVO_GEMV_SILU={config_value(silu)}")
        say(Path(args.env_file).read_text().rstrip())
    out_dir = os.environ.get("OUT")
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "gemv_gpu.log").write_text("\n".join(LOG) + "\n")
        (out / "gemv_gpu.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
        plain, silu = best[token_counts[0]]
        (out / "gemv_best").write_text(config_value(plain))
        (out / "gemv_best_silu").write_text(config_value(silu))


if __name__ == "__main__":
    main()
