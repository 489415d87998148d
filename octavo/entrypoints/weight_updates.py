"""New weights for a running engine between requests (``LLM.reload_weights``,
``LLM.load_weights``; ``runtime/weight_reload.py`` does the copying).

Checked here, before any worker is asked: the engine runs in this process
(not ``engine_process`` or data parallelism, whose replicas this process
cannot reach), no request is in flight (they would mix old and new
weights), and a checkpoint directory has the running model's architecture
and shapes (a worker that failed a call would stop serving). After the
copy the engine forgets its cached prefixes, whose KV the old weights
computed.
"""

from __future__ import annotations

from octavo.errors import InvalidArgumentError, ModelLoadError


def reload_weights(engine, weights_path: str | None = None) -> list[int]:
    """Every rank copies the checkpoint's tensors (default: the model's own
    directory, re-read); returns how many tensors each rank read."""
    _check_engine(engine)
    if weights_path is not None:
        from pathlib import Path

        from octavo.models.config import load_arch_config
        from octavo.models.loader import resolve_model_path
        from octavo.runtime.weight_reload import check_same_shapes

        path = resolve_model_path(weights_path)
        arch = load_arch_config(path)
        if arch.architecture != engine.info.architecture:
            raise ModelLoadError(
                f"{weights_path} holds a {arch.architecture}, the running model is a {engine.info.architecture}"
            )
        # Here too, not only in the workers: a worker process that fails a call stops serving.
        check_same_shapes(arch, load_arch_config(Path(engine.info.model_path)), path)
        weights_path = str(path)
    counts = engine.executor.reload_weights(weights_path)
    engine.reset_prefix_cache()
    return counts


def load_weights(engine, weights) -> int:
    """Copy ``(checkpoint name, tensor)`` pairs into the model (one process only)."""
    _check_engine(engine)
    load = getattr(engine.executor, "load_weights", None)
    if load is None:
        raise InvalidArgumentError(
            "load_weights hands tensors to a worker in this process; with several worker processes, save them "
            "as a checkpoint and call reload_weights(path)", param="weights",
        )
    count = load(weights)[0]
    engine.reset_prefix_cache()
    return count


def _check_engine(engine) -> None:
    if not hasattr(engine, "executor"):
        raise InvalidArgumentError(
            "weights are reloaded by an engine in this process (not with engine_process or data parallelism)",
            param="weights",
        )
    if engine.has_unfinished_requests():
        raise InvalidArgumentError("weights are reloaded between requests; some are still running", param="weights")

