"""Beam search over the engine, as vLLM does it: each step extends every live
beam by one token with a plain one-token request (the prefix cache holds the
beams' shared prefixes), ranks the candidates, and keeps the best.

A step asks for each beam's ``2 * beam_width`` most likely next tokens (the
model's log-probabilities, before any sampling setting). A candidate that
ends with an end-of-sequence token is finished (unless ``ignore_eos``) and
leaves the search; the others are ranked and the best ``beam_width`` go on.
After ``max_tokens`` steps (or once no beam is left) the finished and live
beams together are ranked and the best ``beam_width`` returned, best first.

Rank: ``cum_logprob / length ** length_penalty``, where ``length`` counts the
prompt and the generated tokens without a final EOS (vLLM's rule, so that
results agree with it). The search drives any engine through ``run_step``:
``LLM.beam_search`` steps the offline engine, the servers the async one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from octavo.core.outputs import CompletionOutput, Logprob, RequestOutput
from octavo.core.sampling_params import RequestOutputKind, SamplingParams
from octavo.errors import InvalidArgumentError


@dataclass
class BeamSearchParams:
    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    # Beams are ranked by the model's log-probabilities; only 0 (vLLM's default) is accepted.
    temperature: float = 0.0
    length_penalty: float = 1.0

    def __post_init__(self) -> None:
        for name in ("beam_width", "max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}", param=name)
        if self.temperature != 0:
            raise InvalidArgumentError(
                "beam search ranks beams by the model's log-probabilities, which temperature does not change: "
                f"it must be 0, got {self.temperature!r}", param="temperature",
            )
        if not isinstance(self.length_penalty, (int, float)) or not math.isfinite(self.length_penalty):
            raise InvalidArgumentError(f"length_penalty must be a finite number, got {self.length_penalty!r}",
                                       param="length_penalty")

    def check_limits(self, max_logprobs: int) -> None:
        """A step asks for ``2 * beam_width`` logprobs, within the engine's ``max_logprobs``."""
        if 2 * self.beam_width > max_logprobs:
            raise InvalidArgumentError(
                f"beam_width {self.beam_width} needs {2 * self.beam_width} logprobs a step; this engine allows "
                f"{max_logprobs} (--max-logprobs)", param="beam_width",
            )


@dataclass
class BeamSearchSequence:
    tokens: list[int]  # the prompt's and the generated ones (vLLM's convention)
    num_prompt_tokens: int
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)  # one per generated token
    cum_logprob: float = 0.0
    finish_reason: str | None = None  # "stop" (an EOS), "length"
    text: str | None = None  # the generated text (the prompt's is not repeated)

    @property
    def output_token_ids(self) -> list[int]:
        return self.tokens[self.num_prompt_tokens:]


@dataclass
class BeamSearchOutput:
    sequences: list[BeamSearchSequence]  # best first


def beam_score(beam: BeamSearchSequence, eos_token_ids: frozenset[int], length_penalty: float) -> float:
    length = len(beam.tokens) - (1 if beam.tokens[-1] in eos_token_ids else 0)
    return beam.cum_logprob / (length ** length_penalty)


class BeamSearch:
    """One prompt's search: ``prompts()`` to run, ``advance()`` with their outputs, until ``done``."""

    def __init__(self, prompt_token_ids: list[int], params: BeamSearchParams, eos_token_ids: frozenset[int]) -> None:
        self.params = params
        self.eos_token_ids = eos_token_ids
        self.beams = [BeamSearchSequence(list(prompt_token_ids), len(prompt_token_ids))]
        self.finished: list[BeamSearchSequence] = []
        self.num_steps = 0

    @property
    def done(self) -> bool:
        return not self.beams or self.num_steps >= self.params.max_tokens

    def step_params(self) -> SamplingParams:
        return SamplingParams(max_tokens=1, temperature=0.0, logprobs=2 * self.params.beam_width, ignore_eos=True,
                              skip_special_tokens=False, output_kind=RequestOutputKind.FINAL_ONLY)

    def prompts(self) -> list[list[int]]:
        return [beam.tokens for beam in self.beams]

    def advance(self, completions: list[CompletionOutput]) -> None:
        """Extend each beam by its candidates (the logprobs of its one-token request)."""
        candidates: list[BeamSearchSequence] = []
        for beam, completion in zip(self.beams, completions):
            entry = (completion.logprobs or [{}])[0]
            for token_id, logprob in entry.items():
                extended = BeamSearchSequence(beam.tokens + [token_id], beam.num_prompt_tokens,
                                              beam.logprobs + [entry], beam.cum_logprob + logprob.logprob)
                if token_id in self.eos_token_ids and not self.params.ignore_eos:
                    extended.finish_reason = "stop"
                    self.finished.append(extended)
                else:
                    candidates.append(extended)
        self.num_steps += 1
        self.beams = self._ranked(candidates)[: self.params.beam_width]

    def result(self, decode: Callable[[list[int]], str] | None) -> BeamSearchOutput:
        for beam in self.beams:
            beam.finish_reason = "length"
        best = self._ranked(self.finished + self.beams)[: self.params.beam_width]
        for beam in best:
            beam.text = decode(beam.output_token_ids) if decode is not None else None
        return BeamSearchOutput(best)

    def _ranked(self, beams: list[BeamSearchSequence]) -> list[BeamSearchSequence]:
        return sorted(beams, key=lambda b: beam_score(b, self.eos_token_ids, self.params.length_penalty), reverse=True)


def as_request_output(request_id: str, prompt_token_ids: list[int], output: BeamSearchOutput) -> RequestOutput:
    """The servers' shape: one completion per returned beam, best first."""
    completions = [
        CompletionOutput(index, beam.text or "", beam.output_token_ids, beam.cum_logprob, beam.logprobs,
                         beam.finish_reason)
        for index, beam in enumerate(output.sequences)
    ]
    return RequestOutput(request_id, None, list(prompt_token_ids), completions, finished=True)
