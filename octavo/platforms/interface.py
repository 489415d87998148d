"""The ``Platform`` interface: everything hardware-specific, behind one object.

The core never asks "is this CUDA?": it asks the selected platform for an
object (attention backend, graph runner) or a capability (dtypes,
quantization methods). Invariants every platform keeps:

* ``is_available`` is cheap and imports no vendor package: it runs for every
  installed platform in every process that selects one. A platform module may
  import torch at module level, never its vendor package (torch_xla,
  torch_npu, habana_frameworks, intel_extension_for_pytorch); those are
  imported on first use by instance methods.
* Instances are created only for the platform that was selected, in the
  process that runs on it; class attributes are read for every candidate.
* ``priority`` orders the available platforms (higher wins, cpu is 0); a
  negative priority means "only when asked for by name".

Plugin API version 1.1: see docs/plugins.md. What the objects handed to
these methods offer (the runner, the worker config, graph runners, events)
is in ``octavo.platforms.contract``.

Runner hooks (1.1), for platforms that compile or trace steps: the grad mode
steps run under (``grad_mode``), ``begin_step`` / ``end_step`` around each
step's device work, static step shapes (``step_buckets``: the runner pads
steps to them and warms every one up at start), the function that runs a
padded step (``compile_step``), and a compilation counter
(``compilations``). Their defaults keep a platform eager and unpadded.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

if TYPE_CHECKING:
    from octavo.core.attention import AttentionBackend, AttentionSpec
    from octavo.platforms.contract import DeviceEvent, GraphRunnerFactory, RunnerView
    from octavo.platforms.step_shapes import StepBuckets


@dataclass
class MemoryInfo:
    free_bytes: int
    total_bytes: int


class Platform(ABC):
    name: ClassVar[str]
    # torch device type: "cpu", "cuda" (also ROCm), "xpu", "xla", "hpu", "npu".
    device_type: ClassVar[str]
    # torch.distributed backend: gloo, nccl (also RCCL on ROCm), xccl, xla, hccl.
    dist_backend: ClassVar[str]
    # Higher wins among available platforms; cpu is 0; negative: only by name.
    priority: ClassVar[int] = 0
    # Model dtypes this platform runs (``--dtype auto`` picks the checkpoint's
    # dtype when it is listed here, else float32).
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32, torch.bfloat16, torch.float16)
    # Quantization method names that may run here; None: every installed
    # method (all of them have a plain-torch path on this device).
    supported_quantization: ClassVar[tuple[str, ...] | None] = ()
    # True when decode steps can be captured and replayed as graphs
    # (``graph_runner``), which also turns on decode overlap by default.
    supports_graphs: ClassVar[bool] = False
    # True when host staging buffers should be pinned (page-locked), so that
    # host-to-device copies run asynchronously (plugin API 1.1).
    pins_host_memory: ClassVar[bool] = False
    # True when each step's inputs should be new device tensors instead of
    # copies into persistent device buffers (plugin API 1.1): on a lazy-tensor
    # device (XLA) such a copy would become part of the traced step.
    fresh_step_inputs: ClassVar[bool] = False
    # Attention backends by name, most preferred first. Resolved through the
    # ``octavo_attention_backends`` hook, so a plugin may add one and a
    # platform may name it; torch_paged (the reference) is the last resort.
    attention_backends: ClassVar[tuple[str, ...]] = ("torch_paged",)

    @classmethod
    @abstractmethod
    def is_available(cls) -> bool:
        """Cheap probe: is this hardware (and its Python package) here?

        Must not import the vendor package, create a device context, or
        anything else that would make a later ``fork`` unsafe."""

    @classmethod
    def availability_detail(cls) -> str:
        """One line for ``octavo env``: why ``is_available`` said what it said."""
        return "available" if cls.is_available() else "not available"

    @abstractmethod
    def device_count(self) -> int:
        """Number of devices of this kind visible to this process."""

    def device(self, index: int = 0) -> torch.device:
        """The torch device for local device ``index``."""
        return torch.device(self.device_type, index)

    def set_device(self, index: int) -> None:
        """Make device ``index`` current for this process (worker startup)."""

    @abstractmethod
    def memory_info(self, index: int = 0) -> MemoryInfo:
        """Free and total memory of device ``index``, in bytes."""

    def synchronize(self) -> None:
        """Wait until the work queued on the current device is done."""

    def attention_backend(self, spec: "AttentionSpec") -> "AttentionBackend":
        """The attention backend for a model with this spec.

        Default: the first of ``attention_backends`` that is installed and
        supports ``spec`` (``OCTAVO_ATTENTION_BACKEND`` overrides), see
        ``octavo.platforms.attention_selection``."""
        from octavo.platforms.attention_selection import resolve_attention_backend

        return resolve_attention_backend(self, spec)

    def graph_runner(self) -> "GraphRunnerFactory | None":
        """A factory for step graphs (CUDA/HIP graphs), or None: run eagerly.

        Called in each worker once its KV cache exists; the factory gets the
        runner (a ``RunnerView``) and the batch sizes to capture and returns
        ``StepGraphs`` (``octavo.platforms.contract``)."""
        return None

    def create_event(self) -> "DeviceEvent | None":
        """An event on the current device (``record()``, ``synchronize()``), used
        to wait for asynchronous copies; None (the default) when the host need
        not wait for them (plugin API 1.1). Octavo asks for events only through
        this method, never from ``torch.cuda`` directly."""
        return None

    # ------------------------------------------------ runner hooks (plugin API 1.1)

    def grad_mode(self) -> AbstractContextManager:
        """The autograd mode every step runs under. Default ``torch.inference_mode()``;
        a tracing device that cannot take inference tensors (XLA) returns
        ``torch.no_grad()``."""
        return torch.inference_mode()

    def begin_step(self) -> None:
        """Called in the worker at the start of each step, before its inputs
        are prepared. Default nothing."""

    def end_step(self) -> None:
        """Called once per step after its device work (model, logits, sampling)
        is queued and before any result is read on the host: where XLA cuts
        and launches the traced graph (``torch_xla.sync()``) and HPU marks a
        step. Default nothing."""

    def step_buckets(self, config: Any) -> "StepBuckets | None":
        """Static step shapes for a worker with this ``WorkerConfig``, or None
        (the default): steps run at their own shapes.

        With buckets, the runner pads every step they cover to its bucket's
        ``StepShape`` (``octavo.platforms.step_shapes``: padding tokens belong
        to no request), runs it through ``compile_step``'s function, and
        warms every shape up once the KV cache exists, so that a compiler
        sees one shape per bucket and compiles nothing in steady state. Steps
        no bucket covers (and steps asking for prompt logprobs) run unpadded,
        as without buckets."""
        return None

    def compile_step(self, step: Callable) -> Callable:
        """Called once per worker with buckets: ``step(input_ids, positions,
        attn_metadata, logits_indices)`` runs the model on a padded step's
        inputs and returns the logits of the sampled rows (``[num_reqs of the
        shape, vocab]``); it reads nothing on the host. Return what the runner
        calls instead: ``torch.compile(step, ...)``, a vendor's graph
        compiler, or ``step`` itself (the default; XLA traces it as it runs)."""
        return step

    def compilations(self) -> int | None:
        """Programs compiled so far in this process (XLA programs,
        ``torch.compile`` graphs), or None (the default) when the platform
        compiles nothing. Read before and after every step: a step that
        compiles after warm-up is logged as a warning and counted
        (``octavo:compilations_after_warmup`` on ``/metrics``)."""
        return None

    def reference_device(self) -> torch.device:
        """Where the conformance kit runs its Hugging Face reference (the
        ``model`` and ``plugin_models`` checks), in the dtype under test.

        Called in the process running the kit, once per comparison, after
        Octavo's own run on ``device(0)``. Default ``device(0)``: the
        reference runs on the hardware under test. A platform whose device
        traces and compiles whole programs (XLA) returns the CPU instead:
        transformers' ``generate`` grows its shapes every step, so there it
        would compile a new program per token, and the reference is only
        there to be correct, not to exercise the device."""
        return self.device(0)

    def check_config(self, config: Any) -> None:
        """Raise ``PlatformError`` if ``config`` (a ``WorkerConfig``) cannot run here.

        Called once in the engine process, before any worker starts."""
        from octavo.runtime.config import dtype_from_name

        dtype = dtype_from_name(config.dtype) if isinstance(config.dtype, str) else config.dtype
        if dtype not in self.supported_dtypes:
            from octavo.errors import PlatformError

            supported = ", ".join(str(d).removeprefix("torch.") for d in self.supported_dtypes)
            raise PlatformError(f"dtype {config.dtype} is not supported on {self.name} (supported: {supported})")

    def kv_cache_dtype(self, name: str) -> torch.dtype:
        """The torch dtype for a ``kv_cache_dtype`` option other than ``auto``."""
        from octavo.errors import InvalidArgumentError

        raise InvalidArgumentError(f"kv_cache_dtype {name!r} is not supported on {self.name}", param="kv_cache_dtype")

    def kv_cache_budget(self, runner: "RunnerView", memory_utilization: float) -> int | None:
        """Bytes for the KV cache once ``runner`` has loaded its model; None: default.

        Called in each worker process after loading, before the KV cache
        exists. ``runner`` offers what ``RunnerView`` lists (config, device,
        ``kv_bytes_per_block()``, ``profile_run()``); see
        ``octavo.platforms.profiling`` for the usual dummy-step profile."""
        return None

    def allocate_kv_cache(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """One layer's zero-filled KV-cache tensor; a platform may commit its memory lazily."""
        return torch.zeros(shape, dtype=dtype, device=device)

    def optimize_model(self, model: torch.nn.Module) -> None:
        """Plugin API 1.0, kept for compatibility: called after weights are
        loaded; default nothing. Kernels reach the layers as layer ops
        (``octavo_layer_ops``), not by changing a built model."""

    def default_max_num_batched_tokens(self) -> int:
        """Token budget of one step when the user sets none."""
        return 2048

    def versions(self) -> dict[str, str]:
        """Versions of the vendor packages and devices, for ``octavo env``."""
        return {}
