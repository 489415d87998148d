#!/usr/bin/env python
"""Embedding throughput: Octavo beside sentence-transformers, in the same run (issue 21).

Run from the repository root on the GPU machine (nothing is downloaded):

    python benchmarks/embed_gpu.py                      # all-MiniLM-L6-v2 and BGE-large shapes
    python benchmarks/embed_gpu.py --configs minilm     # one of them
    python benchmarks/embed_gpu.py --tiny --device cpu  # the CPU smoke run (tiny shapes)

For each config a random-weight BERT checkpoint is written with transformers
(all-MiniLM-L6-v2: 6 layers, hidden 384, mean pooling; BGE-large-en-v1.5:
24 layers, hidden 1024, CLS pooling; both normalised, as their
sentence-transformers pipelines are), with a WordPiece tokenizer whose words
are whole tokens. The input is a fixed set of short sentences (6 to 20
words), ``--num-batches`` batches of ``--batch-size`` (256). Timed, end to
end (tokenization included, vectors on the host at the end), in two modes:

- ``corpus`` (the headline): every sentence in one call, each side's
  natural form for embedding a corpus: Octavo's ``LLM.embed(sentences)``
  (the engine takes ``--batch-size`` inputs a step and tokenizes the next
  ones meanwhile, ``octavo/entrypoints/pooling_stream.py``) against
  ``encode(sentences, batch_size=256)``;
- ``per-batch``: one call per batch (``LLM.embed(batch)``, ``encode(batch,
  batch_size=256)``), one pass over the batches.

Every side (Octavo, and the baseline in each dtype) is built first and warmed
up on the first ``--warmup-batches`` (4) batches (Octavo captures a CUDA
graph of an encoder step's padded shape the second time it sees it: the
warm-up sees the batches' common shapes). Then ``--repeats`` rounds, the
sides taking turns within each (a corpus call, then a pass of per-batch
calls), each round starting with the next side: a host that slows down for
a while slows every side alike. Printed per side and mode: the best round's
sentences/s and Octavo's over it, and the median over the rounds of
Octavo's rate over the side's in the same round.

Octavo runs in ``--dtype`` (bfloat16); sentence-transformers as it loads by
default (float32) and in float16. Without sentence-transformers (it needs
scipy and scikit-learn), the same pipeline written out with transformers
(AutoTokenizer, AutoModel with SDPA, pooling, normalisation, batches of
``--batch-size`` in a corpus call), labelled ``hf-automodel``.

Also printed: each baseline's lowest cosine against Octavo's vectors (a
correctness check: float32 vs bfloat16 stays above 0.99), and the floor:
the batch's FLOPs (2 x linear parameters x tokens, plus attention) over the
matmul rate of Octavo's dtype measured in the same run. With ``$OUT`` set, writes
``embed_gpu.json`` there.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CONFIGS = {
    "minilm": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536, pooling="mean"),
    "bge-large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096, pooling="cls"),
}
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
WORDS = [f"w{i}" for i in range(2000)]


@dataclass
class Row:
    config: str
    impl: str
    dtype: str
    sentences_per_s: float
    mode: str = "per-batch"  # or "corpus": all sentences in one call
    min_cosine: float | None = None
    extra: dict = field(default_factory=dict)


def build_checkpoint(out_dir: Path, shape: dict, vocab_size: int) -> Path:
    """Random BERT weights, a sentence-transformers pipeline and a WordPiece tokenizer."""
    import transformers
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {token: i for i, token in enumerate(specials + WORDS)}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 512, "cls_token": "[CLS]",
                        "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]", "mask_token": "[MASK]"}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    settings = {k: v for k, v in shape.items() if k != "pooling"}
    config = transformers.BertConfig(vocab_size=vocab_size, max_position_embeddings=512, **settings)
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(str(out_dir))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (out_dir / "modules.json").write_text(json.dumps(modules))
    (out_dir / "1_Pooling").mkdir(exist_ok=True)
    pooling = {"word_embedding_dimension": shape["hidden_size"], f"pooling_mode_{'cls_token' if shape['pooling'] == 'cls' else 'mean_tokens'}": True}
    (out_dir / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (out_dir / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512, "do_lower_case": False}))
    return out_dir


def make_sentences(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 20))) for _ in range(count)]


def throughput(encode, batches: list[list[str]], device: torch.device) -> tuple[float, np.ndarray]:
    """Sentences per second of one call per batch over ``batches``, and the vectors."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    started = time.perf_counter()
    vectors = [encode(batch) for batch in batches]
    sync()
    elapsed = time.perf_counter() - started
    return sum(len(b) for b in batches) / elapsed, np.concatenate(vectors)


