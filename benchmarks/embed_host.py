#!/usr/bin/env python
"""Host (Python) cost of ``LLM.embed`` per batch of short sentences, on the CPU (issue 21).

On the GPU, all-MiniLM-L6-v2 at batch 256 is bound by the host's work per
batch, not by the ~1 ms of kernels. This measures that host work where it
can be measured without a GPU: a random BERT with the MiniLM pipeline (mean
pooling, normalised) and tiny layers (hidden 32, one layer, by default), so
the model's own compute is small; one torch thread, so the numbers do not
depend on the other processes' use of the cores. Run from the repository root:

    python benchmarks/embed_host.py                  # 256 sentences, 3 rounds of 30 batches
    python benchmarks/embed_host.py --rounds 5
    python benchmarks/embed_host.py --corpus         # all batches' sentences in one embed call

Printed: the lowest, median, mean and highest milliseconds per
256-sentence batch (end to end: tokenizing, queueing, the step, the output
objects; the mean includes the garbage collector's full collections, which
the lowest misses), the lowest less the model's forward (the host's own
work), the lowest CPU time of the main thread (all the work runs there;
steadier than wall time on a busy machine), and each phase's lowest over the batches: ``tokenize`` (one batched
tokenizer call), ``queue`` (validating and queueing the requests),
``schedule``, ``runner`` (input building, the forward, pooling,
normalising), of which ``forward`` (the model alone), and ``outputs``
(scheduler update and the output objects). An idle engine steps an
encoder's call itself (``core/pooling_lane.py``; ``OCTAVO_POOLING_LANE=0``
for the scheduler's path): ``queue`` is then its checks, ``schedule`` is
not run, and ``outputs`` includes collecting an overlapped step. The machine is shared, so take
the lowest of the rounds.

With ``--corpus`` each timed call embeds ``--num-batches`` batches'
sentences at once (``LLM.embed(all)``, as a user embeds a corpus; the
engine steps ``--batch-size`` at a time and tokenizes a chunk at a time,
``entrypoints/pooling_stream.py``: in its own thread for BERT's tokenizer,
which encodes in Python, on a background thread with ``--tokenize-thread``),
``--corpus-calls`` calls a round; the figures are each call's milliseconds
over its number of batches, and each phase's total over them (on a thread,
``tokenize`` runs beside the rest, so the phases add up to more than the
total).
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from embed_gpu import CONFIGS, WORDS, build_checkpoint, make_sentences  # noqa: E402

TINY_LAYERS = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)


def _timed(owner, name: str, label: str, spent: dict[str, float]) -> None:
    """Wrap ``owner.name`` so that each call adds its seconds to ``spent[label]``."""
    inner = getattr(owner, name)

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - started

    setattr(owner, name, wrapper)


def instrument(llm, spent: dict[str, float]) -> None:
    import octavo.entrypoints.llm as llm_module

    engine = llm.engine
    # The tokenizer's call (its older name too, so that the script can time an older tree).
    _timed(llm_module, "encode_text_columns" if hasattr(llm_module, "encode_text_columns") else "encode_texts", "tokenize", spent)
    _timed(engine.scheduler, "schedule", "schedule", spent)
    _timed(engine.executor, "execute_model", "runner", spent)
    # The step's outputs: the scheduler's update and the output objects (a
    # pooling step goes from the scheduler to the outputs in one pass).
    _timed(engine, "_process", "outputs", spent)
    runner = engine.executor.worker.runner if hasattr(engine.executor, "worker") else None
    if runner is not None:
        _timed(runner.model, "forward", "forward", spent)
        if getattr(runner.pooling, "graphs", None) is not None:  # a GPU's encoder graphs: upload + replay
            _timed(runner.pooling.graphs, "run", "graph", spent)
    _timed(llm, "_queue_pooling", "queue", spent)
    try:  # an idle engine's pooling lane (core/pooling_lane.py): its checks, its outputs (and collecting an overlapped step)
        from octavo.core.pooling_lane import PoolingLane
    except ImportError:
        return
    if not getattr(PoolingLane, "_timed_by_embed_host", False):
        _timed(PoolingLane, "_check", "queue", spent)
        _timed(PoolingLane, "_finish", "outputs", spent)
        PoolingLane._timed_by_embed_host = True


def measure(
    llm, sentences: list[str], num_batches: int, spent: dict[str, float]
) -> tuple[list[float], dict[str, list[float]]]:
    for _ in range(3):
        llm.embed(sentences)
    totals, cpu, phases = [], [], collections.defaultdict(list)
    for _ in range(num_batches):
        spent.clear()
        started, cpu_started = time.perf_counter(), time.thread_time()
        llm.embed(sentences)
        totals.append(time.perf_counter() - started)
        cpu.append(time.thread_time() - cpu_started)
        for label, seconds in spent.items():
            phases[label].append(seconds)
    phases["cpu"] = cpu
    return totals, phases


def measure_corpus(
    llm, sentences: list[str], num_batches: int, calls: int, spent: dict[str, float]
) -> tuple[list[float], dict[str, list[float]]]:
    """As ``measure``, each call embedding all ``num_batches`` batches at once: per batch, the call's share."""
    llm.embed(sentences)
    totals, phases = [], collections.defaultdict(list)
    for _ in range(calls):
        spent.clear()
        started, cpu_started = time.perf_counter(), time.thread_time()
        llm.embed(sentences)
        totals.append((time.perf_counter() - started) / num_batches)
        phases["cpu"].append((time.thread_time() - cpu_started) / num_batches)
        for label, seconds in spent.items():
            phases[label].append(seconds / num_batches)
    return totals, phases


