"""``freeze_startup_heap``: what is alive at startup leaves the full
collections, and what an earlier freeze kept is reclaimed by the next one."""

from __future__ import annotations

import gc
import weakref

from octavo.core.gc_heap import freeze_startup_heap


class Node:
    def __init__(self) -> None:
        self.other = self  # a cycle: only the cyclic collector frees it


def test_freezing_moves_the_live_heap_out_of_collection_and_thaws_the_last_freeze(monkeypatch):
    monkeypatch.setenv("OCTAVO_GC_FREEZE", "1")
    try:
        node = Node()
        alive = weakref.ref(node)
        assert freeze_startup_heap() > 0
        del node
        gc.collect()
        assert alive() is not None  # frozen: a full collection leaves it
        freeze_startup_heap()  # the next engine's freeze thaws and collects first
        assert alive() is None
    finally:
        gc.unfreeze()



def test_the_freeze_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("OCTAVO_GC_FREEZE", "0")
    gc.unfreeze()
    assert freeze_startup_heap() == 0 and gc.get_freeze_count() == 0
