"""A hand-written Hugging Face decode loop: static cache + torch.compile.

The cross-check for ``octavo bench latency --compare-hf`` (whose default HF
mode is ``generate`` with a static cache + torch.compile): what HF's model
does at batch 1 when driven by the tightest loop one would write by hand.
One ``StaticCache`` (reset in place between runs), prefill eager, each
decode step through ``torch.compile(model, mode="reduce-overhead",
fullgraph=True)`` (CUDA graphs), greedy. Warmed up outside the timed runs;
exits 1 if anything compiled inside them.

Prints ms/token (decode) and the prefill time, median over ``--iters`` runs.

Usage (on the H200; ``gpu_round.sh hf_compiled_check``):
    python benchmarks/hf_compiled_loop.py --model benchmarks/configs/llama-3.1-8b --dtype bfloat16
On the CPU (smoke test): ``--device cpu --backend eager`` on a tiny config.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from octavo.benchmarks.hf_baseline import cache_kwarg, compile_count, load_hf_model  # noqa: E402

HERE = Path(__file__).resolve().parent


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(HERE / "configs" / "llama-3.1-8b"), help="a config (random weights) or checkpoint directory")
    parser.add_argument("--dummy", action=argparse.BooleanOptionalAction, default=True, help="random weights from the config")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--mode", default="reduce-overhead", help="torch.compile mode (reduce-overhead: CUDA graphs)")
    parser.add_argument("--output-json", default=None)
    return parser.parse_args(argv)


class DecodeLoop:
    def __init__(self, model, args: argparse.Namespace, device: torch.device) -> None:
        from transformers import StaticCache

        self.model, self.device = model, device
        self.cache = StaticCache(config=model.config, max_cache_len=args.input_len + args.output_len)
        self.cache_arg = cache_kwarg(model)
        options = {} if args.backend != "inductor" else {"mode": args.mode}
        self.step = torch.compile(model, backend=args.backend, fullgraph=True, **options)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    @torch.no_grad()
    def run(self, input_ids: torch.Tensor, new_tokens: int) -> tuple[float, float, torch.Tensor]:
        """(prefill seconds, total seconds, generated ids) of one greedy run."""
        batch, length = input_ids.shape
        self.cache.reset()
        self._sync()
        started = time.perf_counter()
        positions = torch.arange(length, device=self.device).expand(batch, -1)
        logits = self.model(input_ids=input_ids, position_ids=positions, use_cache=True, logits_to_keep=1,
                            **{self.cache_arg: self.cache}).logits
        token = logits[:, -1].argmax(-1, keepdim=True)
        self._sync()
        prefill = time.perf_counter() - started
        generated = [token]
        for step in range(new_tokens - 1):
            position = torch.full((batch, 1), length + step, device=self.device, dtype=torch.long)
            logits = self.step(input_ids=token, position_ids=position, use_cache=True, **{self.cache_arg: self.cache}).logits
            token = logits[:, -1].argmax(-1, keepdim=True)
            generated.append(token)
        self._sync()
        return prefill, time.perf_counter() - started, torch.cat(generated, dim=1)


def measure(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    model = load_hf_model(args.model, getattr(torch, args.dtype), device, dummy=args.dummy)
    loop = DecodeLoop(model, args, device)
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(10, model.config.vocab_size - 10, (args.batch_size, args.input_len), generator=generator).to(device)
    for _ in range(args.warmup):
        loop.run(input_ids, args.output_len)
    before = compile_count()
    runs = [loop.run(input_ids, args.output_len) for _ in range(args.iters)]
    recompiles = compile_count() - before
    prefill = statistics.median(run[0] for run in runs)
    total = statistics.median(run[1] for run in runs)
    return {
        "prefill_ms": prefill * 1e3,
        "decode_ms_per_token": (total - prefill) / max(args.output_len - 1, 1) * 1e3,
        "recompiles_in_timed_runs": recompiles,
        "token_ids": runs[-1][2].tolist(),
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    result = measure(args)
    print(f"hand-written HF loop (static cache + torch.compile {args.backend}, {args.mode}), "
          f"batch {args.batch_size}, {args.input_len} in / {args.output_len} out, {args.dtype} on {args.device}")
    print(f"prefill {result['prefill_ms']:.2f} ms; decode {result['decode_ms_per_token']:.2f} ms/token; "
          f"compiled in the timed runs: {result['recompiles_in_timed_runs']} graph(s)")
    if args.output_json:
        Path(args.output_json).write_text(json.dumps({"args": vars(args), **result}, indent=2))
    if result["recompiles_in_timed_runs"]:
        print("error: torch.compile compiled inside the timed runs; the figure includes compilation", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