def forward_synced(llm, sentences: list[str], spent: dict[str, float]) -> float | None:
    """The model's forward with the GPU synchronized after it, lowest over a pass
    of batches: against ``forward`` (launches only) it says whether the step
    waits on the kernels or on the host's launching of them."""
    model = llm.engine.executor.worker.runner.model
    timed = model.forward
    original = timed.__wrapped__  # under instrument()'s timer

    def synced(*args, **kwargs):
        out = original(*args, **kwargs)
        torch.cuda.synchronize()
        return out

    model.forward = synced
    _timed(model, "forward", "forward", spent)
    _, phases = measure(llm, sentences, 10, spent)
    model.forward = timed
    return min(phases["forward"]) * 1e3 if phases.get("forward") else None


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--num-batches", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--corpus", action="store_true", help="one embed call of all the batches' sentences")
    parser.add_argument("--tokenize-thread", action="store_true",
                        help="with --corpus: tokenize on the background thread even where the tokenizer encodes in Python")
    parser.add_argument("--no-stream", action="store_true",
                        help="with --corpus: tokenize and queue all at once (as before)")
    parser.add_argument("--corpus-calls", type=int, default=5, help="with --corpus: timed calls a round")
    parser.add_argument("--minilm-layers", action="store_true", help="MiniLM's real shapes (the forward then dominates)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: bfloat16 on the GPU (with --minilm-layers, the benchmark's model); "
                             "adds 'forward_gpu', the forward with the device synced after it, from a second pass")
    args = parser.parse_args(argv)
    # One thread for torch and for the tokenizer: the work's own cost, not how many cores were free.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)


def _run(args) -> float:
    shape = dict(CONFIGS["minilm"], **({} if args.minilm_layers else TINY_LAYERS))
    import octavo.entrypoints.llm as llm_module
    from octavo import LLM

    if args.tokenize_thread:
        llm_module.encodes_in_python = lambda tokenizer: False
    if args.no_stream:
        llm_module.stream_chunk = lambda engine, num_texts: None

    with tempfile.TemporaryDirectory() as workdir:
        path = build_checkpoint(Path(workdir) / "minilm", shape, vocab_size=len(WORDS) + 5)
        on_gpu = args.device == "cuda"
        llm = LLM(str(path), dtype="bfloat16" if on_gpu else "float32", platform=None if on_gpu else "cpu",
                  max_num_seqs=args.batch_size, max_num_batched_tokens=args.batch_size * 64)
        sentences = make_sentences(args.batch_size * (args.num_batches if args.corpus else 1))
        spent: dict[str, float] = collections.defaultdict(float)
        instrument(llm, spent)
        best, best_mean, best_host, best_cpu = (float("inf"),) * 4
        for round_index in range(args.rounds):
            if args.corpus:
                totals, phases = measure_corpus(llm, sentences, args.num_batches, args.corpus_calls, spent)
            else:
                totals, phases = measure(llm, sentences, args.num_batches, spent)
            ms = sorted(t * 1e3 for t in totals)
            mean = sum(ms) / len(ms)
            best, best_mean = min(best, ms[0]), min(best_mean, mean)
            # The host's own work: each batch less its model forward (what the GPU would run).
            host = [(t - f) * 1e3 for t, f in zip(totals, phases.get("forward", [0.0] * len(totals)))]
            best_host = min(best_host, min(host))
            best_cpu = min(best_cpu, min(phases.pop("cpu")) * 1e3)
            parts = "  ".join(f"{label} {min(values) * 1e3:.2f}" for label, values in phases.items())
            print(f"round {round_index}: ms per {args.batch_size}-sentence batch: min {ms[0]:.2f} "
                  f"median {ms[len(ms) // 2]:.2f} mean {mean:.2f} max {ms[-1]:.2f} | phase mins (ms): {parts}",
                  flush=True)
        if args.device == "cuda":
            synced = forward_synced(llm, sentences, spent)
            print("forward with the GPU synced after it (launches + kernels): "
                  + (f"min {synced:.2f} ms" if synced is not None else "never run eagerly (graphs replayed)"))
        llm.engine.shutdown()
    print(f"ms per {args.batch_size}-sentence batch (best of {args.rounds} rounds): min {best:.2f}, "
          f"mean {best_mean:.2f}; less the model forward: min {best_host:.2f}; "
          f"main thread's CPU time: min {best_cpu:.2f}")
    return best


if __name__ == "__main__":
    main()
