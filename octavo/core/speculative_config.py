"""Speculative decoding's options (vLLM's ``speculative_config``) and which
requests may speculate.

Each step, a request that decodes may carry up to ``num_speculative_tokens``
draft tokens guessed by a proposer; the runner computes them beside the
request's next token in one step and keeps the longest prefix the target
model agrees with (``runtime/spec_verify.py``), plus one token of its own.
The proposer here is n-gram prompt lookup (``method: "ngram"``,
``core/ngram_proposer.py``): no second model, drafts copied from earlier in
the request's own tokens.

Which requests speculate: greedy ones, and random ones without a seed (a
seeded request keeps the exact tokens it has without speculation); never
ones that ask for logprobs, edit logits (penalties, biases, allowed tokens,
bad words), are under ``min_tokens`` or a grammar. Others decode one token a
step as before, in the same batches: speculation never changes what a
greedy request generates, and for a random one it keeps the distribution
(rejection sampling), only the draws differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from octavo.errors import InvalidArgumentError

# Keys of vLLM's speculative_config that Octavo reads; any other is refused by name.
_KNOWN_KEYS = {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "disable_by_batch_size"}
# vLLM's methods that need a second model or trained heads: refused by name, not ignored.
_MODEL_METHODS = {"eagle", "eagle3", "medusa", "mlp_speculator", "draft_model", "mtp", "deepseek_mtp", "suffix"}


@dataclass(frozen=True)
class SpeculativeConfig:
    num_speculative_tokens: int
    method: str = "ngram"
    # The n-gram lengths tried, longest first (vLLM's names and defaults).
    prompt_lookup_min: int = 5
    prompt_lookup_max: int = 5
    # No drafts while this many requests or more are running (None: always draft).
    disable_by_batch_size: int | None = None

    @classmethod
    def from_dict(cls, value: dict[str, Any] | SpeculativeConfig | None) -> SpeculativeConfig | None:
        """vLLM's ``speculative_config`` dict, checked; None stays None."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if not isinstance(value, dict):
            raise _bad(f"speculative_config must be a JSON object, got {type(value).__name__}")
        unknown = sorted(set(value) - _KNOWN_KEYS)
        if "model" in unknown:
            raise _bad("speculative_config 'model' (a draft model) is not supported; use method 'ngram'")
        if unknown:
            raise _bad(f"speculative_config has unknown keys {unknown}; supported: {sorted(_KNOWN_KEYS)}")
        method = value.get("method", "ngram")
        if method == "[ngram]":
            method = "ngram"
        if method in _MODEL_METHODS:
            raise _bad(f"speculative method {method!r} is not supported; the supported method is 'ngram'")
        if method != "ngram":
            raise _bad(f"unknown speculative method {method!r}; the supported method is 'ngram'")
        num_tokens = _positive_int(value, "num_speculative_tokens", required=True)
        lookup_min = _positive_int(value, "prompt_lookup_min")
        lookup_max = _positive_int(value, "prompt_lookup_max")
        if lookup_min is None and lookup_max is None:
            lookup_min = lookup_max = 5
        lookup_min = lookup_min if lookup_min is not None else lookup_max
        lookup_max = lookup_max if lookup_max is not None else lookup_min
        if lookup_min > lookup_max:
            raise _bad(f"prompt_lookup_min ({lookup_min}) must not exceed prompt_lookup_max ({lookup_max})")
        return cls(num_tokens, method, lookup_min, lookup_max, _positive_int(value, "disable_by_batch_size"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method, "num_speculative_tokens": self.num_speculative_tokens,
            "prompt_lookup_min": self.prompt_lookup_min, "prompt_lookup_max": self.prompt_lookup_max,
            "disable_by_batch_size": self.disable_by_batch_size,
        }


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
        request.grammar is None
        and request.pooling_params is None
        and params.logprobs is None
        and not params.edits_logits
        and (params.is_greedy or params.seed is None)
        and len(request.output_token_ids) >= params.min_tokens
    )
