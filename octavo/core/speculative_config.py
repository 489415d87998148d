"""Speculative decoding's options (vLLM's ``speculative_config``) and which
requests may speculate.

Each step, a request that decodes may carry up to ``num_speculative_tokens``
draft tokens guessed by a proposer; the runner computes them beside the
request's next token in one step and keeps the longest prefix the target
model agrees with (``runtime/spec_verify.py``), plus one token of its own.
Two proposers:

- ``method: "ngram"`` (prompt lookup, ``core/ngram_proposer.py``): no second
  model, drafts copied from earlier in the request's own tokens; proposed by
  the scheduler.
- ``method: "draft_model"`` (``model``: a smaller checkpoint with the same
  vocabulary): the workers run the draft model beside the target and return
  its greedy guesses for the next step (``runtime/draft_model.py``).
- ``method: "mtp"`` (vLLM's ``deepseek_mtp``, ``glm4_moe_mtp`` too): the
  multi-token-prediction layer DeepSeek V3 and GLM-4.5 checkpoints carry,
  read from the target's own checkpoint (``model`` defaults to it).
- ``method: "eagle"`` (``model``: an EAGLE-1 or HASS head), likewise.
- ``method: "eagle3"`` (``model``: an EAGLE-3 head trained for the target):
  the same, the head reading the target's hidden states
  (``runtime/eagle_proposer.py``). A ``speculators``-format EAGLE-3
  checkpoint given as ``model`` without a method is one too
  (``engine_args.resolve_model_files`` reads its config).

Which requests speculate: greedy ones, and random ones without a seed (a
seeded request keeps the exact tokens it has without speculation), with or
without logprobs, under a structured-output grammar or not (drafts stop
where the grammar would refuse one, and each drafted place is masked as
the grammar stands there), with any logit edits (penalties, biases,
allowed tokens, bad words, ``min_tokens``: each drafted place sees the
tokens before it, drafts included), inside a reasoning model's think block
or not (drafts move through its markers). Seeded requests decode one token
a step as before, in the same batches. Speculation never changes what a
greedy request generates, and for a random one it keeps the distribution
(rejection sampling against the proposers' greedy, one-hot, guesses), only
the draws differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from octavo.errors import InvalidArgumentError

# Keys of vLLM's speculative_config that Octavo reads; any other is refused by name.
_KNOWN_KEYS = {
    "method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "disable_by_batch_size", "model",
    "draft_tensor_parallel_size",
}
_METHODS = ("ngram", "draft_model", "eagle", "eagle3", "mtp")
# Methods run by the workers with a second set of weights (``model``).
_MODEL_METHODS = ("draft_model", "eagle", "eagle3", "mtp")
# vLLM's names for the MTP layers of particular families.
_MTP_ALIASES = {"deepseek_mtp", "glm4_moe_mtp"}
# vLLM's other methods: refused by name, not ignored.
_UNSUPPORTED_METHODS = {"medusa", "mlp_speculator", "suffix"}


def is_mtp_method(method: Any) -> bool:
    """Whether ``method`` (as a user wrote it) names the target's own MTP layers."""
    return method == "mtp" or method in _MTP_ALIASES


@dataclass(frozen=True)
class SpeculativeConfig:
    num_speculative_tokens: int
    method: str = "ngram"
    # The n-gram lengths tried, longest first (vLLM's names and defaults).
    prompt_lookup_min: int = 5
    prompt_lookup_max: int = 5
    # No drafts while this many requests or more are running (None: always draft).
    disable_by_batch_size: int | None = None
    # The model methods' checkpoint (a directory or Hub id; MTP: the target's own) and
    # its tensor-parallel size (None: the target's; only the target's is supported).
    model: str | None = None
    draft_tensor_parallel_size: int | None = None

    @property
    def uses_draft_model(self) -> bool:
        """Whether the workers run a second set of weights that guesses (a draft model, an EAGLE head, MTP layers)."""
        return self.method in _MODEL_METHODS

    @classmethod
    def from_dict(cls, value: dict[str, Any] | SpeculativeConfig | None) -> SpeculativeConfig | None:
        """vLLM's ``speculative_config`` dict, checked; None stays None."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if not isinstance(value, dict):
            raise _bad(f"speculative_config must be a JSON object, got {type(value).__name__}")
        unknown = sorted(set(value) - _KNOWN_KEYS)
        if unknown:
            raise _bad(f"speculative_config has unknown keys {unknown}; supported: {sorted(_KNOWN_KEYS)}")
        model = value.get("model")
        method = value.get("method") or ("draft_model" if model is not None else "ngram")
        if method == "[ngram]":
            method = "ngram"
        if is_mtp_method(method):
            method = "mtp"
        if method in _UNSUPPORTED_METHODS:
            raise _bad(f"speculative method {method!r} is not supported; the supported methods are {list(_METHODS)}")
        if method not in _METHODS:
            raise _bad(f"unknown speculative method {method!r}; the supported methods are {list(_METHODS)}")
        num_tokens = _positive_int(value, "num_speculative_tokens", required=True)
        disable_by_batch_size = _positive_int(value, "disable_by_batch_size")
        if method in _MODEL_METHODS:
            return cls._draft_model(value, method, model, num_tokens, disable_by_batch_size)
        if model is not None:
            raise _bad(f"speculative_config 'model' is for methods {list(_MODEL_METHODS)}, not 'ngram'")
        lookup_min = _positive_int(value, "prompt_lookup_min")
        lookup_max = _positive_int(value, "prompt_lookup_max")
        if lookup_min is None and lookup_max is None:
            lookup_min = lookup_max = 5
        lookup_min = lookup_min if lookup_min is not None else lookup_max
        lookup_max = lookup_max if lookup_max is not None else lookup_min
        if lookup_min > lookup_max:
            raise _bad(f"prompt_lookup_min ({lookup_min}) must not exceed prompt_lookup_max ({lookup_max})")
        return cls(num_tokens, method, lookup_min, lookup_max, disable_by_batch_size)

    @classmethod
    def _draft_model(cls, value: dict[str, Any], method: str, model, num_tokens: int, disable_by_batch_size):
        if method == "mtp" and model is None:
            pass  # the target's own checkpoint (engine_args.resolve_model_files puts its path here)
        elif not isinstance(model, str) or not model:
            raise _bad(f"speculative method {method!r} needs 'model': the draft checkpoint's directory or Hub id")
        lookup = sorted(k for k in ("prompt_lookup_min", "prompt_lookup_max") if k in value)
        if lookup:
            raise _bad(f"speculative_config {lookup} are for method 'ngram', not {method!r}")
        draft_tp = _positive_int(value, "draft_tensor_parallel_size")
        return cls(num_tokens, method, disable_by_batch_size=disable_by_batch_size, model=model,
                   draft_tensor_parallel_size=draft_tp)


def _positive_int(value: dict[str, Any], key: str, required: bool = False) -> int | None:
    item = value.get(key)
    if item is None:
        if required:
            raise _bad(f"speculative_config needs {key!r}")
        return None
    if isinstance(item, bool) or not isinstance(item, int) or item < 1:
        raise _bad(f"speculative_config {key!r} must be a positive integer, got {item!r}")
    return item


def _bad(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(message, param="speculative_config")


def may_speculate(request) -> bool:
    """Whether ``request`` (a scheduler ``Request``) may carry drafts this step
    (the module docstring says which do and why)."""
    params = request.sampling_params
    return (
        request.pooling_params is None
        and (params.is_greedy or params.seed is None)
    )

