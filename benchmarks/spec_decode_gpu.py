"""What n-gram speculative decoding buys: decoding without drafts and with
``--num-speculative-tokens`` drafts, in one run, at each batch size.

Random weights at a real model's shapes (``--model`` a config directory,
``load_format="dummy"``), greedy, ``--output-len`` tokens after prompts that
repeat a random passage (a copy-heavy prompt, where prompt lookup finds
drafts). Random weights do not copy the prompt the way a trained model
does; their greedy outputs fall into loops, which the proposer then finds.
So the acceptance printed is this workload's, not a real model's: read the
speed-up beside it, with the step time (what a step with ``1 + k`` tokens
a request costs over a one-token step) and the floor (the weights' bytes
over the measured copy bandwidth: the least a decode step can take). The
draft-model side (``--draft-model``, Llama-3.2-1B shapes by default, random
weights too) measures what running a draft model costs a step; in
``--tiny`` the target is its own draft, so every guess is accepted. The
EAGLE-3 side (``--eagle3``, a head of Llama-3.1-8B's shapes with a
32,000-token draft vocabulary, random weights) measures what a head costs
a step: its guesses are rarely accepted either.

    python benchmarks/spec_decode_gpu.py --model benchmarks/configs/llama-3.1-8b
    python benchmarks/spec_decode_gpu.py --tiny     # the CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.lora_gpu import decode_floor_ms, release, tiny_config


def copy_prompts(batch: int, input_len: int, vocab_size: int) -> list[dict]:
    """Each prompt: a random passage of a quarter of ``input_len`` tokens, repeated."""
    prompts = []
    for i in range(batch):
        generator = torch.Generator().manual_seed(i)
        passage = torch.randint(3, vocab_size, (max(1, input_len // 4),), generator=generator).tolist()
        prompts.append({"prompt_token_ids": (passage * 4)[:input_len]})
    return prompts


def run_side(name: str, args, model: str, vocab_size: int, options: dict) -> list[dict]:
    from octavo import LLM, SamplingParams

    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    llm = LLM(model, load_format="dummy", dtype=args.dtype, skip_tokenizer_init=True,
              max_model_len=args.input_len + args.output_len + 16, max_num_seqs=max(batch_sizes), **options)
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True, detokenize=False)
    engine, rows = llm.engine, []
    steps = [0]
    step = engine.step

    def counted_step():
        steps[0] += 1
        return step()

    engine.step = counted_step
    for batch in batch_sizes:
        prompts = copy_prompts(batch, args.input_len, vocab_size)
        llm.generate(prompts, params)  # warm-up
        before = engine.get_stats().spec_decoding
        best, best_steps = float("inf"), 0
        for _ in range(args.repeats):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            steps[0] = 0
            start = time.perf_counter()
            llm.generate(prompts, params)
            seconds = time.perf_counter() - start
            if seconds < best:
                best, best_steps = seconds, steps[0]
        after = engine.get_stats().spec_decoding
        acceptance = None
        if after is not None:
            drafted = after.num_draft_tokens - before.num_draft_tokens
            acceptance = (after.num_accepted_tokens - before.num_accepted_tokens) / drafted if drafted else 0.0
        rows.append(dict(side=name, batch=batch, seconds=best, steps=best_steps, acceptance=acceptance,
                         tokens_per_s=batch * args.output_len / best))
        print(f"{name:>12} batch {batch:>4}: {rows[-1]['tokens_per_s']:>10.1f} output tok/s, {best_steps} steps", flush=True)
    release(llm)
    return rows


def tiny_eagle3_config(out_dir: Path, target: dict) -> Path:
    """An EAGLE-3 head's config for the tiny target (its layers 0, 1 and the stream after the last)."""
    keys = ("model_type", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "vocab_size", "max_position_embeddings", "rms_norm_eps")
    config = {k: target[k] for k in keys}
    config.update(architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1, draft_vocab_size=256,
                  eagle_aux_hidden_state_layer_ids=[0, 1, 2])
    out_dir.mkdir(parents=True)
    (out_dir / "config.json").write_text(json.dumps(config))
    return out_dir


def print_table(rows: list[dict], config: dict, args) -> None:
    floor_ms, bandwidth = decode_floor_ms(config, args.dtype)
    print(f"\nfloor: {floor_ms:.2f} ms a step (weights over {bandwidth / 1e9:.0f} GB/s copy bandwidth)")
    base = {r["batch"]: r["tokens_per_s"] for r in rows if r["side"] == "no drafts"}
    print("| side | batch | output tok/s | vs no drafts | steps | tokens a request-step | ms a step | acceptance |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        per_step = args.output_len / row["steps"] if row["steps"] else 0.0
        step_ms = row["seconds"] / row["steps"] * 1e3 if row["steps"] else 0.0
        acceptance = "-" if row["acceptance"] is None else f"{row['acceptance']:.2f}"
        speedup = row["tokens_per_s"] / base[row["batch"]]
        print(f"| {row['side']} | {row['batch']} | {row['tokens_per_s']:.1f} | {speedup:.2f}x "
              f"| {row['steps']} | {per_step:.2f} | {step_ms:.2f} | {acceptance} |")


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="benchmarks/configs/llama-3.1-8b")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--num-speculative-tokens", default="2,4", help="comma-separated: one side each")
    parser.add_argument("--prompt-lookup-max", type=int, default=4)
    parser.add_argument("--batch-sizes", default="1,32")
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--draft-model", default="benchmarks/configs/llama-3.2-1b",
                        help="a draft model's config directory (random weights: its guesses are rarely accepted, "
                        "so its side measures what a draft model costs); empty: no draft-model side")
    parser.add_argument("--eagle3", default="benchmarks/configs/eagle3-llama-3.1-8b",
                        help="an EAGLE-3 head's config directory for the target; empty: no EAGLE-3 side")
    parser.add_argument("--tiny", action="store_true", help="a tiny model on the CPU (smoke run)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as workdir:
        model = str(tiny_config(Path(workdir) / "model")) if args.tiny else args.model
        if args.tiny:
            args.dtype = "float32"
        config = json.loads((Path(model) / "config.json").read_text())
        rows = run_side("no drafts", args, model, config["vocab_size"], {})
        for k in (int(k) for k in args.num_speculative_tokens.split(",")):
            speculative = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": args.prompt_lookup_max,
                           "prompt_lookup_min": 1}
            rows += run_side(f"ngram k={k}", args, model, config["vocab_size"], {"speculative_config": speculative})
        if args.draft_model:
            draft = model if args.tiny else args.draft_model
            k = max(int(k) for k in args.num_speculative_tokens.split(","))
            speculative = {"model": draft, "num_speculative_tokens": k}
            rows += run_side(f"draft k={speculative['num_speculative_tokens']}", args, model, config["vocab_size"],
                             {"speculative_config": speculative})
        if args.eagle3:
            head = str(tiny_eagle3_config(Path(workdir) / "eagle3", config)) if args.tiny else args.eagle3
            k = max(int(k) for k in args.num_speculative_tokens.split(","))
            speculative = {"method": "eagle3", "model": head, "num_speculative_tokens": k}
            rows += run_side(f"eagle3 k={k}", args, model, config["vocab_size"], {"speculative_config": speculative})
    print_table(rows, config, args)
    return rows


if __name__ == "__main__":
    main()
