"""Stored responses (``store: true``, the default): what ``previous_response_id``
continues, ``GET /v1/responses/{id}`` returns and ``DELETE`` removes.

In the API process's memory, bounded by a count and by the size of the
stored JSON; the least recently used go first. A chain is kept as links
(each response holds its own input items and output, and the id of the one
before it), so continuing a conversation replays the links in order; a link
that was evicted or deleted breaks the chain, and the request that needs it
gets a 404 naming it. Nothing survives a restart, and with several API
processes (``--api-server-count``) nothing is stored: a later request could
reach another process.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass

from octavo.errors import OctavoError, PromptTooLongError


class ResponseNotFoundError(OctavoError):
    """The response id is unknown: never stored, evicted, or deleted."""

    http_status = 404


@dataclass
class StoredResponse:
    response: dict  # the response object, as answered
    input_items: list[dict]  # this request's input (instructions excluded: they are not carried over)
    num_bytes: int
    num_chars: int  # the characters of every string in its items: a bound on the text it replays


def string_chars(value: object) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(string_chars(v) for v in value.values())
    if isinstance(value, list):
        return sum(string_chars(v) for v in value)
    return 0


class ResponseStore:
    def __init__(self, max_entries: int, max_bytes: int, why_off: str = "--max-stored-responses 0") -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.why_off = why_off  # said in the 400 of a request that needs the store while it is off
        self.entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self.num_bytes = 0

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0 and self.max_bytes > 0

    def put(self, response: dict, input_items: list[dict]) -> bool:
        """Keep ``response``; False when it alone is larger than the store."""
        num_bytes = len(json.dumps(response)) + len(json.dumps(input_items))
        if not self.enabled or num_bytes > self.max_bytes:
            return False
        self.delete(response["id"])
        num_chars = string_chars(input_items) + string_chars(response["output"])
        self.entries[response["id"]] = StoredResponse(response, input_items, num_bytes, num_chars)
        self.num_bytes += num_bytes
        while len(self.entries) > self.max_entries or self.num_bytes > self.max_bytes:
            _, evicted = self.entries.popitem(last=False)
            self.num_bytes -= evicted.num_bytes
        return True

    def get(self, response_id: str, param: str = "response_id") -> StoredResponse:
        entry = self.entries.get(response_id)
        if entry is None:
            raise ResponseNotFoundError(
                f"no stored response {response_id!r} (never stored, deleted, or evicted: this server keeps "
                f"the {self.max_entries} most recently used)",
                param=param,
            )
        self.entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        entry = self.entries.pop(response_id, None)
        if entry is None:
            return False
        self.num_bytes -= entry.num_bytes
        return True

    def history(self, previous_response_id: str, max_chars: int | None = None) -> list[dict]:
        """The items of the chain that ends at ``previous_response_id``, oldest first: each
        response's input items, then its output. A chain whose strings alone are longer than
        ``max_chars`` is refused before it is assembled (it could never fit the context)."""
        chain: list[StoredResponse] = []
        response_id: str | None = previous_response_id
        num_chars = 0
        while response_id is not None:
            entry = self.get(response_id, param="previous_response_id")
            chain.append(entry)
            num_chars += entry.num_chars
            if max_chars is not None and num_chars > max_chars:
                raise PromptTooLongError(
                    f"the conversation of previous_response_id holds more than {max_chars} characters, "
                    f"more than can fit the context", param="previous_response_id",
                )
            response_id = entry.response.get("previous_response_id")
            if len(chain) > len(self.entries):  # cannot happen (ids are new), but never loop
                break
        items: list[dict] = []
        for entry in reversed(chain):
            items.extend(entry.input_items)
            items.extend(entry.response["output"])
        return items
