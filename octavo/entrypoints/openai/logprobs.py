"""Logprobs in the two OpenAI shapes.

Completions use the legacy shape (parallel lists ``tokens``,
``token_logprobs``, ``top_logprobs``, ``text_offset``; ``top_logprobs`` holds
the top-k and the chosen token, as OpenAI documents it). Chat uses
``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}`` with
exactly the top-k. Both stream: an accumulator takes each new slice of tokens.
With ``as_ids`` (vLLM's ``return_tokens_as_token_ids``) every token is written
``token_id:<id>``, so a client gets the exact ids even where a token's text is
not a whole character.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from octavo.core.outputs import Logprob

LogprobEntry = dict[int, Logprob] | None


def token_text(tokenizer: Any, token_id: int, entry: LogprobEntry, as_ids: bool = False) -> str:
    if as_ids:
        return f"token_id:{token_id}"
    logprob = entry.get(token_id) if entry else None
    if logprob is not None and logprob.decoded_token is not None:
        return logprob.decoded_token
    return tokenizer.decode([token_id]) if tokenizer is not None else ""


def top_k(entry: LogprobEntry, k: int) -> list[tuple[int, Logprob]]:
    """The entry's k most likely tokens, most likely first."""
    if not entry or k <= 0:
        return []
    ranked = [(token_id, lp) for token_id, lp in entry.items() if lp.rank is not None and lp.rank <= k]
    return sorted(ranked, key=lambda item: item[1].rank)


@dataclass
class LegacyLogprobs:
    """Accumulates the completions-API logprobs of one choice."""

    tokenizer: Any
    num_top: int
    as_ids: bool = False
    text_offset_start: int = 0
    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = field(default_factory=list)
    text_offset: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._offset = self.text_offset_start

    def extend(self, token_ids: list[int], entries: list[LogprobEntry]) -> None:
        for token_id, entry in zip(token_ids, entries):
            text = token_text(self.tokenizer, token_id, entry, self.as_ids)
            self.tokens.append(text)
            chosen = entry.get(token_id) if entry else None
            self.token_logprobs.append(chosen.logprob if chosen is not None else None)
            if entry is None:
                self.top_logprobs.append(None)
            else:
                top = {token_text(self.tokenizer, t, entry, self.as_ids): lp.logprob
                       for t, lp in top_k(entry, self.num_top)}
                if chosen is not None:
                    top.setdefault(text, chosen.logprob)
                self.top_logprobs.append(top)
            self.text_offset.append(self._offset)
            self._offset += len(text)

    def to_dict(self) -> dict:
        return {
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs,
            "text_offset": self.text_offset,
        }

    def take(self) -> dict:
        """What was added since the last ``take`` (for stream chunks)."""
        chunk = self.to_dict()
        self.tokens, self.token_logprobs, self.top_logprobs, self.text_offset = [], [], [], []
        return chunk


def prompt_logprobs_json(
    tokenizer: Any, prompt_token_ids: list[int], entries: list[LogprobEntry] | None, num_top: int, as_ids: bool = False
) -> list:
    """vLLM's ``prompt_logprobs`` answer: per prompt position (the first has none),
    ``{token id: {logprob, rank, decoded_token}}`` for the prompt token and the top
    ``num_top`` (the engine may have computed more, for echo's logprobs)."""
    return [
        None if entry is None else {
            str(token_id): {"logprob": lp.logprob, "rank": lp.rank,
                            "decoded_token": token_text(tokenizer, token_id, entry, as_ids)}
            for token_id, lp in entry.items()
            if token_id == prompt_id or (lp.rank is not None and lp.rank <= num_top)
        }
        for prompt_id, entry in zip(prompt_token_ids, entries or [])
    ]


def chat_logprobs(
    tokenizer: Any, token_ids: list[int], entries: list[LogprobEntry], num_top: int, as_ids: bool = False
) -> list[dict]:
    content = []
    for token_id, entry in zip(token_ids, entries):
        text = token_text(tokenizer, token_id, entry, as_ids)
        chosen = entry.get(token_id) if entry else None
        content.append(
            {
                "token": text,
                "logprob": chosen.logprob if chosen is not None else -9999.0,
                "bytes": list(text.encode("utf-8")),
                "top_logprobs": [
                    {"token": (t := token_text(tokenizer, tid, entry, as_ids)), "logprob": lp.logprob, "bytes": list(t.encode("utf-8"))}
                    for tid, lp in top_k(entry, num_top)
                ],
            }
        )
    return content
