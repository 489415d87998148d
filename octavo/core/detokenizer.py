"""Incremental detokenization and stop strings.

Invariants: the text handed out never ends in a broken UTF-8 character (a
token that completes only part of a character is held until the character is
whole), and in streaming it never includes the first characters of a stop
string that may still be completed by the next token (they are held back
until the match is ruled out).
"""

from __future__ import annotations

from typing import Any

from octavo.core.sampling_params import SamplingParams
from octavo.core.tokenizer import fast_backend

_REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.tokenizer = tokenizer
        self.params = params
        self.output_text = ""
        self.token_ids: list[int] = []
        self._stop_buffer = max((len(s) for s in params.stop), default=1) - 1
        self._num_sent_chars = 0
        self._backend = fast_backend(tokenizer)
        self._stream = None
        if self._backend is not None:
            from tokenizers.decoders import DecodeStream

            self._stream = self._seeded_stream(DecodeStream, list(prompt_token_ids[-8:]))
        self._slow_text = ""

    def _seeded_stream(self, decode_stream: Any, context: list[int]) -> Any:
        """A decode stream that has seen the prompt's tail.

        Seeding with the prompt's tail gives the right leading space for
        SentencePiece tokenizers; a few tokens of context suffice. A prompt
        that ends inside a character (byte-fallback tokens) must not seed
        the stream with that broken character: the stream would then hand
        out the whole seed again once the character completes. Those tokens
        (at most 3: a character is at most 4 bytes) are stepped through
        instead, so the completed character opens the output."""
        skip = self.params.skip_special_tokens
        held: list[int] = []
        while context and len(held) < 3 and self._backend.decode(context, skip_special_tokens=skip).endswith(_REPLACEMENT_CHAR):
            held.insert(0, context.pop())
        try:
            stream = decode_stream(context, skip_special_tokens=skip)
        except TypeError:  # older tokenizers without prefill support
            return decode_stream(skip_special_tokens=skip)
        for token_id in held:
            stream.step(self._backend, token_id)  # prompt text: handed out by no one
        return stream

    def update(self, new_token_ids: list[int], check_stop: bool) -> str | None:
        """Append tokens; return the stop string that matched, if one did."""
        for token_id in new_token_ids:
            self.token_ids.append(token_id)
            start = len(self.output_text)
            self.output_text += self._decode_next(token_id)
            if check_stop and self.params.stop:
                stop = self._find_stop(start)
                if stop is not None:
                    return stop
        return None

    def _decode_next(self, token_id: int) -> str:
        if self._stream is not None:
            try:
                return self._stream.step(self._backend, token_id) or ""
            except Exception:
                # Unknown ids (beyond the tokenizer's vocabulary) decode to nothing.
                return ""
        # Slow path: decode everything again and hand out the stable suffix.
        text = self.tokenizer.decode(self.token_ids, skip_special_tokens=self.params.skip_special_tokens)
        if text.endswith(_REPLACEMENT_CHAR):
            return ""
        new_text = text[len(self._slow_text) :]
        self._slow_text = text
        return new_text

    def _find_stop(self, new_text_start: int) -> str | None:
        for stop in self.params.stop:
            search_from = max(0, new_text_start - len(stop) + 1)
            index = self.output_text.find(stop, search_from)
            if index != -1:
                end = index + len(stop) if self.params.include_stop_str_in_output else index
                self.output_text = self.output_text[:end]
                return stop
        return None

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        """The text to hand out now: all of it, or what is new since last time."""
        length = len(self.output_text)
        if not finished and self._stop_buffer:
            length = max(self._num_sent_chars, length - self._stop_buffer)
        if not delta:
            return self.output_text[:length]
        chunk = self.output_text[self._num_sent_chars : length]
        self._num_sent_chars = length
        return chunk
