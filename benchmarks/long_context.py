"""Long context on one device: time to first token at 8k / 32k / 128k and
batch-1 decode at 8k / 32k, each beside its floor (linear layers plus
causal attention's FLOPs, or the weight and KV bytes a decode step reads;
``octavo/benchmarks/floor.py``) measured in the same run, and beside torch
``scaled_dot_product_attention`` (flash on CUDA) timed on the same
attention shapes, with that attention's own floor.

    python benchmarks/long_context.py --model benchmarks/configs/llama-3.1-8b \
        --load-format dummy --dtype bfloat16 [--async-scheduling]

The engine logs at start-up how many KV tokens fit (``KV cache: ...``);
the table's header repeats it. Prompts are random token ids, distinct per
run (no prefix-cache hits). Decode per token = (time for 1 + N tokens -
TTFT) / N, medians over ``--iters``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from octavo.benchmarks.ceilings import _timed as timed_seconds
from octavo.benchmarks.ceilings import measure_ceilings
from octavo.benchmarks.floor import decode_step_floor, prefill_floor
from octavo.benchmarks.inventory import measure_inventory
from octavo.benchmarks.runs import OctavoRunner, random_prompts
from octavo.engine_args import EngineArgs
from octavo.models.config import load_arch_config


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--ttft-lens", default="8192,32768,131072")
    parser.add_argument("--decode-lens", default="8192,32768")
    parser.add_argument("--decode-steps", type=int, default=64)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--max-num-batched-tokens", type=int, default=16384)
    parser.add_argument("--async-scheduling", action="store_true")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--platform", default=None)
    parser.add_argument("--output-json", default=None)
    return parser.parse_args(argv)


def lengths(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def median_seconds(runner: OctavoRunner, length: int, max_tokens: int, iters: int, seed: int) -> float:
    times = []
    for i in range(iters):
        [prompt] = random_prompts(1, length, runner.vocab_size, seed=seed + i)
        times.append(runner.run([prompt], max_tokens))
    return statistics.median(times)


def sdpa_seconds(shape, query_len: int, context: int, device: torch.device, dtype: torch.dtype, iters: int = 5) -> float:
    """All layers' attention of one step by torch SDPA (flash where it runs)."""
    q = torch.randn(1, shape.num_heads, query_len, shape.head_dim, device=device, dtype=dtype)
    k = torch.randn(1, shape.num_kv_heads, context, shape.head_dim, device=device, dtype=dtype)
    v = torch.randn_like(k)
    causal = query_len == context  # a prefill; a decode query sees the whole context

    def attend():
        sdpa = torch.nn.functional.scaled_dot_product_attention
        if device.type == "cuda":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return sdpa(q, k, v, is_causal=causal, enable_gqa=True)
        return sdpa(q, k, v, is_causal=causal, enable_gqa=True)

    try:
        return timed_seconds(attend, device, iters) * shape.num_layers
    except RuntimeError as exc:  # no flash kernel for these shapes (GQA): full heads instead
        print(f"SDPA flash with GQA: {exc}; timing it with the KV heads repeated")
        k = k.repeat_interleave(shape.num_heads // shape.num_kv_heads, dim=1)
        v = v.repeat_interleave(shape.num_heads // shape.num_kv_heads, dim=1)
        return timed_seconds(attend, device, iters) * shape.num_layers


class AttentionShape:
    def __init__(self, inventory, arch) -> None:
        attention = inventory.attention
        self.num_layers = attention.num_layers
        self.query_width = attention.query_width
        self.kv_bytes_per_token = attention.num_layers * attention.kv_bytes_per_token_layer
        self.head_dim = arch.head_dim
        self.num_heads = arch.num_attention_heads
        self.num_kv_heads = arch.num_key_value_heads


def attention_floors(shape: AttentionShape, ceilings, kind: str, context: int) -> tuple[float, float]:
    """(prefill, decode) attention floors at ``context``: causal FLOPs over the
    matmul rate; one query's KV bytes over the copy bandwidth."""
    prefill = shape.num_layers * 2 * context * context * shape.query_width / ceilings.matmul_rate(kind)
    decode = context * shape.kv_bytes_per_token / ceilings.copy_bytes_per_s
    return prefill, decode


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ttft_lens, decode_lens = lengths(args.ttft_lens), lengths(args.decode_lens)
    max_len = max([*ttft_lens, *decode_lens]) + args.decode_steps + 2
    if Path(args.model, "config.json").is_file():
        # 128k prompts: the model's context bounds the prompt and its new tokens.
        max_len = min(max_len, load_arch_config(Path(args.model)).max_position_embeddings)
    engine_args = EngineArgs(
        model=args.model, load_format=args.load_format, dtype=args.dtype, max_model_len=max_len, max_num_seqs=1,
        max_num_batched_tokens=args.max_num_batched_tokens, enable_prefix_caching=False,
        async_scheduling=args.async_scheduling, enforce_eager=args.enforce_eager, platform=args.platform,
    )
    runner = OctavoRunner(engine_args)
    engine = runner.engine
    kv_tokens = engine.scheduler.kv.num_blocks * engine.limits.block_size
    device = engine.executor.worker.device
    dtype = getattr(torch, engine.info.dtype)
    model_path = engine.info.model_path  # a Hub id resolved to its directory
    inventory = measure_inventory(model_path, None, dtype, dtype, device)
    ceilings = measure_ceilings(device, inventory.matmul_kinds())
    shape = AttentionShape(inventory, load_arch_config(Path(model_path)))
    print(f"KV cache: {kv_tokens} tokens fit (max_model_len {max_len}); async scheduling: {engine.async_scheduling}")
    print(ceilings.describe())
    runner.run(random_prompts(1, min(ttft_lens + decode_lens), runner.vocab_size, seed=99), 2)  # warm-up
    rows, results = [], {"kv_tokens": kv_tokens, "ttft": {}, "decode": {}}
    for length in ttft_lens:
        length = min(length, max_len - 1)  # room for the first token
        ours = median_seconds(runner, length, 1, args.iters, seed=length)
        floor = prefill_floor(inventory, ceilings, 1, length).seconds
        sdpa = sdpa_seconds(shape, length, length, device, dtype)
        attention_floor = attention_floors(shape, ceilings, inventory.model_kind, length)[0]
        results["ttft"][length] = dict(octavo_s=ours, floor_s=floor, sdpa_attention_s=sdpa, attention_floor_s=attention_floor)
        rows.append((f"TTFT, one {length}-token prompt", ours, floor, sdpa, attention_floor))
    for length in decode_lens:
        length = min(length, max_len - 1 - args.decode_steps)
        ttft = median_seconds(runner, length, 1, args.iters, seed=10 * length)
        full = median_seconds(runner, length, 1 + args.decode_steps, args.iters, seed=20 * length)
        ours = (full - ttft) / args.decode_steps
        context = length + args.decode_steps / 2
        floor = decode_step_floor(inventory, ceilings, 1, context).seconds
        sdpa = sdpa_seconds(shape, 1, int(context), device, dtype)
        attention_floor = attention_floors(shape, ceilings, inventory.model_kind, int(context))[1]
        results["decode"][length] = dict(octavo_s=ours, floor_s=floor, sdpa_attention_s=sdpa, attention_floor_s=attention_floor)
        rows.append((f"batch-1 decode at {length} context", ours, floor, sdpa, attention_floor))
    runner.close()
    print_table(rows)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


def print_table(rows) -> None:
    ms = lambda s: f"{s * 1e3:,.2f} ms"  # noqa: E731
    print("| workload | Octavo | floor | ratio | attention: SDPA flash | attention floor |")
    print("|---|---|---|---|---|---|")
    for name, ours, floor, sdpa, attention_floor in rows:
        print(f"| {name} | {ms(ours)} | {ms(floor)} | {ours / floor:.2f}x | {ms(sdpa)} | {ms(attention_floor)} |")


if __name__ == "__main__":
    raise SystemExit(main())
