"""Keep the cyclic garbage collector off the objects that live as long as the engine.

After startup the process holds hundreds of thousands of long-lived objects
(torch, transformers, the model's modules). Every step allocates a few
thousand short-lived ones (requests, outputs); those alive at a collection
are promoted, and once enough have been promoted CPython runs a full
collection that walks the whole heap: about 0.4 s on a 2-core machine for an
engine that embeds a 256-sentence batch in ~25 ms, once every few dozen
batches. Freezing the heap once the engine is built (``gc.freeze``, as vLLM
does) leaves those full collections only the objects made since.

Frozen objects are never collected as cycles, so each freeze first thaws and
collects: an engine built and dropped earlier in the process (tests build
many) is then reclaimed rather than kept for good; and the heap is thawed
at exit, so that the interpreter's last collection frees it as usual
(extension modules report frozen objects as leaks otherwise).

The collection costs a walk of the heap (~0.5 s) per engine built;
``OCTAVO_GC_FREEZE=0`` skips it all (the test suite, which builds hundreds
of short-lived engines, sets it).
"""

from __future__ import annotations

import atexit
import gc
import os


def freeze_startup_heap() -> int:
    """Collect, then freeze every object alive now; returns how many were
    frozen (0 with ``OCTAVO_GC_FREEZE=0``)."""
    global _thaw_registered
    if os.environ.get("OCTAVO_GC_FREEZE", "1") == "0":
        return 0
    if not _thaw_registered:
        atexit.register(gc.unfreeze)
        _thaw_registered = True
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


_thaw_registered = False
