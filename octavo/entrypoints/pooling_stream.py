"""Pooling many texts in one call, tokenizing ahead of the engine (issue 21).

A user embedding a corpus calls ``LLM.embed(all_sentences)``. Tokenizing
all of it before the first step, then stepping, leaves the device idle
while the host tokenizes, and the host idle (waiting on the device) while
the steps run. Here the texts are cut into chunks of one step's worth
(``max_num_seqs``), tokenized in order, and queued as they are needed:
before each step the engine holds two chunks, the one the step takes and
the next, so the scheduler always finds a full step waiting and forms
exactly the steps it would have formed with everything queued at once (the
same vectors, bit for bit). Where the ``tokenizers`` library encodes (it
releases the GIL), the chunks are tokenized on a background thread, beside
the engine's work; BERT texts come mostly from ``word_ids``' cache, in
Python, at a fraction of the library's cost, and are tokenized in the
engine's thread as each chunk is queued (a thread would hold the GIL the
engine's Python needs).

What changes is only when a bad input is found. The checks that need no
tokens (the params, ``truncate_prompt_tokens``, a tokenizer to use, every
prompt a string) still run before any work; those that need an input's
tokens (its length, its ids) run when its chunk is queued, so a bad input
in a later chunk raises the same error after earlier chunks were computed.
The call still raises, nothing it queued is left in the engine, and no
output is returned.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from octavo.entrypoints.pooling_inputs import PoolingColumns

# Chunks the engine holds before a step: the step's and the next (see above).
CHUNKS_QUEUED = 2


def stream_chunk(engine: Any, num_texts: int) -> int | None:
    """The chunk to tokenize and queue at a time: one step's worth of inputs,
    where the engine says (its scheduler's ``max_num_seqs``) and the call has
    more than one. None: tokenize and queue everything at once."""
    config = getattr(getattr(engine, "scheduler", None), "config", None)
    chunk = getattr(config, "max_num_seqs", None)
    if not isinstance(chunk, int) or chunk < 1 or num_texts <= chunk:
        return None
    return chunk


class StreamedInputs:
    """Texts tokenized a chunk at a time, in order, and handed to ``queue`` as
    the engine needs them: on one background thread, or (``background``
    False: a tokenizer that encodes in Python, ``core.tokenizer.encodes_in_python``)
    in the caller's thread when a chunk is queued. Python tokenizing on a
    thread holds the GIL the engine's own Python needs; the engine's thread
    then waits for it at each hand-over instead of running."""

    def __init__(
        self,
        texts: Sequence[str],
        chunk: int,
        tokenize: Callable[[list[str]], PoolingColumns],
        queue: Callable[[PoolingColumns], list[str]],
        background: bool = True,
    ) -> None:
        self.chunk = chunk
        self._queue = queue
        slices = (list(texts[start : start + chunk]) for start in range(0, len(texts), chunk))
        # One worker: the chunks come back in order and the tokenizer is never
        # used by two threads at once (a truncating call reconfigures it).
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="octavo-tokenize") if background else None
        if self._worker is not None:
            futures = [self._worker.submit(tokenize, part) for part in slices]
            self._pending: deque[Callable[[], PoolingColumns]] = deque(future.result for future in futures)
        else:
            self._pending = deque(functools.partial(tokenize, part) for part in slices)

    def top_up(self, request_ids: list[str], unfinished: int) -> None:
        """Queue tokenized chunks until the engine holds ``CHUNKS_QUEUED`` of
        them (``unfinished`` of this call's requests are in it), appending
        their request ids. A chunk's tokenizing or checking error raises here."""
        while self._pending and unfinished < CHUNKS_QUEUED * self.chunk:
            queued = self._queue(self._pending.popleft()())
            request_ids.extend(queued)
            unfinished += len(queued)

    def chunks(self) -> Iterator[PoolingColumns]:
        """Each chunk's columns in order, as they are needed (``LLMEngine.pool_batches``
        pulls them itself: an idle encoder's call never queues in the scheduler)."""
        while self._pending:
            yield self._pending.popleft()()

    def close(self) -> None:
        """Drop the chunks not started (after an error) and let the thread go."""
        if self._worker is not None:
            self._worker.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()
