"""The objects a platform's methods are handed, as documented views (plugin API 1.1).

A platform never needs the runner's internals: what it may use of the
objects Octavo passes it is listed here, and only these members are
covered by the versioning policy (docs/plugins.md). New members are added
in minor versions; none is removed or changed before the next major one.

* ``kv_cache_budget(runner, utilization)`` gets a ``RunnerView``.
* ``graph_runner()`` returns a ``GraphRunnerFactory``: called with a
  ``RunnerView`` and the batch sizes to capture, it returns ``StepGraphs``.
* ``check_config(config)`` gets a ``WorkerConfig``
  (``octavo.runtime.config``: plain values; fields are only added, with
  defaults, in minor versions).
* ``create_event()`` returns a ``DeviceEvent`` or None.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from octavo.runtime.config import WorkerConfig


class RunnerView(Protocol):
    """The model runner of one worker, as platforms see it."""

    config: "WorkerConfig"
    device: torch.device

    def kv_bytes_per_block(self) -> int:
        """Bytes one KV-cache block costs across the layers this worker holds."""

    def profile_run(self) -> None:
        """Push the largest step the scheduler can produce through the model,
        writing no KV (``octavo.platforms.profiling``): measure peak memory around it."""

    def decode_step_for_capture(self, num_reqs: int) -> Callable[[], torch.Tensor]:
        """Fill the runner's persistent inputs with a placeholder decode step of
        ``num_reqs`` requests, and return the function that runs a decode step
        from those inputs (attention metadata, model, logits ``[num_reqs, vocab]``).
        A graph runner captures it; for each later step the runner refills the
        same inputs and the graph is replayed. The function syncs nothing and
        branches on no device value."""


class StepGraphs(Protocol):
    """Captured decode steps, one per batch size (what ``GraphRunnerFactory`` returns)."""

    def capture(self) -> None:
        """Capture every size (called once, after the KV cache exists)."""

    def padded_size(self, num_reqs: int) -> int | None:
        """The captured size to run ``num_reqs`` requests in, or None (run eagerly)."""

    def replay(self, size: int, num_reqs: int) -> torch.Tensor:
        """Replay the ``size`` graph on the inputs just uploaded; the first ``num_reqs`` rows of its logits."""

    # Optional: ``prefill_graphs(buckets, max_num_reqs)`` -> an object with
    # ``bucket_for(num_tokens, num_reqs)``, ``replay(bucket)`` and
    # ``max_num_reqs``, for steps of up to a few thousand tokens (CUDA has it).
    # Optional: ``encoder_graphs(forward, max_tokens)`` -> an
    # ``octavo.runtime.encoder_graphs.EncoderGraphs`` for encoder-only pooling
    # models (made on a factory called with no batch sizes; CUDA has it).


GraphRunnerFactory = Callable[[RunnerView, list[int]], StepGraphs]


class DeviceEvent(Protocol):
    """A marker in the device's work queue (``torch.cuda.Event`` and its kin)."""

    def record(self) -> None:
        """Mark the work queued so far on the current stream."""

    def synchronize(self) -> None:
        """Wait on the host until the marked work is done."""
