"""``benchmarks/profile_step.py --kernel-sequence``: a profiled step's device
kernels printed in the order they ran, with the gap before each (the
profiler's events stand in: the real ones need a GPU)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "profile_step.py"


def _event(name: str, start: float, end: float, on_device: bool = True):
    device = torch.autograd.DeviceType.CUDA if on_device else torch.autograd.DeviceType.CPU
    span = SimpleNamespace(start=start, end=end, elapsed_us=lambda: end - start)
    return SimpleNamespace(name=name, time_range=span, device_type=device)


def test_kernels_print_in_launch_order_with_their_gaps(capsys):
    spec = importlib.util.spec_from_file_location("profile_step", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    events = [_event("gemv", 10, 12), _event("rms_norm", 0, 5), _event("host op", 0, 100, on_device=False),
              _event("split_kv", 13, 20)]
    module.print_kernel_sequence(SimpleNamespace(events=lambda: events), 3)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "--- 3 of the step's 3 device kernels in order, from #0"
    rows = [line.split() for line in lines[2:]]
    assert rows == [["5.00", "rms_norm"], ["2.00", "5.00", "gemv"], ["7.00", "1.00", "split_kv"]]
