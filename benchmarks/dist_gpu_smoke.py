"""GPU smoke test of the distributed executors on ONE device (TP=1).

Shows that the executor refactor changed nothing on a GPU: the same model
(random weights at a real shape, ``load_format="dummy"``) runs with the
in-process executor (``uni``) and with one spawned worker process (``mp``,
msgpack over a pipe), and

- the greedy tokens must be identical (same device, same kernels);
- the table shows throughput and step time of both, so the IPC cost of the
  worker process is visible, next to the decode floor (weight bytes over the
  measured copy bandwidth of 4.12 TB/s).

Usage (on the H200):
    python benchmarks/dist_gpu_smoke.py                       # Llama-3.1-8B shape, bf16
    python benchmarks/dist_gpu_smoke.py --config benchmarks/configs/llama-3.1-8b.json --batch 64

Writes ``dist_gpu_smoke.json`` and ``dist_gpu_smoke.log`` to ``$OUT`` (or
``--out``). Exit code 1 if the tokens differ.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

COPY_BANDWIDTH_BYTES_S = 4.12e12
HERE = Path(__file__).resolve().parent


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(HERE / "configs" / "llama-3.1-8b.json"))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch", type=int, default=32, help="concurrent requests")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.4)
    parser.add_argument("--platform", default=None)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    return parser.parse_args()


def model_dir_for(config_path: str) -> Path:
    directory = Path(tempfile.mkdtemp(prefix="octavo-dist-smoke-"))
    shutil.copy(config_path, directory / "config.json")
    return directory


def run_backend(backend: str, model_dir: Path, args, prompts: list[list[int]]) -> dict:
    import torch

    from octavo import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(
        str(model_dir),
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype=args.dtype,
        max_model_len=args.prompt_len + args.new_tokens + 16,
        max_num_seqs=max(args.batch, 1),
        gpu_memory_utilization=args.gpu_memory_utilization,
        distributed_executor_backend=backend,
        platform=args.platform,
        seed=0,
    )
    load_s = time.perf_counter() - started
    params = SamplingParams(temperature=0.0, max_tokens=args.new_tokens, ignore_eos=True)
    warmup = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    llm.generate([{"prompt_token_ids": p} for p in prompts[:2]], warmup)

    started = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    total_s = time.perf_counter() - started
    # Decode only: one-token prompts, so nearly every step is a decode step.
    decode_prompts = [{"prompt_token_ids": [p[0]]} for p in prompts]
    started = time.perf_counter()
    llm.generate(decode_prompts, params)
    decode_s = time.perf_counter() - started

    info = llm.engine.info
    llm.engine.shutdown()
    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {
        "backend": backend,
        "platform": info.platform if info else "?",
        "load_s": load_s,
        "tokens_per_s": len(prompts) * args.new_tokens / total_s,
        "decode_step_ms": 1000 * decode_s / args.new_tokens,
        "token_ids": [o.outputs[0].token_ids for o in outputs],
    }


def weight_bytes(config: dict, dtype: str) -> int:
    hidden, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    per_layer = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden + 3 * hidden * inter
    embeddings = config["vocab_size"] * hidden * (1 if config.get("tie_word_embeddings") else 2)
    return (layers * per_layer + embeddings) * (4 if dtype in ("float32", "fp32") else 2)


def main() -> int:
    args = parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=logging.INFO,
        handlers=[logging.FileHandler(out / "dist_gpu_smoke.log"), logging.StreamHandler(sys.stderr)],
    )
    config = json.loads(Path(args.config).read_text())
    rng = random.Random(0)
    prompts = [[rng.randrange(10, config["vocab_size"]) for _ in range(args.prompt_len)] for _ in range(args.batch)]
    model_dir = model_dir_for(args.config)
    try:
        rows = [run_backend(backend, model_dir, args, prompts) for backend in ("uni", "mp")]
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)
    same = rows[0]["token_ids"] == rows[1]["token_ids"]
    floor_ms = 1000 * weight_bytes(config, args.dtype) / COPY_BANDWIDTH_BYTES_S

    print(f"\nmodel {Path(args.config).name} {args.dtype}, batch {args.batch}, prompt {args.prompt_len}, "
          f"{args.new_tokens} new tokens, platform {rows[0]['platform']}")
    print(f"{'executor':<10}{'load s':>9}{'tok/s':>11}{'decode step ms':>16}{'floor ms':>10}")
    for row in rows:
        print(f"{row['backend']:<10}{row['load_s']:>9.1f}{row['tokens_per_s']:>11.1f}"
              f"{row['decode_step_ms']:>16.2f}{floor_ms:>10.2f}")
    print(f"greedy tokens identical (uni vs mp): {same}")
    summary = {k: [{kk: vv for kk, vv in r.items() if kk != "token_ids"} for r in rows] for k in ("rows",)}
    summary.update(identical_tokens=same, decode_floor_ms=floor_ms, args=vars(args))
    (out / "dist_gpu_smoke.json").write_text(json.dumps(summary, indent=2))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