def corpus_throughput(encode, sentences: list[str], device: torch.device) -> tuple[float, np.ndarray]:
    """Sentences per second of one ``encode(sentences)`` call, and its vectors."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    started = time.perf_counter()
    vectors = encode(sentences)
    sync()
    return len(sentences) / (time.perf_counter() - started), vectors


def octavo_encoder(path: Path, dtype: str, device: torch.device, batch_size: int):
    from octavo import LLM

    platform = "cpu" if device.type == "cpu" else None
    llm = LLM(str(path), dtype=dtype, platform=platform, max_num_seqs=batch_size, max_num_batched_tokens=batch_size * 64)
    return llm, lambda batch: np.stack([o.outputs.data for o in llm.embed(batch)])


def st_encoder(path: Path, dtype: torch.dtype, device: torch.device, batch_size: int):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(path), device=str(device), model_kwargs={"dtype": dtype})
    return lambda batch: model.encode(batch, batch_size=batch_size, convert_to_numpy=True).astype(np.float32)


def hf_encoder(path: Path, dtype: torch.dtype, device: torch.device, batch_size: int, pooling: str):
    """sentence-transformers' pipeline written out: tokenize, AutoModel (SDPA), pool, normalize."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModel.from_pretrained(str(path), dtype=dtype, attn_implementation="sdpa").to(device).eval()

    def encode(sentences: list[str]) -> np.ndarray:
        return np.concatenate([encode_batch(sentences[i : i + batch_size]) for i in range(0, len(sentences), batch_size)])

    @torch.inference_mode()
    def encode_batch(batch: list[str]) -> np.ndarray:
        inputs = tokenizer(batch, padding=True, truncation=True, max_length=512, return_tensors="pt").to(device)
        hidden = model(**inputs).last_hidden_state
        if pooling == "cls":
            pooled = hidden[:, 0].float()
        else:
            mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1, dtype=torch.float32) / mask.sum(1, dtype=torch.float32)
        return torch.nn.functional.normalize(pooled, dim=-1).cpu().numpy()

    return encode


def encoder_flops(shape: dict, token_counts: list[int]) -> float:
    """2 x linear parameters x tokens + attention's 4 x L^2 x hidden per layer and sequence."""
    hidden, layers, inter = shape["hidden_size"], shape["num_hidden_layers"], shape["intermediate_size"]
    linear = layers * (4 * hidden * hidden + 2 * hidden * inter)
    attention = sum(4 * n * n * hidden * layers for n in token_counts)
    return 2 * linear * sum(token_counts) + attention


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())


def baseline_dtypes(device: torch.device) -> list[tuple[str, torch.dtype]]:
    """As sentence-transformers loads by default (float32), and in float16 where that is fast."""
    if device.type == "cuda":
        return [("float32", torch.float32), ("float16", torch.float16)]
    return [("float32", torch.float32)]


def run_config(name: str, args, device: torch.device, workdir: Path, matmul_rate: float) -> list[Row]:
    shape = dict(CONFIGS[name], **(TINY if args.tiny else {}))
    path = build_checkpoint(workdir / name, shape, vocab_size=30522 if not args.tiny else len(WORDS) + 5)
    sentences = make_sentences(args.batch_size * args.num_batches)
    llm, encode = octavo_encoder(path, args.dtype, device, args.batch_size)
    sides = {("octavo", args.dtype): encode}
    use_st = args.baseline == "st" or (args.baseline == "auto" and _has_sentence_transformers())
    for dtype_name, dtype in baseline_dtypes(device):
        if use_st:
            sides["sentence-transformers", dtype_name] = st_encoder(path, dtype, device, args.batch_size)
        else:
            sides["hf-automodel", dtype_name] = hf_encoder(path, dtype, device, args.batch_size, shape["pooling"])
    measured = interleaved(sides, sentences, args, device)
    token_counts = [len(o.prompt_token_ids) for o in llm.embed(sentences[: args.batch_size])]
    llm.engine.shutdown()
    del llm, sides
    if device.type == "cuda":
        torch.cuda.empty_cache()
    floor = matmul_rate / (encoder_flops(shape, token_counts) / len(token_counts))
    rows = []
    for (impl, dtype_name), modes in measured.items():
        for mode, (rates, vectors) in modes.items():
            ours = measured["octavo", args.dtype][mode]
            extra = {"rates": rates, "median_round_ratio": float(np.median([a / b for a, b in zip(ours[0], rates)]))}
            if impl == "octavo":
                extra.update(mean_tokens=float(np.mean(token_counts)), floor_sentences_per_s=floor)
            cosine = None if impl == "octavo" else min_cosine(ours[1], vectors)
            rows.append(Row(name, impl, dtype_name, max(rates), mode, cosine, extra))
    return rows


