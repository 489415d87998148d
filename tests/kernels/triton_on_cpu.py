"""A test plugin that registers Octavo's own Triton kernels for the ``cpu``
platform (Triton's interpreter runs them there), exactly as a vendor
registers its kernels: the way kernel tests run a whole model on the fast
path without a GPU, or check them with the conformance kit's ``ops`` check.
``gemv_max_tokens`` lets a test widen the GEMV's per-call condition so that
decode steps of a few requests take it too. ``unprobed`` names ops whose
device probes are dropped: ``torch._scaled_mm`` runs on the CPU too, so the
fp8 W8A8 implementations can serve there (their probes ask for CUDA).
"""

from __future__ import annotations

SOURCE = '''
OCTAVO_PLUGIN_API_VERSION = "1.5"
import dataclasses
from octavo.kernels.builtin import CUDA, builtin_layer_ops

OPS = {ops!r}
UNPROBED = {unprobed!r}

@hookimpl
def octavo_layer_ops():
    impls = []
    for impl in builtin_layer_ops():
        if impl.device_types != CUDA or (impl.supports is not None and impl.op not in UNPROBED):
            continue  # probed for a GPU
        if OPS is not None and impl.op not in OPS:
            continue
        max_tokens = {gemv_max_tokens} if impl.max_tokens is not None else None
        impls.append(dataclasses.replace(
            impl, device_types=(), platforms=("cpu",), priority=1, max_tokens=max_tokens, supports=None
        ))
    return impls
'''


def add_triton_on_cpu(
    sandbox, gemv_max_tokens: int = 1, ops: tuple[str, ...] | None = None, unprobed: tuple[str, ...] = ()
) -> None:
    """Register the plugin (for ``ops`` only, if given) in a ``tests.plugins.fake_plugins`` sandbox."""
    sandbox.add("triton_on_cpu", SOURCE.format(gemv_max_tokens=gemv_max_tokens, ops=ops, unprobed=unprobed))


def count_calls(monkeypatch, module, names: tuple[str, ...]) -> dict[str, int]:
    """Count calls of ``module``'s functions ``names``, patched where the
    layer-op resolver imports them from (so that the resolved table calls
    the counting wrappers); returns the live counts."""
    import functools

    calls = dict.fromkeys(names, 0)
    for name in names:
        original = getattr(module, name)

        @functools.wraps(original)
        def counted(*args, _name=name, _original=original):
            calls[_name] += 1
            return _original(*args)

        monkeypatch.setattr(module, name, counted)
    return calls
