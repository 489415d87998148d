"""The checks every request passes before it is queued (``RequestValidator``),
raising typed errors with the parameter they concern."""

from __future__ import annotations

from typing import Any

from octavo.core.bad_words import MAX_BAD_WORDS_TOKENS, bad_words_token_ids
from octavo.core.engine_limits import EngineLimits
from octavo.core.image_features import ImageFeature, check_features
from octavo.core.lora_validation import LoRAValidation
from octavo.core.pooling_params import PoolingParams, check_pooling_params
from octavo.core.sampling_params import SamplingParams
from octavo.core.structured_output.validation import StructuredOutputValidation
from octavo.errors import InvalidArgumentError, PromptTooLongError, UnsupportedTaskError


def check_token_ids(token_ids: list[int], vocab_size: int, param: str) -> None:
    """Raise unless every id is in ``[0, vocab_size)`` (min/max first: C speed for the usual case)."""
    if not token_ids or (0 <= min(token_ids) and max(token_ids) < vocab_size):
        return
    bad = next(t for t in token_ids if not 0 <= t < vocab_size)
    raise InvalidArgumentError(f"token id {bad} is out of range for a vocabulary of {vocab_size}", param=param)


def check_priority(priority: int, policy: str) -> None:
    """A priority other than 0 needs the priority policy (vLLM refuses it too)."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidArgumentError(f"priority must be an integer, got {priority!r}", param="priority")
    if priority != 0 and policy != "priority":
        raise InvalidArgumentError(
            f"priority={priority} needs the priority scheduling policy (--scheduling-policy priority)",
            param="priority",
        )


class RequestValidator(StructuredOutputValidation, LoRAValidation):
    """Prompt -> token ids, and the checks every request passes before it is
    queued. Shared by ``LLMEngine`` and by front ends that route requests to
    several engines (``DataParallelEngine``), so both refuse the same input
    with the same error."""

    tokenizer: Any | None
    limits: EngineLimits

    def tokenize_prompt(self, prompt: str | list[int] | dict) -> tuple[str | None, list[int]]:
        """Accept a string, a list of token ids or ``{"prompt"|"prompt_token_ids": ...}``."""
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            prompt = prompt.get("prompt")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InvalidArgumentError("this engine has no tokenizer; pass token ids", param="prompt")
            return prompt, list(self.tokenizer.encode(prompt))
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return None, list(prompt)
        raise InvalidArgumentError(
            f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}", param="prompt"
        )

    def prepare_prompt(
        self, prompt: str | list[int] | dict, params: SamplingParams | PoolingParams
    ) -> tuple[str | None, list[int]]:
        """``tokenize_prompt``, then a generation prompt cut to its last
        ``truncate_prompt_tokens`` tokens where that asks (a cut prompt has no
        text: the text of its tokens is not the text given)."""
        prompt_text, prompt_token_ids = self.tokenize_prompt(prompt)
        keep = getattr(params, "truncate_prompt_tokens", None)
        if keep is None:
            return prompt_text, prompt_token_ids
        max_model_len = self.limits.max_model_len
        if keep == -1:
            keep = max_model_len - 1
        elif keep >= max_model_len:
            raise InvalidArgumentError(
                f"truncate_prompt_tokens must be -1 or in [1, {max_model_len - 1}] (max_model_len is {max_model_len}), "
                f"got {keep}", param="truncate_prompt_tokens")
        if len(prompt_token_ids) <= keep:
            return prompt_text, prompt_token_ids
        return None, prompt_token_ids[-keep:]

    def image_features(self, prompt: Any, prompt_token_ids: list[int], params: Any) -> tuple[ImageFeature, ...]:
        """The prompt's processed images (``{"image_features": [...]}``, what the
        front ends' ``ImagePrompts`` make of ``multi_modal_data``), checked
        against the prompt and the model; () for a text prompt."""
        if not isinstance(prompt, dict):
            return ()
        if "multi_modal_data" in prompt:
            raise InvalidArgumentError(
                "multi_modal_data reaches the engine processed: pass the prompt through LLM.generate or the "
                "server, which turn images into image_features", param="multi_modal_data")
        features = prompt.get("image_features") or ()
        if not features:
            return ()
        limit = self.limits.max_images_per_prompt
        if limit == 0:
            raise InvalidArgumentError("this model takes no images; send text only", param="prompt")
        if len(features) > limit:
            raise InvalidArgumentError(
                f"the prompt has {len(features)} images, more than the {limit} allowed (--limit-mm-per-prompt)",
                param="prompt")
        if isinstance(params, PoolingParams) or getattr(params, "truncate_prompt_tokens", None) is not None:
            raise InvalidArgumentError("a prompt with images can neither be pooled nor truncated", param="prompt")
        check_features(features, len(prompt_token_ids))
        return tuple(features)

    def validate(self, prompt_token_ids: list[int], params: SamplingParams | PoolingParams) -> None:
        limits = self.limits
        if isinstance(params, PoolingParams):
            check_pooling_params(params, limits.pooler)
        elif limits.pooler is not None:
            raise UnsupportedTaskError(
                f"this model serves {limits.pooler.task!r} requests; it does not generate text "
                "(use the embeddings, score, rerank or classify routes, or start it with --task generate)",
                param="model",
            )
        if not prompt_token_ids:
            raise InvalidArgumentError("the prompt is empty", param="prompt")
        # The length first: it bounds the cost of the checks that walk the ids.
        if isinstance(params, PoolingParams):
            self._validate_pooling_length(len(prompt_token_ids))
            check_token_ids(prompt_token_ids, limits.vocab_size, "prompt")
            return
        if len(prompt_token_ids) >= limits.max_model_len:
            raise PromptTooLongError(
                f"the prompt has {len(prompt_token_ids)} tokens but max_model_len is {limits.max_model_len} "
                "(the prompt must leave room for at least one new token)",
                param="prompt",
            )
        check_token_ids(prompt_token_ids, limits.vocab_size, "prompt")
        check_token_ids(params.stop_token_ids, limits.vocab_size, "stop_token_ids")
        self._validate_logit_edits(params)
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and value > limits.max_logprobs:
                raise InvalidArgumentError(
                    f"{name}={value} exceeds the maximum of {limits.max_logprobs}", param=name
                )

    def _validate_logit_edits(self, params: SamplingParams) -> None:
        """Allowed ids, logit-bias keys and bad words' tokens inside the vocabulary."""
        vocab_size = self.limits.vocab_size
        allowed = params.allowed_token_ids or []
        if len(allowed) > vocab_size:  # the sampler indexes with every entry at every step
            raise InvalidArgumentError(
                f"allowed_token_ids has {len(allowed)} entries, more than the vocabulary's {vocab_size}",
                param="allowed_token_ids")
        check_token_ids(allowed, vocab_size, "allowed_token_ids")
        check_token_ids(list(params.logit_bias or ()), vocab_size, "logit_bias")
        self.resolve_bad_words(params)

    def resolve_bad_words(self, params: SamplingParams) -> None:
        """Set ``params.bad_words_token_ids`` from ``params.bad_words`` with this
        engine's tokenizer (the same ids each time: the API process's check and the
        engine's both run it), then check the sequences against the vocabulary."""
        if params.bad_words:
            if self.tokenizer is None:
                raise InvalidArgumentError("bad_words needs a tokenizer; this engine has none", param="bad_words")
            params.bad_words_token_ids = bad_words_token_ids(params.bad_words, self.tokenizer) or None
        sequences = params.bad_words_token_ids or []
        if sum(len(ids) for ids in sequences) > MAX_BAD_WORDS_TOKENS:
            raise InvalidArgumentError(f"the bad words come to more than {MAX_BAD_WORDS_TOKENS} tokens",
                                       param="bad_words")
        for ids in sequences:
            check_token_ids(ids, self.limits.vocab_size, "bad_words_token_ids")

    def _validate_pooling_length(self, num_tokens: int) -> None:
        # A pooled prompt generates nothing, so it may fill max_model_len.
        if num_tokens > self.limits.max_model_len:
            raise PromptTooLongError(
                f"the input has {num_tokens} tokens but this model takes at most {self.limits.max_model_len} "
                "(set truncate_prompt_tokens to truncate it)",
                param="input",
            )

    def validate_token_type_ids(self, prompt_token_ids: list[int], token_type_ids: list[int] | None) -> None:
        if token_type_ids is None:
            return
        num_types = self.limits.pooler.num_token_types if self.limits.pooler is not None else 0
        if len(token_type_ids) != len(prompt_token_ids):
            raise InvalidArgumentError(
                f"token_type_ids has {len(token_type_ids)} entries for {len(prompt_token_ids)} tokens",
                param="token_type_ids",
            )
        if any(not 0 <= t < num_types for t in token_type_ids):
            raise InvalidArgumentError(
                f"token_type_ids must be in [0, {num_types}) for this model", param="token_type_ids"
            )

    def max_new_tokens(self, prompt_token_ids: list[int], params: SamplingParams | PoolingParams) -> int:
        if isinstance(params, PoolingParams):
            return 0
        max_tokens = self.limits.max_model_len - len(prompt_token_ids)
        if params.max_tokens is not None:
            max_tokens = min(max_tokens, params.max_tokens)
        return max_tokens