def interleaved(sides: dict, sentences: list[str], args, device: torch.device) -> dict:
    """Each side's sentences/s in both modes, ``--repeats`` rounds with the
    sides taking turns (each round starting with the next side), so that a
    host that slows down for a while slows every side alike (round 32: a
    side's figure moved +-15% between machines and within a run).
    Returns {side: {mode: (rates per round, vectors)}}; the rows report the
    best round per side (as each side's best call) and the median over the
    rounds of Octavo's rate over the side's in the same round."""
    batches = [sentences[i : i + args.batch_size] for i in range(0, len(sentences), args.batch_size)]
    for encode in sides.values():  # warm-up: the batches' shapes (Octavo captures encoder graphs at a second sight)
        for batch in batches[: max(args.warmup_batches, 1)]:
            encode(batch)
    results = {side: {"corpus": ([], None), "per-batch": ([], None)} for side in sides}
    order = list(sides)
    for round_index in range(args.repeats):
        turn = order[round_index % len(order):] + order[: round_index % len(order)]
        for side in turn:
            for mode, run in (("corpus", corpus_throughput), ("per-batch", throughput)):
                rate, vectors = run(sides[side], sentences if mode == "corpus" else batches, device)
                results[side][mode] = (results[side][mode][0] + [rate], vectors)
    return results


def _has_sentence_transformers() -> bool:
    try:
        import sentence_transformers  # noqa: F401
    except ImportError:
        return False
    return True


def format_table(rows: list[Row]) -> str:
    lines = [
        "| config | mode | impl | dtype | sentences/s (best round) | octavo / it | median over rounds | min cosine vs octavo |",
        "|---|---|---|---|---|---|---|---|",
    ]
    octavo = {(r.config, r.mode): r.sentences_per_s for r in rows if r.impl == "octavo"}
    for row in sorted(rows, key=lambda r: r.mode != "corpus"):  # the headline first; sorted() keeps the rest in order
        ratio = octavo[row.config, row.mode] / row.sentences_per_s
        cosine = f"{row.min_cosine:.5f}" if row.min_cosine is not None else ""
        median = row.extra.get("median_round_ratio")
        lines.append(
            f"| {row.config} | {row.mode} | {row.impl} | {row.dtype} | {row.sentences_per_s:,.0f} | {ratio:.2f}x | "
            f"{f'{median:.2f}x' if median is not None else ''} | {cosine} |"
        )
    for row in rows:
        if row.impl == "octavo" and row.mode == "corpus":
            lines.append(
                f"{row.config}: {row.extra['mean_tokens']:.1f} tokens per sentence; FLOP floor "
                f"{row.extra['floor_sentences_per_s']:,.0f} sentences/s"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="minilm,bge-large")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--num-batches", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="rounds, the sides taking turns in each (both modes)")
    parser.add_argument("--warmup-batches", type=int, default=4, help="per-batch mode: batches run once before timing")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--baseline", choices=["auto", "st", "hf"], default="auto")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (the CPU smoke run)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    from octavo.benchmarks.ceilings import measure_ceilings

    matmul_rate = measure_ceilings(device, [args.dtype]).matmul_rate(args.dtype)
    print(f"device {device}, {args.dtype} matmul {matmul_rate / 1e12:.1f} TFLOP/s", flush=True)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as workdir:
        for name in args.configs.split(","):
            rows.extend(run_config(name, args, device, Path(workdir), matmul_rate))
            print(format_table([r for r in rows if r.config == name]), flush=True)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "embed_gpu.json").write_text(json.dumps([asdict(r) for r in rows], indent=2))
    return rows


if __name__ == "__main__":
    main()
