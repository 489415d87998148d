"""The engine's side of structured outputs: requests waiting for their
grammar, each request's matcher, and the token masks of every step.

Lifecycle of a constrained request: ``add`` submits its constraint to the
compiler and parks it; ``take_ready`` hands it to the scheduler once its
grammar is compiled (with a matcher of its own: the ``n`` children of a
request share the grammar, not the matcher) or fails it if compiling
failed; ``bitmask`` writes its mask in each step where it samples; the
scheduler advances its matcher with each token it commits
(``Scheduler.update_from_output``) and ends it when the grammar is complete.

The matcher only ever keeps committed tokens, exactly once each:
speculative decoding's drafts are checked against it (``valid_drafts``)
and their masks filled (``fill``) by accepting them and rolling them back
at once. Preemption keeps a request's output tokens (only its KV cache is
recomputed), and a request is in at most one batch in flight, so its mask
is always computed from all of its tokens so far.
"""

from __future__ import annotations

import logging
from concurrent.futures import FIRST_COMPLETED, wait
from typing import Any

from octavo.core.request import Request
from octavo.core.scheduler_output import GrammarBitmask, SchedulerOutput
from octavo.core.structured_output.compiler import CompileJob, GrammarCompiler
from octavo.core.structured_output.params import StructuredOutputsParams

logger = logging.getLogger(__name__)


class RequestGrammar:
    """One request's way through its grammar.

    With a reasoning model's markers (``params.reasoning_start_id`` / ``_end_id``) the grammar
    waits for the think block to end: ``phase`` is ``reasoning`` (no mask: the model reasons
    freely) until the end marker, ``undecided`` while the output may still open a block (the
    mask is the grammar's plus the start marker), then ``active``. The markers themselves never
    reach the matcher."""

    def __init__(self, job: CompileJob, params: StructuredOutputsParams | None = None,
                 prompt_token_ids: list[int] | None = None) -> None:
        self.job = job
        self.matcher: Any = None
        self.start_id = params.reasoning_start_id if params is not None else None
        self.end_id = params.reasoning_end_id if params is not None else None
        self.phase = "active" if self.start_id is None else _first_phase(params, prompt_token_ids or [])

    def start(self) -> None:
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(self.job.result())

    @property
    def constrains(self) -> bool:
        """Whether the next token gets a mask."""
        return self.phase != "reasoning"

    def accept(self, token_id: int) -> bool:
        if self.phase == "active":
            return self.matcher.accept_token(token_id)
        if self.phase == "reasoning":
            if token_id == self.end_id:
                self.phase = "active"
            return True
        if token_id == self.start_id:  # undecided: the model opened a think block
            self.phase = "reasoning"
            return True
        self.phase = "active"
        return self.matcher.accept_token(token_id)

    @property
    def is_terminated(self) -> bool:
        return self.phase == "active" and self.matcher.is_terminated()

    def fill(self, bitmask: Any, row: int, drafts: list[int] | None = None) -> None:
        """The next token's mask into ``bitmask[row]``; with ``drafts`` (all
        allowed, ``valid_drafts``), the mask after each draft into the rows
        that follow, the phase moving with the drafts (a row inside a think
        block allows every token). The matcher ends as it was."""
        phase, accepted = self.phase, 0
        for index in range(len(drafts or ()) + 1):
            self._fill_row(bitmask, row + index, phase)
            if drafts and index < len(drafts):
                phase, used_matcher = self._advance(phase, drafts[index])
                accepted += used_matcher
        if accepted:
            self.matcher.rollback(accepted)

    def _fill_row(self, bitmask: Any, row: int, phase: str) -> None:
        if phase == "reasoning":
            bitmask[row] = -1  # every bit: the model reasons unmasked
            return
        self.matcher.fill_next_token_bitmask(bitmask, row)
        if phase == "undecided":
            word, bit = divmod(self.start_id, 32)
            bitmask[row, word] |= bit_value(bit)

    def _advance(self, phase: str, token_id: int) -> tuple[str, bool]:
        """The phase after ``token_id`` (allowed) and whether the matcher took it."""
        if phase == "reasoning":
            return ("active" if token_id == self.end_id else "reasoning"), False
        if phase == "undecided" and token_id == self.start_id:
            return "reasoning", False
        self.matcher.accept_token(token_id)
        return "active", True

    def valid_drafts(self, drafts: list[int]) -> list[int]:
        """The longest prefix of ``drafts`` the grammar allows, through think
        blocks' markers as ``accept`` reads them (the matcher is left as it was)."""
        phase, kept, accepted = self.phase, 0, 0
        for token_id in drafts:
            entering_grammar = phase == "active" or (phase == "undecided" and token_id != self.start_id)
            if entering_grammar and (self.matcher.is_terminated() or not self.matcher.accept_token(token_id)):
                break
            if entering_grammar:
                phase, accepted = "active", accepted + 1
            else:
                phase, _ = self._advance(phase, token_id)
            kept += 1
        if accepted:
            self.matcher.rollback(accepted)
        return drafts[:kept]


