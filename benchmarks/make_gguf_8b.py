#!/usr/bin/env python
"""Write a GGUF file at Llama-3.1-8B's shapes, random weights, for the GPU
round's GGUF timings (``bash benchmarks/gpu_round.sh gguf``):

    python benchmarks/make_gguf_8b.py /tmp/octavo-gguf/llama-8b-q4k.gguf [--type Q4_K] [--head-type Q6_K]

Linear weights (and the embedding) are ``--type`` (Q4_K by default), the LM
head ``--head-type`` (Q6_K, as llama.cpp's Q4_K_M), norms F32. The bytes are
random with small float16 scales (``random_gguf_rows``): quantizing 8B real
values would take minutes and the kernels' speed does not depend on the
values. Written with the ``gguf`` package (carried as a wheel on the GPU
machine), about 4.9 GB for Q4_K, in a minute; the file stays on the GPU
machine (never under ``$OUT``). No tokenizer: ``octavo bench`` runs on token
ids (``skip_tokenizer_init``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from octavo.kernels.quant.gguf_dequant import random_gguf_rows  # noqa: E402

CONFIG = Path(__file__).resolve().parent / "configs" / "llama-3.1-8b" / "config.json"


def layer_tensors(config: dict) -> list[tuple[str, int, int]]:
    """(GGUF name, rows, row length) of every matrix, in file order."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = hidden // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim
    tensors = [("token_embd.weight", config["vocab_size"], hidden)]
    for i in range(config["num_hidden_layers"]):
        tensors += [
            (f"blk.{i}.attn_q.weight", hidden, hidden), (f"blk.{i}.attn_k.weight", kv, hidden),
            (f"blk.{i}.attn_v.weight", kv, hidden), (f"blk.{i}.attn_output.weight", hidden, hidden),
            (f"blk.{i}.ffn_gate.weight", inter, hidden), (f"blk.{i}.ffn_up.weight", inter, hidden),
            (f"blk.{i}.ffn_down.weight", hidden, inter),
        ]
    return tensors + [("output.weight", config["vocab_size"], hidden)]


def add_metadata(writer, config: dict) -> None:
    writer.add_name("octavo-bench-llama-3.1-8b-random")
    writer.add_context_length(8192)
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(float(config.get("rope_theta", 500000.0)))
    writer.add_rope_dimension_count(config["hidden_size"] // config["num_attention_heads"])
    writer.add_vocab_size(config["vocab_size"])


def write(out: Path, type_name: str, head_type: str, config: dict | None = None) -> Path:
    """The file for ``config`` (an HF config dict; Llama-3.1-8B's by default)."""
    import gguf
    import numpy as np

    config = config or json.loads(CONFIG.read_text())
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out), "llama")
    add_metadata(writer, config)
    generator = torch.Generator().manual_seed(0)
    for name, rows, cols in layer_tensors(config):
        kind = head_type if name == "output.weight" else type_name
        data = random_gguf_rows(kind, rows, cols, generator).numpy()
        writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[kind])
    hidden = config["hidden_size"]
    for i in range(config["num_hidden_layers"]):
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{i}.{norm}.weight", np.ones(hidden, dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--type", default="Q4_K")
    parser.add_argument("--head-type", default="Q6_K")
    args = parser.parse_args()
    started = time.perf_counter()
    path = write(args.out, args.type, args.head_type)
    print(f"wrote {path} ({path.stat().st_size / 2**30:.2f} GiB, {args.type}, head {args.head_type}) "
          f"in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
