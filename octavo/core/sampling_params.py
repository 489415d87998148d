"""How a request is sampled and when it stops (vLLM's ``SamplingParams``).

Validation happens in ``__post_init__`` so that an invalid value raises
:class:`~octavo.errors.InvalidSamplingParamsError` before any work is
scheduled. Greedy decoding is ``temperature == 0``.

Every integer must fit in a signed 64-bit integer and every float must be
finite: values travel as msgpack to engine processes and become tensors in
the sampler, and neither takes arbitrary Python numbers.
"""

from __future__ import annotations

import copy
import enum
import math
from dataclasses import dataclass, field

from octavo.core.bad_words import MAX_BAD_WORD_CHARS, MAX_BAD_WORDS, MAX_BAD_WORDS_TOKENS
from octavo.core.structured_output.params import StructuredOutputsParams
from octavo.errors import InvalidSamplingParamsError

# Below this temperature sampling is greedy (softmax would overflow anyway).
GREEDY_TEMPERATURE_EPS = 1e-5
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
_INT_FIELDS = ("n", "top_k", "min_tokens")
_FLOAT_FIELDS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")


class RequestOutputKind(enum.Enum):
    """What each streamed ``RequestOutput`` carries."""

    CUMULATIVE = 0  # all text and tokens so far
    DELTA = 1  # only what is new since the last output
    FINAL_ONLY = 2  # one output, when the request finishes


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1) disables top-k
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    detokenize: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # Constrain the output to a JSON schema, regex, choice or grammar.
    structured_outputs: StructuredOutputsParams | None = None
    # Added to these token ids' logits before sampling (OpenAI's logit_bias:
    # each in [-100, 100]; -100 all but bans a token, 100 all but forces it).
    logit_bias: dict[int, float] | None = None
    # Only these token ids may be sampled (vLLM's allowed_token_ids).
    allowed_token_ids: list[int] | None = None
    # Words the output must not contain (vLLM's bad_words). The engine sets
    # bad_words_token_ids from them with its tokenizer when the request is
    # added (``core/bad_words.py``); token sequences may also be given alone.
    bad_words: list[str] | None = None
    bad_words_token_ids: list[list[int]] | None = None
    # Keep only the prompt's last k tokens (vLLM's left truncation; -1: as many
    # as leave room for one new token). None: a prompt too long is an error.
    truncate_prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = _token_list("stop_token_ids", self.stop_token_ids) or []
        self.allowed_token_ids = _token_list("allowed_token_ids", self.allowed_token_ids)
        self.logit_bias = _bias_map(self.logit_bias)
        if isinstance(self.bad_words, str):
            self.bad_words = [self.bad_words]
        self.bad_words = _token_list("bad_words", self.bad_words, "strings") or None
        sequences = _token_list("bad_words_token_ids", self.bad_words_token_ids, "token id lists")
        self.bad_words_token_ids = [_token_list("bad_words_token_ids", ids) for ids in sequences] if sequences else None
        if self.top_k == -1:
            self.top_k = 0
        self._validate()
        if self.is_greedy:
            # Greedy decoding ignores the truncation knobs; normalise them so
            # that the sampler can batch greedy rows without special cases.
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE_EPS

    @property
    def needs_penalties(self) -> bool:
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )

    @property
    def has_logit_edits(self) -> bool:
        """A logit bias, an allowed-token list or bad words (``apply_logit_edits``)."""
        return (self.logit_bias is not None or self.allowed_token_ids is not None
                or self.bad_words is not None or self.bad_words_token_ids is not None)

    @property
    def edits_logits(self) -> bool:
        """Penalties or logit edits: the sampler changes the logits before it
        picks (never the plain greedy argmax)."""
        return self.needs_penalties or self.has_logit_edits

    def clone(self) -> "SamplingParams":
        return copy.deepcopy(self)

    def _validate(self) -> None:
        _check_representable(self)
        _check_ranges(self)
        _check_structured(self)


def _fail(param: str, message: str) -> None:
    raise InvalidSamplingParamsError(message, param=param)


