"""The CPU platform: always available, the floor of the selection order.

It runs the plain-torch paged attention backend, which is also the reference
every other backend is tested against.

KV cache: by default it holds what was asked for, ``max_num_seqs`` sequences
of ``max_model_len`` tokens, capped at half of the memory free after the
weights are loaded (``OCTAVO_CPU_KVCACHE_SPACE`` GiB overrides it). Its
memory is an anonymous private mapping, so pages become resident only as
sequences fill them: start-up neither zeroes nor commits the whole cache.
The mapping asks for small pages: with transparent huge pages (numpy's
``zeros`` asks for them) the first write to each layer's keys and values
faulted in and zeroed 2 MiB, 60 huge pages for one short prompt of a 30-layer
model, 0.1-0.2 s of the first token on a 2-core VM (docs/startup.md).

Compiled decode (opt-in, ``OCTAVO_CPU_COMPILE=1``): decode steps of up to
``OCTAVO_CPU_COMPILE_MAX_BATCH`` requests (default 8) are padded to a power of
two and run through ``torch.compile`` with inductor (another backend by
name: ``OCTAVO_CPU_COMPILE=aot_eager``), one graph per batch size, compiled
at warm-up; attention is an opaque op around ``torch_paged``
(``runtime/attention/opaque.py``; inside it, decode steps take
``torch_paged``'s decode path), so only the token count shapes a graph.
Other steps (prefills, larger batches) run eagerly. Off by default: the
compilation costs tens of seconds at start on a small host, which a short
run or a test never earns back. Under inductor, one-token linear layers in
float32 take the ``compiled_reduction`` layer op
(``kernels/cpu_reduction_gemv.py``): MKL's GEMV does not split the narrow
matrices of a small model between threads. On the 2-core dev machine,
batch-1 decode of a 135M Llama in float32: 45.7 ms/token compiled (two
threads), HF eager 68.2, 2.2x the memory floor (benchmarks/RESULTS.md,
"CPU compiled decode (issue 23)").
"""

from __future__ import annotations

import logging
import math
import mmap
import os

import torch

from octavo.platforms.interface import MemoryInfo, Platform
from octavo.platforms.step_shapes import StepBuckets, power_of_two_sizes

logger = logging.getLogger(__name__)
# The default KV cache never takes more than this share of the free memory.
MAX_FREE_MEMORY_SHARE = 0.5

COMPILE_ENV = "OCTAVO_CPU_COMPILE"
COMPILE_MAX_BATCH_ENV = "OCTAVO_CPU_COMPILE_MAX_BATCH"
DEFAULT_COMPILE_MAX_BATCH = 8


def compile_backend() -> str | None:
    """The torch.compile backend ``OCTAVO_CPU_COMPILE`` asks for, or None (eager)."""
    value = os.environ.get(COMPILE_ENV, "").strip()
    if value.lower() in ("", "0", "false", "no", "off"):
        return None
    return "inductor" if value.lower() in ("1", "true", "yes", "on") else value


def zeroed_on_demand(num_bytes: int) -> torch.Tensor:
    """``num_bytes`` of zeros in an anonymous private mapping (uint8): the
    kernel maps its zero page until a page is written, so the memory becomes
    resident only as it is used; small pages, so a first write costs one
    4 KiB page, not a 2 MiB one (the tensor keeps the mapping alive)."""
    mapped = mmap.mmap(-1, max(num_bytes, 1), flags=mmap.MAP_PRIVATE)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        mapped.madvise(mmap.MADV_NOHUGEPAGE)
    return torch.frombuffer(mapped, dtype=torch.uint8)[:num_bytes]


class CpuPlatform(Platform):
    name = "cpu"
    device_type = "cpu"
    dist_backend = "gloo"
    priority = 0
    supported_quantization = None  # every method has a plain-torch path

    def __init__(self) -> None:
        self._compiler = None
        backend = compile_backend()
        if backend is not None:
            from octavo.platforms.torch_compile import CountedCompiler

            self._compiler = CountedCompiler(backend)

    @classmethod
    def is_available(cls) -> bool:
        return True

    @classmethod
    def availability_detail(cls) -> str:
        return f"always available ({os.cpu_count()} cores)"

    def device_count(self) -> int:
        return 1

    def device(self, index: int = 0) -> torch.device:
        return torch.device("cpu")

    def memory_info(self, index: int = 0) -> MemoryInfo:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        available = os.sysconf("SC_AVPHYS_PAGES")
        return MemoryInfo(free_bytes=available * page_size, total_bytes=pages * page_size)

    def kv_cache_budget(self, runner, memory_utilization: float) -> int | None:
        # OCTAVO_CPU_KVCACHE_SPACE (GiB) is the CPU's analogue of gpu_memory_utilization.
        space = os.environ.get("OCTAVO_CPU_KVCACHE_SPACE")
        if space:
            return int(float(space) * 2**30)
        return requested_kv_cache_bytes(runner.config, runner.kv_bytes_per_block(), self.memory_info().free_bytes)

    def allocate_kv_cache(self, shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        num_bytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        return zeroed_on_demand(num_bytes).view(dtype).view(shape)

    def kv_cache_dtype(self, name: str) -> torch.dtype:
        if name in ("fp8", "fp8_e4m3"):
            return torch.float8_e4m3fn
        return super().kv_cache_dtype(name)

    # -------------------------------------------- compiled decode (opt-in)

    def attention_backend(self, spec):
        backend = super().attention_backend(spec)
        if self._compiler is None:
            return backend
        from octavo.runtime.attention.opaque import OpaqueAttention

        return OpaqueAttention(backend)

    def step_buckets(self, config) -> StepBuckets | None:
        if self._compiler is None:
            return None
        max_batch = int(os.environ.get(COMPILE_MAX_BATCH_ENV, DEFAULT_COMPILE_MAX_BATCH))
        return StepBuckets(request_sizes=power_of_two_sizes(1, min(config.max_num_seqs, max(1, max_batch))))

    def compile_step(self, step):
        return step if self._compiler is None else self._compiler(step)

    @property
    def decode_compile_backend(self) -> str | None:
        """The torch.compile backend decode steps run under, or None (eager)."""
        return None if self._compiler is None else self._compiler.backend

    def compilations(self) -> int | None:
        return None if self._compiler is None else self._compiler.count

    def versions(self) -> dict[str, str]:
        compiled = self.decode_compile_backend or f"off ({COMPILE_ENV}=1 turns it on)"
        return {"torch": torch.__version__, "threads": str(torch.get_num_threads()), "compiled decode": compiled}


def requested_kv_cache_bytes(config, bytes_per_block: int, free_bytes: int) -> int:
    """Bytes for ``max_num_seqs`` full-length sequences, capped at a share of ``free_bytes``."""
    blocks_per_seq = -(-config.max_model_len // config.block_size)
    requested = config.max_num_seqs * blocks_per_seq * bytes_per_block
    cap = int(free_bytes * MAX_FREE_MEMORY_SHARE)
    if requested <= cap:
        logger.info(
            "CPU KV cache: %.2f GiB for %d sequences x %d tokens",
            requested / 2**30, config.max_num_seqs, config.max_model_len,
        )
        return requested
    logger.info(
        "CPU KV cache: %d sequences x %d tokens would need %.2f GiB; capped at half the free memory (%.2f GiB) "
        "(set OCTAVO_CPU_KVCACHE_SPACE in GiB, or lower --max-num-seqs or --max-model-len)",
        config.max_num_seqs, config.max_model_len, requested / 2**30, cap / 2**30,
    )
    return cap
