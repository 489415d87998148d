"""How a request is sampled and when it stops (vLLM's ``SamplingParams``).

Validation happens in ``__post_init__`` so that an invalid value raises
:class:`~octavo.errors.InvalidSamplingParamsError` before any work is
scheduled. Greedy decoding is ``temperature == 0``.
"""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass, field

from octavo.errors import InvalidSamplingParamsError

# Below this temperature sampling is greedy (softmax would overflow anyway).
GREEDY_TEMPERATURE_EPS = 1e-5


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

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
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

    def clone(self) -> "SamplingParams":
        return copy.deepcopy(self)

    def _validate(self) -> None:
        def fail(param: str, message: str) -> None:
            raise InvalidSamplingParamsError(message, param=param)

        checks_int = {
            "n": self.n,
            "top_k": self.top_k,
            "min_tokens": self.min_tokens,
        }
        for name, value in checks_int.items():
            if isinstance(value, bool) or not isinstance(value, int):
                fail(name, f"{name} must be an integer, got {value!r}")
        if self.n < 1:
            fail("n", f"n must be at least 1, got {self.n}")
        if not self.temperature >= 0.0:  # also rejects NaN
            fail("temperature", f"temperature must be non-negative, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            fail("top_p", f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            fail("top_k", f"top_k must be 0 or -1 (disabled) or at least 1, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            fail("min_p", f"min_p must be in [0, 1], got {self.min_p}")
        if not -2.0 <= self.presence_penalty <= 2.0:
            fail("presence_penalty", f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            fail("frequency_penalty", f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        if not self.repetition_penalty > 0.0:
            fail("repetition_penalty", f"repetition_penalty must be positive, got {self.repetition_penalty}")
        if self.max_tokens is not None:
            if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
                fail("max_tokens", f"max_tokens must be an integer, got {self.max_tokens!r}")
            if self.max_tokens < 1:
                fail("max_tokens", f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.min_tokens < 0:
            fail("min_tokens", f"min_tokens must be non-negative, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            fail("min_tokens", f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                fail(name, f"{name} must be a non-negative integer, got {value!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            fail("seed", f"seed must be an integer, got {self.seed!r}")
        for stop in self.stop:
            if not isinstance(stop, str) or not stop:
                fail("stop", f"stop strings must be non-empty strings, got {stop!r}")
        for token_id in self.stop_token_ids:
            if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
                fail("stop_token_ids", f"stop_token_ids must be non-negative integers, got {token_id!r}")
