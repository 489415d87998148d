#!/usr/bin/env python
"""The one-token GEMVs shape by shape, as a decode graph runs them:
``python benchmarks/gemv_shapes_gpu.py [--paths int4:gemv_rows,...] [--copies 16]``.

The layer figures of ``quant_sweep_gpu.py`` time one graph replay of a
layer's four projections between two events: the replay's own start and
the events are in each figure, and which projection loses the time is not
said. Here each path runs ``--copies`` launches of one projection, each on
its own copy of the weights (more bytes than the L2 holds), captured in one
CUDA graph as a decode step captures them (programmatic dependent launch as
the kernels set it): the time a launch, the bytes it reads, their bandwidth
and its share of the copy bandwidth. An empty Triton kernel timed the same
way gives what a launch costs with nothing to read; the last column is the
time a launch would take at the copy bandwidth plus that. Then the four
projections in a layer's order over ``--copies`` layers: a layer's time in
a step. ``--sweep-int4`` times each plain tile of the int4 rows GEMV
(``quant_sweep_gpu.INT4_ROWS``) shape by shape instead: whether one tile
for all four shapes leaves time on the small ones. ``probe:read_B_S_W``
paths (``read_probe.py``) read the int4 words alone at those tiles. With
``$OUT`` set, ``gemv_shapes.jsonl`` there.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import astuple
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import quant_paths as qp  # noqa: E402
from kernels_gpu import copy_bandwidth, time_us  # noqa: E402

DEFAULT_PATHS = ("bf16:cublas,bf16:gemv,fp8:gemv,int4:gemv_rows,int4:gemv_dp4a,int4:tc_mm_pairs,int4:torch_int4pack_mm,"
                 "gguf_Q4_K:gemv_pairs")
RESULTS: list[dict] = []


@triton.jit
def _empty_kernel(x_ptr):
    pass


def launch_floor_us(copies: int) -> float:
    """One launch of an empty kernel over 132 programs, in a graph of ``copies`` launches."""
    x = torch.empty(1, device=qp.DEVICE)
    return time_us(lambda: [_empty_kernel[(132,)](x) for _ in range(copies)]) / copies


def _chain_us(fns: list, x_by_fn: list) -> float:
    return time_us(lambda: [fn(x) for fn, x in zip(fns, x_by_fn)])


def weight_copies(family: str, num_in: int, num_out: int, copies: int) -> list[tuple]:
    """``copies`` separate copies of one random weight (equal values, their own memory: no L2 reuse)."""
    weights = qp.make_weights(family, num_out, num_in, torch.Generator().manual_seed(0))
    return [weights] + [tuple(t.clone() for t in weights) for _ in range(copies - 1)]


def time_shape(path: qp.Path, num_in: int, num_out: int, copies: int, config=None) -> tuple[float, int]:
    """us a launch and bytes a launch reads (weights and activation) for ``copies`` launches in one graph."""
    weights = weight_copies(path.family, num_in, num_out, copies)
    x = torch.randn(1, num_in, device=qp.DEVICE, dtype=qp.DTYPE)
    fns = [path.make(w, config) for w in weights]
    us = _chain_us(fns, [x] * copies) / copies
    return us, qp.weight_bytes(weights[0]) + x.numel() * x.element_size()


def time_layers(path: qp.Path, copies: int) -> float:
    """us a layer: the four projections in order, ``copies`` layers in one graph."""
    by_shape = [weight_copies(path.family, num_in, num_out, copies) for _, num_in, num_out in qp.SHAPES]
    fns = [path.make(by_shape[i][c], None) for c in range(copies) for i in range(len(qp.SHAPES))]
    xs = [torch.randn(1, num_in, device=qp.DEVICE, dtype=qp.DTYPE) for _ in range(copies) for _, num_in, _ in qp.SHAPES]
    return _chain_us(fns, xs) / copies


def run_path(path: qp.Path, copies: int, bandwidth: float, floor_us: float) -> None:
    layer_bytes = 0
    for shape, num_in, num_out in qp.SHAPES:
        try:
            us, nbytes = time_shape(path, num_in, num_out, copies)
        except Exception as error:  # a path this torch or card lacks: say so, time the rest
            print(f"{path.label} {shape}: FAILED <{type(error).__name__}: {str(error).splitlines()[0][:120]}>")
            return
        layer_bytes += nbytes
        ideal = nbytes / bandwidth * 1e6 + floor_us
        print(f"{path.label:28s} {shape:8s} {us:8.2f} us {nbytes / 1e6:8.2f} MB {nbytes / us / 1e6:6.2f} TB/s"
              f" {100 * nbytes / us * 1e6 / bandwidth:5.1f}% {ideal:8.2f}")
        RESULTS.append(dict(path=path.label, shape=shape, us=us, bytes=nbytes, ideal_us=ideal))
    layer_us = time_layers(path, copies)
    print(f"{path.label:28s} {'layer':8s} {layer_us:8.2f} us {layer_bytes / 1e6:8.2f} MB"
          f" {layer_bytes / layer_us / 1e6:6.2f} TB/s {100 * layer_bytes / layer_us * 1e6 / bandwidth:5.1f}%")
    RESULTS.append(dict(path=path.label, shape="layer", us=layer_us, bytes=layer_bytes))


def sweep_int4_rows(copies: int) -> None:
    """Each plain tile of the int4 rows GEMV, shape by shape: the best three of each shape."""
    from quant_sweep_gpu import INT4_ROWS

    path = qp.path_by_label("int4", "gemv_rows")
    plain = [t for t in INT4_ROWS if t.packed == 1 and t.prefetch == 0 and t.stages == 1]
    for shape, num_in, num_out in qp.SHAPES:
        timed = []
        for tiles in plain:
            us, nbytes = time_shape(path, num_in, num_out, copies, tiles)
            timed.append((us, tiles))
            RESULTS.append(dict(path=path.label, shape=shape, us=us, bytes=nbytes, tiles=list(astuple(tiles))))
        timed.sort(key=lambda pair: pair[0])
        print(f"int4 rows {shape}: " + "; ".join(
            f"{us:.2f} us {nbytes / us / 1e6:.2f} TB/s {astuple(t)[:3]}" for us, t in timed[:3]))


def main(paths: str, copies: int, sweep_int4: bool = False) -> None:
    bandwidth = copy_bandwidth()
    floor_us = launch_floor_us(copies)
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s; an empty launch in a graph {floor_us:.2f} us; "
          f"{copies} launches a graph, L2 flushed before each replay")
    if sweep_int4:
        sweep_int4_rows(copies)
    else:
        print(f"{'path':28s} {'shape':8s} {'us/launch':>11s} {'reads':>11s} {'':>9s} {'of copy':>6s} {'ideal us':>8s}")
        for label in paths.split(","):
            family, name = label.split(":")
            if family == "probe":  # read_probe.py: the int4 words read alone, at given tiles
                from read_probe import probe_path

                run_path(probe_path(name), copies, bandwidth, floor_us)
            else:
                run_path(qp.path_by_label(family, name), copies, bandwidth, floor_us)
    if os.environ.get("OUT"):
        with open(Path(os.environ["OUT"]) / "gemv_shapes.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in RESULTS)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", default=DEFAULT_PATHS, help="family:path pairs (quant_paths.py)")
    parser.add_argument("--copies", type=int, default=16, help="launches (weight copies) a graph")
    parser.add_argument("--sweep-int4", action="store_true", help="the int4 rows GEMV's tiles shape by shape")
    args = parser.parse_args()
    main(args.paths, args.copies, args.sweep_int4)