def _shown(value) -> str:
    """``repr`` cut short: a 10,000-digit integer should not make a 10,000-character error."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...{text[-8:]}"


def _token_list(name: str, value, items: str = "token ids") -> list | None:
    """A list as given (tuples, ranges and the like copied), None kept; a
    string, a mapping or a single number is refused, not iterated."""
    if value is None:
        return None
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        _fail(name, f"{name} must be a list of {items}, got {_shown(value)}")
    return list(value)


def _bias_map(value) -> dict | None:
    if not value:
        return None
    if not hasattr(value, "items"):
        _fail("logit_bias", f"logit_bias must map token ids to biases, got {_shown(value)}")
    return dict(value.items())


def _check_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(name, f"{name} must be an integer, got {_shown(value)}")
    if not INT64_MIN <= value <= INT64_MAX:
        _fail(name, f"{name} must fit in a signed 64-bit integer, got {_shown(value)}")


def _check_float(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(name, f"{name} must be a number, got {_shown(value)}")
    if not math.isfinite(value):
        _fail(name, f"{name} must be a finite number, got {value}")


def _check_representable(p: SamplingParams) -> None:
    """Types, int64 range, finiteness: what any value must satisfy to travel and compute."""
    for name in _INT_FIELDS:
        _check_int(name, getattr(p, name))
    for name in ("max_tokens", "seed", "logprobs", "prompt_logprobs", "truncate_prompt_tokens"):
        if getattr(p, name) is not None:
            _check_int(name, getattr(p, name))
    for name in _FLOAT_FIELDS:
        _check_float(name, getattr(p, name))
    for token_id in p.stop_token_ids:
        _check_int("stop_token_ids", token_id)
    for stop in p.stop:
        if not isinstance(stop, str) or not stop:
            _fail("stop", f"stop strings must be non-empty strings, got {_shown(stop)}")
    for token_id, bias in (p.logit_bias or {}).items():
        if isinstance(token_id, bool) or not isinstance(token_id, int):
            _fail("logit_bias", f"logit_bias keys must be integer token ids, got {_shown(token_id)}")
        _check_int("logit_bias", token_id)
        _check_float("logit_bias", bias)
    for token_id in p.allowed_token_ids or ():
        _check_int("allowed_token_ids", token_id)
    for ids in p.bad_words_token_ids or ():
        for token_id in ids:
            _check_int("bad_words_token_ids", token_id)


def _check_ranges(p: SamplingParams) -> None:
    if p.n < 1:
        _fail("n", f"n must be at least 1, got {p.n}")
    if not p.temperature >= 0.0:
        _fail("temperature", f"temperature must be non-negative, got {p.temperature}")
    if not 0.0 < p.top_p <= 1.0:
        _fail("top_p", f"top_p must be in (0, 1], got {p.top_p}")
    if p.top_k < 0:
        _fail("top_k", f"top_k must be 0 or -1 (disabled) or at least 1, got {p.top_k}")
    if not 0.0 <= p.min_p <= 1.0:
        _fail("min_p", f"min_p must be in [0, 1], got {p.min_p}")
    if not -2.0 <= p.presence_penalty <= 2.0:
        _fail("presence_penalty", f"presence_penalty must be in [-2, 2], got {p.presence_penalty}")
    if not -2.0 <= p.frequency_penalty <= 2.0:
        _fail("frequency_penalty", f"frequency_penalty must be in [-2, 2], got {p.frequency_penalty}")
    if not p.repetition_penalty > 0.0:
        _fail("repetition_penalty", f"repetition_penalty must be positive, got {p.repetition_penalty}")
    if p.max_tokens is not None and p.max_tokens < 1:
        _fail("max_tokens", f"max_tokens must be at least 1, got {p.max_tokens}")
    if p.min_tokens < 0:
        _fail("min_tokens", f"min_tokens must be non-negative, got {p.min_tokens}")
    if p.max_tokens is not None and p.min_tokens > p.max_tokens:
        _fail("min_tokens", f"min_tokens ({p.min_tokens}) must not exceed max_tokens ({p.max_tokens})")
    for name in ("logprobs", "prompt_logprobs"):
        value = getattr(p, name)
        if value is not None and value < 0:
            _fail(name, f"{name} must be a non-negative integer, got {value}")
    for name in ("stop_token_ids", "allowed_token_ids"):
        if any(token_id < 0 for token_id in getattr(p, name) or ()):
            _fail(name, f"{name} must be non-negative integers, got {min(getattr(p, name))}")
    _check_logit_bias(p)
    _check_bad_words(p)
    if p.truncate_prompt_tokens is not None and p.truncate_prompt_tokens < 1 and p.truncate_prompt_tokens != -1:
        _fail("truncate_prompt_tokens", f"truncate_prompt_tokens must be -1 or at least 1, got {p.truncate_prompt_tokens}")


def _check_bad_words(p: SamplingParams) -> None:
    words = p.bad_words or []
    if len(words) > MAX_BAD_WORDS:
        _fail("bad_words", f"{len(words)} bad words exceed the maximum of {MAX_BAD_WORDS}")
    for word in words:
        if not isinstance(word, str) or not word.strip() or len(word) > MAX_BAD_WORD_CHARS:
            _fail("bad_words", f"bad words must be non-blank strings of at most {MAX_BAD_WORD_CHARS} characters, "
                               f"got {_shown(word)}")
    sequences = p.bad_words_token_ids or []
    if len(sequences) > 2 * MAX_BAD_WORDS:
        _fail("bad_words_token_ids", f"{len(sequences)} token sequences exceed the maximum of {2 * MAX_BAD_WORDS}")
    for ids in sequences:
        if not ids or min(ids) < 0:
            _fail("bad_words_token_ids", f"bad_words_token_ids must be non-empty lists of token ids, got {_shown(ids)}")
    # The sampler compares every sequence with the output's tail at every step.
    if sum(len(ids) for ids in sequences) > MAX_BAD_WORDS_TOKENS:
        _fail("bad_words", f"the bad words come to more than {MAX_BAD_WORDS_TOKENS} tokens")


def _check_logit_bias(p: SamplingParams) -> None:
    if p.allowed_token_ids is not None and not p.allowed_token_ids:
        _fail("allowed_token_ids", "allowed_token_ids must name at least one token")
    for token_id, bias in (p.logit_bias or {}).items():
        if token_id < 0:
            _fail("logit_bias", f"logit_bias keys must be non-negative token ids, got {token_id}")
        if not -100.0 <= bias <= 100.0:
            _fail("logit_bias", f"logit_bias values must be in [-100, 100], got {bias} for token {token_id}")


def _check_structured(p: SamplingParams) -> None:
    if p.structured_outputs is None:
        return
    if not isinstance(p.structured_outputs, StructuredOutputsParams):
        _fail("structured_outputs", "structured_outputs must be a StructuredOutputsParams (or a dict of its fields)")
    if p.min_tokens:
        # The grammar ends the output when it is complete; it cannot also be held open.
        _fail("min_tokens", "min_tokens cannot be combined with structured outputs")
