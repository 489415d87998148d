"""Compiling constraints into token-level grammars, off the engine loop.

``GrammarCompiler`` owns xgrammar's compiler for one tokenizer and a small
pool of threads. ``submit`` returns a ``CompileJob`` at once; the caller
waits for it or polls it, so a slow constraint delays only the requests that
use it (xgrammar releases the interpreter lock while it compiles).

Limits (``StructuredOutputLimits``):
- size: a constraint longer than ``max_spec_chars`` is refused before it is
  compiled; a compiled grammar bigger than ``max_grammar_bytes`` is refused;
- time: a front end waiting for a compile (``wait``, ``wait_async``) gets
  ``GrammarTimeoutError`` once it has run longer than ``compile_timeout_s``
  (counted from when it starts, not while it waits for a thread). The
  thread cannot be interrupted, so it finishes in the background; the job
  remembers how long it took, and every later front-end wait for that
  constraint fails at once too (the answer does not depend on who asked
  first). The engine, which only compiles what a front end accepted, is not
  held to that limit (a busy machine must not fail admitted requests), only
  to ``ENGINE_TIMEOUT_FACTOR`` times it, against a compile that never ends.
- cache: results (failures included) are kept by ``StructuredOutputsParams.key``
  in LRU order, within ``cache_bytes`` of compiled grammars and
  ``max_cache_entries`` entries; jobs still running are never evicted.

Thread safety: ``submit`` and the waits may be called from any thread. The
tokenizer is copied, because a Rust tokenizer must not be used by two
threads at once.
"""

from __future__ import annotations

import asyncio
import copy
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass
from typing import Any

from octavo.core.structured_output.grammar import build_grammar
from octavo.core.structured_output.params import StructuredOutputsParams
from octavo.errors import GrammarTimeoutError, GrammarTooLargeError, OctavoError, StructuredOutputError

ENGINE_TIMEOUT_FACTOR = 10.0


@dataclass
class StructuredOutputLimits:
    max_spec_chars: int = 128 << 10
    compile_timeout_s: float = 10.0
    max_grammar_bytes: int = 64 << 20
    cache_bytes: int = 512 << 20
    max_cache_entries: int = 1024


class CompileJob:
    """One constraint's compilation: a future and when its thread took it up."""

    def __init__(self) -> None:
        self.future: Future = Future()
        self.started_at: float | None = None
        self.elapsed: float | None = None  # seconds the compile took, once done
        self.num_bytes = 0

    def done(self) -> bool:
        return self.future.done()

    def overdue(self, timeout_s: float) -> bool:
        """Running for longer than ``timeout_s`` (and still not done)."""
        started = self.started_at
        return not self.done() and started is not None and time.monotonic() - started > timeout_s

    def result(self) -> Any:
        """The compiled grammar; raises (a fresh copy of) the job's error."""
        try:
            return self.future.result(timeout=0)
        except OctavoError as exc:
            raise type(exc)(exc.message, param=exc.param) from None


