"""What LoRA costs: the base model, LoRA on with no adapter used, and every
request with one of ``--num-adapters`` adapters (round robin), in one run.

Random weights at a real model's shapes (``--model`` a config directory,
``load_format="dummy"``) and random PEFT adapters (rank ``--rank`` on all
seven projections) written to a temporary directory. Per batch size, greedy
decode of ``--output-len`` tokens after ``--input-len`` prompt tokens
(``ignore_eos``), best of ``--repeats``: output tokens/s, and at batch 1 the
time per token beside the floor (the weights' bytes over the measured copy
bandwidth).

    python benchmarks/lora_gpu.py --model benchmarks/configs/llama-3.1-8b
    python benchmarks/lora_gpu.py --tiny     # the CPU smoke run
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

PROJECTIONS = {  # PEFT module -> (input size, output size) from the config
    "self_attn.q_proj": lambda c: (c["hidden_size"], c["num_attention_heads"] * _head_dim(c)),
    "self_attn.k_proj": lambda c: (c["hidden_size"], c["num_key_value_heads"] * _head_dim(c)),
    "self_attn.v_proj": lambda c: (c["hidden_size"], c["num_key_value_heads"] * _head_dim(c)),
    "self_attn.o_proj": lambda c: (c["num_attention_heads"] * _head_dim(c), c["hidden_size"]),
    "mlp.gate_proj": lambda c: (c["hidden_size"], c["intermediate_size"]),
    "mlp.up_proj": lambda c: (c["hidden_size"], c["intermediate_size"]),
    "mlp.down_proj": lambda c: (c["intermediate_size"], c["hidden_size"]),
}


def _head_dim(config: dict) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def write_adapter(config: dict, rank: int, out_dir: Path, seed: int, scale: float = 0.01) -> Path:
    """A random PEFT adapter on all seven projections of every layer (tests/gpu uses it too)."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module, sizes in PROJECTIONS.items():
            in_size, out_size = sizes(config)
            prefix = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, in_size, generator=generator) * scale
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_size, rank, generator=generator) * scale
    out_dir.mkdir(parents=True)
    save_file(tensors, str(out_dir / "adapter_model.safetensors"))
    targets = sorted({m.split(".")[-1] for m in PROJECTIONS})
    (out_dir / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": targets, "bias": "none"}))
    return out_dir


def weight_bytes(config: dict, element_size: int) -> int:
    """The dense model's weights (projections, embeddings, LM head): a decode step reads them all."""
    per_layer = sum(i * o for i, o in (sizes(config) for sizes in PROJECTIONS.values())) + 2 * config["hidden_size"]
    embeddings = config["vocab_size"] * config["hidden_size"] * (1 if config.get("tie_word_embeddings") else 2)
    return (config["num_hidden_layers"] * per_layer + embeddings) * element_size


def tiny_config(out_dir: Path) -> Path:
    config = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                  max_position_embeddings=1024, rms_norm_eps=1e-6, torch_dtype="float32")
    out_dir.mkdir(parents=True)
    (out_dir / "config.json").write_text(json.dumps(config))
    return out_dir


def timed_generate(llm, prompts, params, loras, repeats: int) -> float:
    """Best wall time of ``repeats`` runs (a warm-up run first)."""
    llm.generate(prompts, params, lora_request=loras)
    best = float("inf")
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        llm.generate(prompts, params, lora_request=loras)
        best = min(best, time.perf_counter() - start)
    return best


def run_side(name: str, args, model: str, adapters: list, batch_sizes: list[int], options: dict) -> list[dict]:
    from octavo import LLM, LoRARequest, SamplingParams

    llm = LLM(model, load_format="dummy", dtype=args.dtype, skip_tokenizer_init=True,
              max_model_len=args.input_len + args.output_len + 16, max_num_seqs=max(batch_sizes), **options)
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True, detokenize=False)
    rows = []
    for batch in batch_sizes:
        prompts = [{"prompt_token_ids": [(7 * i + j) % 500 + 3 for j in range(args.input_len)]} for i in range(batch)]
        loras = None
        if adapters:
            loras = [LoRARequest(f"a{i % len(adapters)}", i % len(adapters) + 1, str(adapters[i % len(adapters)]))
                     for i in range(batch)]
        seconds = timed_generate(llm, prompts, params, loras, args.repeats)
        rows.append(dict(side=name, batch=batch, seconds=seconds, tokens_per_s=batch * args.output_len / seconds))
        print(f"{name:>16} batch {batch:>4}: {rows[-1]['tokens_per_s']:>10.1f} output tok/s ({seconds:.3f} s)", flush=True)
    release(llm)
    return rows


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="benchmarks/configs/llama-3.1-8b")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--num-adapters", type=int, default=4)
    parser.add_argument("--batch-sizes", default="1,32,128")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="a tiny model on the CPU (smoke run)")
    args = parser.parse_args(argv)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    with tempfile.TemporaryDirectory() as workdir:
        work = Path(workdir)
        model = str(tiny_config(work / "model")) if args.tiny else args.model
        if args.tiny:
            args.dtype = "float32"
        config = json.loads((Path(model) / "config.json").read_text())
        adapters = [write_adapter(config, args.rank, work / f"adapter{i}", seed=i) for i in range(args.num_adapters)]
        lora = dict(enable_lora=True, max_loras=args.num_adapters, max_lora_rank=args.rank)
        rows = run_side("base", args, model, [], batch_sizes, {})
        rows += run_side("lora on, unused", args, model, [], batch_sizes, lora)
        rows += run_side(f"{args.num_adapters} adapters", args, model, adapters, batch_sizes, lora)
    print_table(rows, config, args)
    return rows


def decode_floor_ms(config: dict, dtype: str) -> tuple[float, float]:
    """(the least a batch-1 decode step takes in ms: the weights over the
    measured copy bandwidth, that bandwidth in bytes/s); spec_decode_gpu.py uses it too."""
    from octavo.benchmarks.ceilings import measure_ceilings

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    bandwidth = measure_ceilings(device, [dtype]).copy_bytes_per_s
    element_size = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    return weight_bytes(config, element_size) / bandwidth * 1e3, bandwidth


def release(llm) -> None:
    """Shut an engine down and give its device memory back before the next side."""
    llm.engine.shutdown()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def print_table(rows: list[dict], config: dict, args) -> None:
    floor_ms, bandwidth = decode_floor_ms(config, args.dtype)
    print(f"\nfloor at batch 1: {floor_ms:.2f} ms a token (weights over {bandwidth / 1e9:.0f} GB/s copy bandwidth)")
    base = {r["batch"]: r["tokens_per_s"] for r in rows if r["side"] == "base"}
    print("| side | batch | output tok/s | ms a step | vs base |\n|---|---|---|---|---|")
    for row in rows:
        step_ms = row["seconds"] / args.output_len * 1e3
        ratio = row["tokens_per_s"] / base[row["batch"]]
        print(f"| {row['side']} | {row['batch']} | {row['tokens_per_s']:.1f} | {step_ms:.2f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