def bit_value(bit: int) -> int:
    """``1 << bit`` as an int32 word holds it (bit 31 is the sign)."""
    return -(1 << 31) if bit == 31 else 1 << bit


def _first_phase(params: StructuredOutputsParams, prompt_token_ids: list[int]) -> str:
    """Inside a think block the prompt left open (or the template's implicit one), else undecided."""
    last_start = max((i for i, t in enumerate(prompt_token_ids) if t == params.reasoning_start_id), default=-1)
    last_end = max((i for i, t in enumerate(prompt_token_ids) if t == params.reasoning_end_id), default=-1)
    if last_start > last_end or (params.starts_in_reasoning and last_start == last_end == -1):
        return "reasoning"
    return "undecided"


class StructuredOutputManager:
    def __init__(self, compiler: GrammarCompiler) -> None:
        self.compiler = compiler
        self.awaiting: list[Request] = []
        self._bitmask: Any = None  # int32 [rows, words] on the host, grown on demand

    # ------------------------------------------------------------ requests

    def add(self, request: Request, params: StructuredOutputsParams) -> None:
        request.grammar = RequestGrammar(self.compiler.submit(params), params, request.prompt_token_ids)
        self.awaiting.append(request)

    def take_ready(self) -> tuple[list[Request], list[tuple[Request, str]]]:
        """Requests whose grammar is compiled (matchers started), and those whose failed (with why)."""
        ready, failed, still = [], [], []
        for request in self.awaiting:
            problem = self.compiler.check(request.grammar.job)
            if problem is not None:
                failed.append((request, problem))
            elif request.grammar.job.done():
                request.grammar.start()
                ready.append(request)
            else:
                still.append(request)
        self.awaiting = still
        return ready, failed

    def remove(self, request_ids: set[str]) -> list[Request]:
        removed = [r for r in self.awaiting if r.request_id in request_ids]
        self.awaiting = [r for r in self.awaiting if r.request_id not in request_ids]
        return removed

    def wait_for_any(self, timeout_s: float) -> None:
        """Block until a waiting grammar is done, at most ``timeout_s`` (an idle engine)."""
        if self.awaiting:
            wait([r.grammar.job.future for r in self.awaiting], timeout=timeout_s, return_when=FIRST_COMPLETED)

    # --------------------------------------------------------------- masks

    def bitmask(
        self, scheduler_output: SchedulerOutput, requests: dict[str, Request], counted: bool = False
    ) -> GrammarBitmask | None:
        """Masks for the constrained requests that sample in this step (None
        if there are none). ``counted``: the scheduler already counted the
        step's tokens as computed and its samples as placeholders (async
        scheduling)."""
        sampling, drafts = [], scheduler_output.spec_token_ids
        for request_id, num_tokens in scheduler_output.num_scheduled_tokens.items():
            request = requests[request_id]
            grammar = request.grammar
            num_drafts = len(drafts.get(request_id, ()))
            if counted:
                samples = request.num_output_placeholders > 0 and (
                    request.num_computed_tokens == request.num_tokens + request.num_output_placeholders - 1
                )
            else:
                samples = request.num_computed_tokens + num_tokens == request.num_tokens + num_drafts
            # A request inside a think block gets rows once its drafts are masked where they leave it.
            if grammar is not None and (grammar.constrains or num_drafts) and samples:
                sampling.append(request)
        if not sampling:
            return None
        # A drafting request has a row for each draft's place and one after them.
        row_counts = [1 + len(drafts.get(r.request_id, ())) for r in sampling]
        bitmask = self._rows(sum(row_counts))
        row = 0
        for request, count in zip(sampling, row_counts):
            request.grammar.fill(bitmask, row, drafts.get(request.request_id))
            row += count
        rows = bitmask[:row]
        return GrammarBitmask(
            [r.request_id for r in sampling], rows.numpy().tobytes(), rows.shape[1],
            row_counts if row != len(sampling) else None,
        )

    def _rows(self, num_rows: int) -> Any:
        if self._bitmask is None or self._bitmask.shape[0] < num_rows:
            import xgrammar as xgr

            capacity = max(num_rows, 2 * (self._bitmask.shape[0] if self._bitmask is not None else 8))
            self._bitmask = xgr.allocate_token_bitmask(capacity, self.compiler.vocab_size)
        return self._bitmask

    def shutdown(self) -> None:
        self.awaiting.clear()
        self.compiler.shutdown()
