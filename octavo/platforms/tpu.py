"""Google TPUs through torch_xla (extra ``[tpu]``).

Detection, without importing torch_xla: the package is installed
(``importlib.util.find_spec``), ``PJRT_DEVICE`` is unset or ``TPU``, and
either a TPU environment variable (``TPU_ACCELERATOR_TYPE``, ``TPU_NAME``,
``TPU_WORKER_ID``, or ``PJRT_DEVICE=TPU``) or a TPU device file
(``/dev/accel<N>``, ``/dev/vfio/<N>``) is present. torch_xla is imported only
when the platform is first used.

torch_xla's CPU PJRT device runs the same tracing, compilation and graph
caching on the host. It is never chosen on its own: with
``OCTAVO_TPU_ALLOW_CPU_PJRT=1`` and no TPU found (or ``PJRT_DEVICE=CPU``),
the platform is available and runs there (``PJRT_DEVICE=CPU`` is set before
torch_xla is imported). That is how it is tested (``.ci/xla-suite``).

XLA compiles one program per distinct set of shapes and stalls whenever the
host reads a device value, so the platform uses the runner hooks of plugin
API 1.1: steps run under ``no_grad`` (XLA cannot trace inference tensors),
each step ends with ``torch_xla.sync()`` (the traced graph is cut and
launched before the sampled tokens are read), every step is padded to a
static ``StepShape`` (``step_buckets``) and all of them are compiled at
warm-up, inputs are fresh device tensors each step, and compilations are
read from torch_xla's ``CompileTime`` metric. Attention is ``static_paged``:
no host reads, no data-dependent shapes, the KV cache updated in place with
``index_copy_``.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import torch

from octavo.platforms import probe
from octavo.platforms.interface import MemoryInfo, Platform
from octavo.platforms.profiling import profile_kv_cache_budget
from octavo.platforms.step_shapes import StepBuckets, power_of_two_sizes

DEVICE_PATTERNS = ("accel[0-9]*", "vfio/[0-9]*")
ENV_HINTS = ("TPU_ACCELERATOR_TYPE", "TPU_NAME", "TPU_WORKER_ID")
CPU_PJRT_OPT_IN = "OCTAVO_TPU_ALLOW_CPU_PJRT"
# Smallest buckets: below these, padding costs less than another program.
MIN_REQUEST_BUCKET = 8
MIN_TOKEN_BUCKET = 16
MIN_CONTEXT_BUCKET_TOKENS = 512


def _cpu_pjrt_allowed() -> bool:
    return os.environ.get(CPU_PJRT_OPT_IN, "").lower() in ("1", "true", "yes")


def tpu_step_buckets(config: Any) -> StepBuckets:
    """Requests from 8, tokens from 16, block-table widths from 512 tokens of
    context, doubling up to the configured maxima (``WorkerConfig``)."""
    max_blocks = -(-config.max_model_len // config.block_size)
    min_width = -(-MIN_CONTEXT_BUCKET_TOKENS // config.block_size)
    return StepBuckets(
        request_sizes=power_of_two_sizes(MIN_REQUEST_BUCKET, config.max_num_seqs),
        token_sizes=power_of_two_sizes(MIN_TOKEN_BUCKET, config.max_num_batched_tokens),
        block_table_widths=power_of_two_sizes(min_width, max_blocks),
    )


def parse_memory_info(info: dict[str, Any]) -> tuple[int, int, int]:
    """``(used, total, peak)`` bytes from ``xm.get_memory_info``, old or new format."""
    if "bytes_limit" in info:
        used, total = int(info["bytes_used"]), int(info["bytes_limit"])
        return used, total, int(info.get("peak_bytes_used", used))
    total = int(info["kb_total"]) * 1024
    used = total - int(info["kb_free"]) * 1024
    return used, total, used


class _XlaMemory:
    """``DeviceMemoryApi`` over XLA's counters: all device memory is the runtime's."""

    def __init__(self, platform: TpuPlatform) -> None:
        self.platform = platform

    def _info(self) -> tuple[int, int, int]:
        return parse_memory_info(self.platform.xla_model().get_memory_info(self.platform.device()))

    def mem_get_info(self) -> tuple[int, int]:
        used, total, _ = self._info()
        return total - used, total

    def memory_reserved(self) -> int:
        return self._info()[0]

    def max_memory_allocated(self) -> int:
        return self._info()[2]

    def reset_peak_memory_stats(self) -> None:
        pass  # XLA keeps the process-wide peak; it only ever overestimates here

    def empty_cache(self) -> None:
        pass

    def synchronize(self) -> None:
        self.platform.synchronize()


class TpuPlatform(Platform):
    name = "tpu"
    device_type = "xla"
    dist_backend = "xla"
    priority = 80
    supported_dtypes = (torch.bfloat16, torch.float32)
    supported_quantization = ()  # none verified on TPU yet
    supports_graphs = False  # XLA compiles whole steps already
    fresh_step_inputs = True
    attention_backends = ("static_paged",)

    @classmethod
    def _hints(cls) -> list[str]:
        hints = [name for name in ENV_HINTS if os.environ.get(name)]
        if os.environ.get("PJRT_DEVICE") == "TPU":
            hints.append("PJRT_DEVICE=TPU")
        return hints + probe.device_files(*DEVICE_PATTERNS)

    @classmethod
    def uses_cpu_pjrt(cls) -> bool:
        """Opted in to torch_xla's CPU device: PJRT_DEVICE=CPU, or unset with no TPU found."""
        if not _cpu_pjrt_allowed():
            return False
        pjrt = os.environ.get("PJRT_DEVICE")
        return pjrt == "CPU" or (pjrt is None and not cls._hints())

    @classmethod
    def is_available(cls) -> bool:
        if not probe.module_installed("torch_xla"):
            return False
        if cls.uses_cpu_pjrt():
            return True
        if os.environ.get("PJRT_DEVICE", "TPU") != "TPU":
            return False
        return bool(cls._hints())

    @classmethod
    def availability_detail(cls) -> str:
        if not probe.module_installed("torch_xla"):
            return "torch_xla is not installed"
        if cls.uses_cpu_pjrt():
            return f"torch_xla's CPU PJRT device ({CPU_PJRT_OPT_IN}=1; no TPU: for testing)"
        pjrt = os.environ.get("PJRT_DEVICE", "TPU")
        if pjrt != "TPU":
            return f"PJRT_DEVICE={pjrt} (not TPU; {CPU_PJRT_OPT_IN}=1 runs on torch_xla's CPU device)"
        hints = cls._hints()
        if not hints:
            return "no TPU environment variable or device file (/dev/accel*, /dev/vfio/*)"
        return "TPU found: " + ", ".join(hints[:4])

    def torch_xla(self) -> Any:
        if self.uses_cpu_pjrt():
            os.environ.setdefault("PJRT_DEVICE", "CPU")  # read when torch_xla starts its runtime
        return importlib.import_module("torch_xla")

    def xla_model(self) -> Any:
        return importlib.import_module("torch_xla.core.xla_model")

    def device_count(self) -> int:
        return int(self.torch_xla().device_count())

    def device(self, index: int = 0) -> torch.device:
        return torch.device(self.torch_xla().device(index))

    def synchronize(self) -> None:
        self.torch_xla().sync()
        self.xla_model().wait_device_ops()

    def memory_info(self, index: int = 0) -> MemoryInfo:
        if self.uses_cpu_pjrt():
            from octavo.platforms.cpu import CpuPlatform  # the CPU device's memory is the host's

            return CpuPlatform().memory_info()
        used, total, _ = parse_memory_info(self.xla_model().get_memory_info(self.device(index)))
        return MemoryInfo(free_bytes=total - used, total_bytes=total)

    def kv_cache_budget(self, runner: Any, memory_utilization: float) -> int | None:
        if self.uses_cpu_pjrt():
            return None  # host memory: the runner's default budget, as on the cpu platform
        return profile_kv_cache_budget(runner, memory_utilization, _XlaMemory(self))

    # ------------------------------------------------------------ runner hooks

    def grad_mode(self):
        return torch.no_grad()  # XLA cannot trace inference tensors

    def end_step(self) -> None:
        self.torch_xla().sync()

    def step_buckets(self, config: Any) -> StepBuckets:
        return tpu_step_buckets(config)

    def compilations(self) -> int | None:
        metrics = importlib.import_module("torch_xla.debug.metrics")
        data = metrics.metric_data("CompileTime")
        return int(data[0]) if data else 0

    def reference_device(self) -> torch.device:
        # HF's generate on a lazy XLA device compiles a program per token
        # (its shapes grow every step): on the CPU PJRT device one 16-token
        # prompt of the kit's tiny Llama took over 400 s, against 1 s on the CPU.
        return torch.device("cpu")

    def versions(self) -> dict[str, str]:
        versions = {"torch": torch.__version__, "torch-xla": probe.package_version("torch-xla")}
        if self.uses_cpu_pjrt():
            versions["device"] = "torch_xla's CPU PJRT device (no TPU)"
        return versions
