"""Multi-GPU check and benchmark of tensor / pipeline / data parallelism (issue 9).

Needs a machine with several GPUs (e.g. ``nvidia-h200-x4``); not run on one GPU.

Part 1, equality: a random *real-weight* checkpoint at the config's shape
(``--equality-layers`` layers, float32, saved as safetensors, so every layout
reads the same weights and slices them itself) generates greedily with every
layout that fits the GPUs (TP=1; TP=2, 4, 8; PP=2; TP=2 x PP=2) and is
compared with TP=1: identical tokens, or, where a sequence diverges, each
side's token within the other's top-5 (the project's near-tie rule).

Part 2, benchmark: random dummy weights at the full config in bf16; for each
layout, end-to-end tokens/s at several batch sizes and the decode step time
next to the floor (weight bytes per TP rank over 4.12 TB/s). Data parallelism
(DP=2) is benchmarked against DP=1 at the largest batch.

Usage:
    python benchmarks/dist_multi_gpu.py                      # Llama-3.1-8B shape
    python benchmarks/dist_multi_gpu.py --skip-equality --batches 1,32,128

Writes ``dist_multi_gpu.json`` and ``dist_multi_gpu.log`` to ``$OUT``.
Exit code 1 if a layout's tokens fail the equality rule.
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
LAYOUTS = [(1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (2, 2)]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(HERE / "configs" / "llama-3.1-8b.json"))
    parser.add_argument("--equality-layers", type=int, default=4)
    parser.add_argument("--equality-prompts", type=int, default=16)
    parser.add_argument("--equality-tokens", type=int, default=32)
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    parser.add_argument("--skip-equality", action="store_true")
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    return parser.parse_args()


def num_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def write_random_checkpoint(config: dict, num_layers: int, directory: Path) -> Path:
    """Seeded random float32 weights (std 0.02, norms 1) in safetensors."""
    import torch
    from safetensors.torch import save_file

    config = dict(config, num_hidden_layers=num_layers, torch_dtype="float32")
    (directory / "config.json").write_text(json.dumps(config))
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    generator = torch.Generator().manual_seed(0)

    def normal(*shape):
        return torch.randn(*shape, generator=generator) * 0.02

    tensors = {"model.embed_tokens.weight": normal(config["vocab_size"], hidden), "model.norm.weight": torch.ones(hidden)}
    if not config.get("tie_word_embeddings"):
        tensors["lm_head.weight"] = normal(config["vocab_size"], hidden)
    for i in range(num_layers):
        p = f"model.layers.{i}."
        tensors.update({
            p + "self_attn.q_proj.weight": normal(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": normal(kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": normal(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": normal(hidden, heads * head_dim),
            p + "mlp.gate_proj.weight": normal(inter, hidden),
            p + "mlp.up_proj.weight": normal(inter, hidden),
            p + "mlp.down_proj.weight": normal(hidden, inter),
            p + "input_layernorm.weight": torch.ones(hidden),
            p + "post_attention_layernorm.weight": torch.ones(hidden),
        })
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


def make_llm(model_dir: Path, tp: int, pp: int, **options):
    from octavo import LLM

    return LLM(
        str(model_dir), skip_tokenizer_init=True, tensor_parallel_size=tp, pipeline_parallel_size=pp,
        distributed_executor_backend="mp" if tp * pp > 1 else None, seed=0, **options,
    )


def release(llm) -> None:
    import torch

    llm.engine.shutdown()
    del llm
    gc.collect()
    torch.cuda.empty_cache()


def near_tie_equal(got, want) -> bool:
    """Same tokens, or each side's token in the other's top-5 where they differ."""
    for token_id, ref_id, got_top, ref_top in zip(got.token_ids, want.token_ids, got.logprobs, want.logprobs):
        if token_id != ref_id:
            return ref_id in got_top and token_id in ref_top
    return True


def equality(args, config: dict, gpus: int) -> list[dict]:
    from octavo import SamplingParams

    directory = Path(tempfile.mkdtemp(prefix="octavo-dist-eq-"))
    rows = []
    try:
        model_dir = write_random_checkpoint(config, args.equality_layers, directory)
        rng = random.Random(0)
        prompts = [
            {"prompt_token_ids": [rng.randrange(10, config["vocab_size"]) for _ in range(rng.randrange(8, 200))]}
            for _ in range(args.equality_prompts)
        ]
        params = SamplingParams(temperature=0.0, max_tokens=args.equality_tokens, ignore_eos=True, logprobs=5)
        reference = None
        for tp, pp in [layout for layout in LAYOUTS if layout[0] * layout[1] <= gpus]:
            llm = make_llm(model_dir, tp, pp, dtype="float32", max_model_len=512, gpu_memory_utilization=0.5)
            outputs = [o.outputs[0] for o in llm.generate(prompts, params)]
            release(llm)
            if reference is None:
                reference = outputs
            identical = sum(o.token_ids == r.token_ids for o, r in zip(outputs, reference))
            near = all(near_tie_equal(o, r) for o, r in zip(outputs, reference))
            rows.append({"tp": tp, "pp": pp, "identical": identical, "of": len(prompts), "near_tie_ok": near})
            logging.info("equality tp=%d pp=%d: %d/%d identical, near-tie rule %s", tp, pp, identical, len(prompts), near)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return rows


def bench_layout(model_dir: Path, args, tp: int, pp: int, dp: int, batches: list[int], config: dict) -> list[dict]:
    from octavo import SamplingParams

    llm = make_llm(
        model_dir, tp, pp, load_format="dummy", dtype="bfloat16", data_parallel_size=dp,
        max_model_len=args.prompt_len + args.new_tokens + 16, max_num_seqs=max(batches),
        gpu_memory_utilization=args.gpu_memory_utilization,
    )
    rng = random.Random(1)
    params = SamplingParams(temperature=0.0, max_tokens=args.new_tokens, ignore_eos=True)
    llm.generate([{"prompt_token_ids": [11] * 8}] * 2, SamplingParams(max_tokens=8, ignore_eos=True))
    rows = []
    for batch in batches:
        prompts = [
            {"prompt_token_ids": [rng.randrange(10, config["vocab_size"]) for _ in range(args.prompt_len)]}
            for _ in range(batch)
        ]
        started = time.perf_counter()
        llm.generate(prompts, params)
        total_s = time.perf_counter() - started
        decode = [{"prompt_token_ids": p["prompt_token_ids"][:1]} for p in prompts]
        started = time.perf_counter()
        llm.generate(decode, params)
        step_ms = 1000 * (time.perf_counter() - started) / args.new_tokens
        rows.append({"tp": tp, "pp": pp, "dp": dp, "batch": batch,
                     "tokens_per_s": batch * args.new_tokens / total_s, "decode_step_ms": step_ms})
        logging.info("bench %s", rows[-1])
    if dp == 1:
        release(llm)
    else:
        llm.engine.shutdown()
    return rows


def weight_bytes(config: dict, bytes_per_param: int) -> int:
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    per_layer = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden + 3 * hidden * inter
    embeddings = config["vocab_size"] * hidden * (1 if config.get("tie_word_embeddings") else 2)
    return (config["num_hidden_layers"] * per_layer + embeddings) * bytes_per_param


def main() -> int:
    args = parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=logging.INFO,
        handlers=[logging.FileHandler(out / "dist_multi_gpu.log"), logging.StreamHandler(sys.stderr)],
    )
    gpus = num_gpus()
    if gpus < 2:
        print(f"this script needs at least 2 GPUs (found {gpus})")
        return 2
    config = json.loads(Path(args.config).read_text())
    summary = {"gpus": gpus, "args": vars(args)}
    ok = True
    if not args.skip_equality:
        summary["equality"] = rows = equality(args, config, gpus)
        ok = all(r["near_tie_ok"] for r in rows)
        print(f"\n{'tp':>3}{'pp':>4}{'identical':>12}{'near-tie ok':>13}")
        for r in rows:
            print(f"{r['tp']:>3}{r['pp']:>4}{r['identical']:>8}/{r['of']:<3}{str(r['near_tie_ok']):>13}")
    if not args.skip_bench:
        batches = [int(b) for b in args.batches.split(",")]
        directory = Path(tempfile.mkdtemp(prefix="octavo-dist-bench-"))
        shutil.copy(args.config, directory / "config.json")
        rows = []
        try:
            for tp, pp in [layout for layout in LAYOUTS if layout[0] * layout[1] <= gpus]:
                rows += bench_layout(directory, args, tp, pp, 1, batches, config)
            rows += bench_layout(directory, args, 1, 1, 2, batches[-1:], config)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        total = weight_bytes(config, 2)
        print(f"\n{'tp':>3}{'pp':>4}{'dp':>4}{'batch':>7}{'tok/s':>11}{'step ms':>10}{'floor ms':>10}")
        for r in rows:
            # A token crosses every stage in turn: only TP splits the bytes a step reads.
            floor_ms = 1000 * total / r["tp"] / COPY_BANDWIDTH_BYTES_S
            r["floor_ms"] = floor_ms
            print(f"{r['tp']:>3}{r['pp']:>4}{r['dp']:>4}{r['batch']:>7}{r['tokens_per_s']:>11.1f}"
                  f"{r['decode_step_ms']:>10.2f}{floor_ms:>10.2f}")
        summary["bench"] = rows
    (out / "dist_multi_gpu.json").write_text(json.dumps(summary, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
