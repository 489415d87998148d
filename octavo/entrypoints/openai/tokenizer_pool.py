"""A small pool of worker threads for tokenising, rendering chat templates
and decoding, so that none of it runs on the event loop.

Invariants:

* Each worker has its own copy of the tokenizer: a Rust tokenizer refuses
  to be borrowed by two threads at once, and transformers changes its
  settings (truncation, padding) on every call.
* Work that releases the interpreter lock (``tokenizers``' batch calls)
  runs in parallel with the event loop; pure-Python work (chat templates)
  shares the lock with it in slices of ``sys.getswitchinterval()`` (5 ms),
  so the loop still answers between them.
* ``run(fn, *args)`` calls ``fn(tokenizer, *args)`` on a worker; its
  exceptions (typed errors included) reach the awaiting route.
"""

from __future__ import annotations

import asyncio
import copy
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def default_pool_size() -> int:
    return max(1, min(4, os.cpu_count() or 1))


class TokenizerPool:
    def __init__(self, tokenizer: Any, num_workers: int) -> None:
        self._tokenizer = tokenizer
        self._local = threading.local()
        self._executor = ThreadPoolExecutor(
            max_workers=num_workers, thread_name_prefix="octavo-tokenizer", initializer=self._init_worker
        )

    def _init_worker(self) -> None:
        self._local.tokenizer = copy.deepcopy(self._tokenizer) if self._tokenizer is not None else None

    def _call(self, fn: Callable[..., T], args: tuple) -> T:
        return fn(self._local.tokenizer, *args)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._call, fn, args)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
