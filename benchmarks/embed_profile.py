#!/usr/bin/env python
"""Where the host's time goes in one ``LLM.embed`` call (issue 21): cProfile
over a corpus call (``--batches`` batches of ``--batch-size`` short
sentences in one call) or one call per batch, MiniLM's shapes, on the CPU or
a GPU; prints the functions by their own time and the garbage collector's
share. Run from the repository root:

    python benchmarks/embed_profile.py --device cuda            # corpus
    python benchmarks/embed_profile.py --device cuda --per-batch
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from embed_gpu import CONFIGS, WORDS, build_checkpoint, make_sentences  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--batches", type=int, default=32)
    parser.add_argument("--per-batch", action="store_true", help="one call per batch instead of one corpus call")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    from octavo import LLM

    on_gpu = args.device == "cuda"
    with tempfile.TemporaryDirectory() as workdir:
        path = build_checkpoint(Path(workdir) / "minilm", dict(CONFIGS["minilm"]), vocab_size=len(WORDS) + 5)
        llm = LLM(str(path), dtype="bfloat16" if on_gpu else "float32", platform=None if on_gpu else "cpu",
                  max_num_seqs=args.batch_size, max_num_batched_tokens=args.batch_size * 64)
        sentences = make_sentences(args.batch_size * args.batches)
        batches = [sentences[i : i + args.batch_size] for i in range(0, len(sentences), args.batch_size)]

        def run() -> None:
            if args.per_batch:
                for batch in batches:
                    llm.embed(batch)
            else:
                llm.embed(sentences)

        for _ in range(3):
            run()
        collections: list[float] = []
        started_at: list[float] = []

        def on_gc(phase: str, info: dict) -> None:
            if phase == "start":
                started_at.append(time.perf_counter())
            elif started_at:
                collections.append(time.perf_counter() - started_at.pop())

        started = time.perf_counter()
        run()
        plain = time.perf_counter() - started
        gc.callbacks.append(on_gc)
        run()
        gc.callbacks.remove(on_gc)
        profiler = cProfile.Profile()
        profiler.enable()
        run()
        profiler.disable()
        per_batch = plain / args.batches * 1e3
        print(f"{'per-batch calls' if args.per_batch else 'one corpus call'}: {per_batch:.2f} ms a batch unprofiled, "
              f"{len(sentences) / plain:,.0f} sentences/s; garbage collector {sum(collections) / args.batches * 1e3:.3f} ms "
              f"a batch ({len(collections)} collections)")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
