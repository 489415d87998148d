"""N-gram prompt lookup: draft tokens copied from earlier in the request.

The last ``n`` tokens of a request (``n`` from ``prompt_lookup_max`` down to
``prompt_lookup_min``, the first length that matches wins) are looked for
earlier in its tokens, prompt and output alike; the tokens that followed the
most recent earlier occurrence are the drafts. Code edits, quoting a
document, repeated structure (JSON keys, tables) are where this guesses well.

Each request's tokens are kept in a growing numpy array, extended by the
tokens added since its last proposal, so a step costs the vectorised
search, not a copy of the whole context.
"""

from __future__ import annotations

import numpy as np


class _TokenArray:
    __slots__ = ("data", "size")

    def __init__(self) -> None:
        self.data = np.empty(256, dtype=np.int64)
        self.size = 0

    def sync(self, token_ids: list[int]) -> np.ndarray:
        """The array holding ``token_ids`` (which only ever grow)."""
        total = len(token_ids)
        if total < self.size:  # not the same request's tokens: start again
            self.size = 0
        if total > self.data.shape[0]:
            grown = np.empty(max(total, 2 * self.data.shape[0]), dtype=np.int64)
            grown[: self.size] = self.data[: self.size]
            self.data = grown
        if total > self.size:
            self.data[self.size : total] = token_ids[self.size :]
            self.size = total
        return self.data[:total]


def find_drafts(tokens: np.ndarray, min_n: int, max_n: int, num_drafts: int) -> list[int]:
    """Up to ``num_drafts`` tokens that followed the latest earlier occurrence
    of ``tokens``' longest matching suffix of ``min_n``..``max_n`` tokens."""
    total = len(tokens)
    if num_drafts < 1 or total <= min_n:
        return []
    last = tokens[-1]
    # Candidate ends: earlier positions holding the last token (not the last itself).
    ends = np.flatnonzero(tokens[: total - 1] == last)
    if ends.size == 0:
        return []
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        candidates = ends[ends >= n - 1]
        if candidates.size == 0:
            continue
        matched = np.ones(candidates.size, dtype=bool)
        for offset in range(1, n):
            matched &= tokens[candidates - offset] == tokens[total - 1 - offset]
        hits = candidates[matched]
        if hits.size:
            start = int(hits[-1]) + 1
            return tokens[start : start + num_drafts].tolist()
    return []


class NgramProposer:
    def __init__(self, min_n: int, max_n: int, num_speculative_tokens: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.num_speculative_tokens = num_speculative_tokens
        self._arrays: dict[str, _TokenArray] = {}

    def propose(self, request_id: str, token_ids: list[int], max_drafts: int) -> list[int]:
        """Drafts for the request whose tokens so far are ``token_ids``:
        at most ``min(num_speculative_tokens, max_drafts)``."""
        num_drafts = min(self.num_speculative_tokens, max_drafts)
        if num_drafts < 1:
            return []
        array = self._arrays.get(request_id)
        if array is None:
            array = self._arrays[request_id] = _TokenArray()
        return find_drafts(array.sync(token_ids), self.min_n, self.max_n, num_drafts)

    def forget(self, request_id: str) -> None:
        """The request left the scheduler: drop its array."""
        self._arrays.pop(request_id, None)