class GrammarCompiler:
    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: frozenset[int],
        limits: StructuredOutputLimits | None = None,
        num_threads: int = 2,
    ) -> None:
        self.limits = limits or StructuredOutputLimits()
        self.vocab_size = vocab_size
        self._tokenizer = copy.deepcopy(tokenizer)
        self._stop_token_ids = sorted(stop_token_ids)
        self._jobs: OrderedDict[tuple[str, str], CompileJob] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(num_threads, thread_name_prefix="octavo-grammar")
        self._xgr_compiler: Any = None
        self._compiler_ready = self._pool.submit(self._build_compiler)

    # ------------------------------------------------------------ compiling

    def _build_compiler(self) -> Any:
        """xgrammar's compiler for this tokenizer (reading the vocabulary takes a while)."""
        import xgrammar as xgr

        from octavo.core.tokenizer import transformers_tokenizer

        # xgrammar reads a transformers tokenizer's class and vocabulary.
        info = xgr.TokenizerInfo.from_huggingface(
            transformers_tokenizer(self._tokenizer), vocab_size=self.vocab_size, stop_token_ids=self._stop_token_ids or None
        )
        self._xgr_compiler = xgr.GrammarCompiler(info, max_threads=min(8, os.cpu_count() or 1), cache_enabled=False)
        return self._xgr_compiler

    def tokenizer_info(self) -> Any:
        return self._compiler_ready.result().tokenizer_info

    def submit(self, params: StructuredOutputsParams) -> CompileJob:
        spec = params.spec
        if len(spec) > self.limits.max_spec_chars:
            job = CompileJob()
            job.future.set_exception(
                GrammarTooLargeError(
                    f"the {params.kind} constraint has {len(spec)} characters, more than the limit of "
                    f"{self.limits.max_spec_chars}"
                )
            )
            return job
        key = params.key
        with self._lock:
            job = self._jobs.get(key)
            if job is not None:
                self._jobs.move_to_end(key)
                return job
            job = self._jobs[key] = CompileJob()
        self._pool.submit(self._run, job, params)
        return job

    def _run(self, job: CompileJob, params: StructuredOutputsParams) -> None:
        try:
            compiler = self._compiler_ready.result()
            job.started_at = started = time.monotonic()
            compiled = compiler.compile_grammar(build_grammar(params))
            job.elapsed = time.monotonic() - started
            if compiled.memory_size_bytes > self.limits.max_grammar_bytes:
                raise GrammarTooLargeError(
                    f"the compiled {params.kind} grammar takes {compiled.memory_size_bytes} bytes, more than the "
                    f"limit of {self.limits.max_grammar_bytes}"
                )
            job.num_bytes = compiled.memory_size_bytes
            job.future.set_result(compiled)
        except OctavoError as exc:
            job.future.set_exception(exc)
        except Exception as exc:  # noqa: BLE001 - any compiler failure is this constraint's
            job.future.set_exception(StructuredOutputError(f"the {params.kind} constraint does not compile: {exc}"))
        self._evict()

    def _timeout_message(self) -> str:
        return f"compiling the constraint took longer than the limit of {self.limits.compile_timeout_s:g} s"

    def _evict(self) -> None:
        with self._lock:
            total = sum(job.num_bytes for job in self._jobs.values())
            for key, job in list(self._jobs.items()):
                if total <= self.limits.cache_bytes and len(self._jobs) <= self.limits.max_cache_entries:
                    break
                if job.done():
                    total -= job.num_bytes
                    del self._jobs[key]

    # -------------------------------------------------------------- waiting

    def check(self, job: CompileJob) -> str | None:
        """For the engine: None while pending or compiled, else why it failed."""
        if job.overdue(ENGINE_TIMEOUT_FACTOR * self.limits.compile_timeout_s):
            return self._timeout_message()
        if job.done() and job.future.exception() is not None:
            return str(job.future.exception())
        return None

    def wait(self, job: CompileJob) -> Any:
        """Block until compiled (or failed, or over the time limit)."""
        while True:
            try:
                job.future.result(timeout=self._time_left(job))
            except FutureTimeoutError:
                if job.overdue(self.limits.compile_timeout_s):
                    raise GrammarTimeoutError(self._timeout_message()) from None
                continue
            except OctavoError:
                pass
            return self._result_in_time(job)

    async def wait_async(self, job: CompileJob) -> Any:
        """``wait`` for an event loop: the loop keeps serving meanwhile."""
        loop = asyncio.get_running_loop()
        finished = asyncio.Event()
        # Not asyncio.wrap_future: cancelling its wrapper would cancel the
        # job that other requests share.
        job.future.add_done_callback(lambda _: _notify(loop, finished))
        while not job.done():
            try:
                await asyncio.wait_for(finished.wait(), timeout=self._time_left(job))
            except asyncio.TimeoutError:
                pass
            if job.overdue(self.limits.compile_timeout_s):
                raise GrammarTimeoutError(self._timeout_message())
        return self._result_in_time(job)

    def _result_in_time(self, job: CompileJob) -> Any:
        compiled = job.result()
        if job.elapsed is not None and job.elapsed > self.limits.compile_timeout_s:
            raise GrammarTimeoutError(self._timeout_message())
        return compiled

    def _time_left(self, job: CompileJob) -> float:
        started = job.started_at
        if started is None:  # still waiting for a thread: look again soon
            return min(0.05, self.limits.compile_timeout_s)
        return max(0.0, started + self.limits.compile_timeout_s - time.monotonic()) + 0.001

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _notify(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
    try:
        loop.call_soon_threadsafe(event.set)
    except RuntimeError:  # the loop has closed: nobody waits any more
        pass
