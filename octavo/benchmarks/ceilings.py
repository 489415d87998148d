"""What the hardware allows, measured at the start of each benchmark run.

Bandwidth is a device-to-device copy (bytes read plus bytes written over
time, the way the copy bandwidth of a GPU is usually quoted). Compute is a
large matrix product per *matmul kind*: the model's dtype (``bfloat16``,
``float16``, ``float32``), and ``fp8`` / ``int8`` when the run's linear
layers multiply in those (W8A8 through ``torch._scaled_mm`` /
``torch._int_mm``), since each has its own rate.

On the CPU the bandwidth is the fastest of three streams over 256 MiB
(eight times a 32 MiB last-level cache, so they run from DRAM as a decode
step's weights do): the copy, a read-only sum, and a matrix-vector
product, since a copy's writes cost reads too (write-allocate) and
understate what a read-only GEMV can reach. A 16 MiB copy, used before,
ran in the cache at ~3x DRAM's rate (28.5 GB/s against 9.4-10.5 on the
2-core dev machine) and put the floor of a 135M float32 model at
7.4 ms/token, below what any implementation reaches there (HF: ~44). The
products are 512 cubed, three each (int8 runs at ~1 GFLOP/s there). Each
takes the best of its repeats: the CPU is shared with other processes,
and the ceiling is what the hardware does when they let it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

FP8, INT8 = "fp8", "int8"


@dataclass
class DeviceCeilings:
    # Memory bandwidth: a device copy on GPUs; on the CPU the fastest of a
    # copy, a read-only sum and a GEMV (see the module's docstring).
    copy_bytes_per_s: float
    # Matmul kind (a float dtype's name, "fp8", "int8") -> FLOP/s.
    matmul_flops_per_s: dict[str, float] = field(default_factory=dict)

    def matmul_rate(self, kind: str) -> float:
        return self.matmul_flops_per_s[kind]

    def describe(self) -> str:
        rates = ", ".join(f"{kind} matmul {si(rate)}FLOP/s" for kind, rate in self.matmul_flops_per_s.items())
        return f"memory {si(self.copy_bytes_per_s)}B/s, {rates}"


def si(value: float) -> str:
    """``value`` with an SI prefix and a trailing space: 4.24 T, 780 G, 3.1 M."""
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}"
    return f"{value:.3g} "


def _timed(fn, device: torch.device, iters: int, best_of: bool = False) -> float:
    """Mean seconds of ``iters`` back-to-back calls; with ``best_of``, the fastest call."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    if best_of:
        times = []
        for _ in range(iters):
            started = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - started)
        return min(times)
    started = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - started) / iters


def _copy_seconds(num_bytes: int, device: torch.device, best_of: bool = False) -> float:
    src = torch.ones(num_bytes, dtype=torch.uint8, device=device)  # written: pages resident before timing
    dst = torch.empty_like(src)
    return _timed(lambda: dst.copy_(src), device, iters=20 if not best_of else 8, best_of=best_of)


def _cpu_read_bandwidth(num_bytes: int) -> float:
    """Bytes a second read by the faster of a sum and a GEMV over ``num_bytes`` of float32."""
    values = torch.ones(num_bytes // 4, dtype=torch.float32)
    matrix, vector = values.view(-1, 4096), torch.ones(4096)
    cpu = torch.device("cpu")
    seconds = min(_timed(values.sum, cpu, iters=8, best_of=True),
                  _timed(lambda: torch.mv(matrix, vector), cpu, iters=8, best_of=True))
    return num_bytes / seconds


def _matmul_fn(kind: str, size: int, device: torch.device):
    """A ``size``-cubed product of this kind (the one the run's layers use)."""
    if kind == FP8:
        a = torch.randn(size, size, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(size, size, device=device).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    if kind == INT8:
        a = torch.randint(-100, 100, (size, size), dtype=torch.int8, device=device)
        b = torch.randint(-100, 100, (size, size), dtype=torch.int8, device=device)
        return lambda: torch._int_mm(a, b)
    dtype = getattr(torch, kind)
    a = torch.randn(size, size, dtype=dtype, device=device)
    b = torch.randn(size, size, dtype=dtype, device=device)
    return lambda: a @ b


CPU_COPY_BYTES, CPU_MATMUL_SIZE = 1 << 28, 512


def measure_ceilings(device: torch.device, matmul_kinds: list[str], copy_bytes: int = 1 << 31, matmul_size: int = 8192) -> DeviceCeilings:
    """Copy bandwidth and the matmul rate of each kind in ``matmul_kinds``."""
    on_cpu = device.type == "cpu"
    if on_cpu:
        copy_bytes, matmul_size = CPU_COPY_BYTES, CPU_MATMUL_SIZE
    bandwidth = 2 * copy_bytes / _copy_seconds(copy_bytes, device, best_of=on_cpu)
    if on_cpu:
        bandwidth = max(bandwidth, _cpu_read_bandwidth(copy_bytes))
    ceilings = DeviceCeilings(bandwidth)
    for kind in dict.fromkeys(matmul_kinds):
        seconds = _timed(_matmul_fn(kind, matmul_size, device), device, iters=3 if on_cpu else 10, best_of=on_cpu)
        ceilings.matmul_flops_per_s[kind] = 2 * matmul_size**3 / seconds
    return ceilings
