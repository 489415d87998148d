"""Prompt text -> token ids for the routes, with the size limits applied first.

These functions run on the tokenizer pool's threads, never on the event
loop (``tokenizer_pool``), each with its thread's own tokenizer.

Invariants:

* A text longer than ``max_prompt_chars`` is refused before it is rendered
  or tokenised: tokenising costs time on a worker (about 2 s per MB of text
  for Llama 2's tokenizer), and such a prompt cannot fit anyway.
* Text goes through the ``tokenizers`` batch call without offsets
  (``encode_batch_fast``; half the time of ``encode_batch``, the same ids),
  which releases the interpreter lock, so the event loop keeps answering
  meanwhile (the single-text call holds it throughout). Its ids become a
  Python list (which holds the lock) only once their count is known to fit
  the context, so a prompt too long for the model costs no conversion.
* Errors name what the client sent: ``prompt`` on the completion routes,
  ``messages`` on the chat routes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from octavo.core.tokenizer import fast_backend
from octavo.entrypoints.openai.chat_template import ChatOptions, render_chat_text
from octavo.errors import InvalidArgumentError, PromptTooLongError

# Normalizers may merge characters (NFC); the character bound allows for it.
NORMALIZATION_SLACK = 2


@dataclass
class PromptInput:
    """One prompt; ``text`` is None for token-id prompts."""

    text: str | None
    token_ids: list[int]
    # The prompt's images, processed (``multimodal.ImagePrompts``): their spans in ``token_ids``.
    image_features: list | None = None
    # Its images as sent, until ``process_images`` has processed them (off the tokenizer pool).
    pending_images: list | None = None

    def as_engine_prompt(self) -> dict:
        if self.image_features:
            return {"prompt": self.text, "prompt_token_ids": self.token_ids, "image_features": self.image_features}
        return {"prompt": self.text, "prompt_token_ids": self.token_ids}


@dataclass(frozen=True)
class PromptLimits:
    max_model_len: int
    # Longest prompt text tokenised; None: only the request body limit applies.
    max_prompt_chars: int | None = None


def default_max_prompt_chars(tokenizer: Any, max_model_len: int) -> int | None:
    """The longest text that could still fit in ``max_model_len`` tokens.

    No token covers more characters than the longest one in the vocabulary,
    so a longer text has more tokens than the context holds (with slack for
    normalizers that merge characters)."""
    try:
        longest = max((len(token) for token in tokenizer.get_vocab()), default=1)
    except (AttributeError, NotImplementedError, TypeError):
        return None
    return max_model_len * max(1, longest) * NORMALIZATION_SLACK


# Prompt fields named in the singular in messages ("the input has ...", not "the messages take ...").
SINGULAR_PARAMS = frozenset({"prompt", "input"})


def prompt_too_long(num_tokens: int, max_model_len: int, param: str) -> PromptTooLongError:
    singular = param in SINGULAR_PARAMS
    subject = f"the {param} has" if singular else f"the {param} take"
    reason = f"the {param} must" if singular else "they must"
    return PromptTooLongError(
        f"{subject} {num_tokens} tokens but max_model_len is {max_model_len} "
        f"({reason} leave room for at least one new token)",
        param=param,
    )


def check_chars(num_chars: int, limits: PromptLimits, param: str) -> None:
    limit = limits.max_prompt_chars
    if limit is not None and num_chars > limit:
        verb = "is" if param in SINGULAR_PARAMS else "are"
        raise PromptTooLongError(
            f"the {param} {verb} {num_chars} characters long; the limit is {limit} characters "
            f"(a longer text cannot fit in {limits.max_model_len} tokens)",
            param=param,
        )


def encode_text(
    tokenizer: Any, text: str, add_special_tokens: bool, limits: PromptLimits, param: str = "prompt",
    fit_context: bool = True,
) -> PromptInput:
    """Tokenise ``text``; with ``fit_context``, refuse one that leaves no room in the context."""
    if tokenizer is None:
        raise InvalidArgumentError("this server has no tokenizer; send token ids", param=param)
    check_chars(len(text), limits, param)
    backend = fast_backend(tokenizer)
    if backend is None:
        token_ids = list(tokenizer.encode(text, add_special_tokens=add_special_tokens))
    else:
        encode_batch = getattr(backend, "encode_batch_fast", None) or backend.encode_batch
        encoding = encode_batch([text], add_special_tokens=add_special_tokens)[0]
        if fit_context and len(encoding) >= limits.max_model_len:
            raise prompt_too_long(len(encoding), limits.max_model_len, param)
        token_ids = encoding.ids
    if fit_context and len(token_ids) >= limits.max_model_len:
        raise prompt_too_long(len(token_ids), limits.max_model_len, param)
    return PromptInput(text, token_ids)


def encode_conversation(
    tokenizer: Any, conversation: list[dict[str, str]], options: ChatOptions, limits: PromptLimits,
    fit_context: bool = True, param: str = "messages",
) -> PromptInput:
    """Render ``conversation`` with the chat template and tokenise it (the template holds any BOS,
    unless ``options.add_special_tokens`` asks for the tokenizer's too); ``param`` is the request
    field errors name."""
    check_chars(sum(_content_chars(message["content"]) for message in conversation), limits, param)
    text = render_chat_text(tokenizer, conversation, options, param)
    return encode_text(tokenizer, text, options.add_special_tokens, limits, param, fit_context)


def _content_chars(content: str | list[dict]) -> int:
    """A message's characters (content parts: their texts)."""
    if isinstance(content, str):
        return len(content)
    return sum(len(part.get("text") or "") for part in content)


def with_images(prompt: PromptInput, images: list | None) -> PromptInput:
    """``prompt`` holding its images (as sent) for ``process_images``; as it is without images."""
    return PromptInput(prompt.text, prompt.token_ids, pending_images=images) if images else prompt


async def process_images(prompt: PromptInput, image_prompts: Any, param: str = "messages") -> PromptInput:
    """``prompt`` with its pending images processed on the image workers (``ImagePrompts.apply_async``,
    apart from the tokenizer pool: a burst of large images never holds up other requests' text):
    the image tokens widened and ``image_features`` set."""
    if not prompt.pending_images:
        return prompt
    token_ids, features = await image_prompts.apply_async(prompt.token_ids, prompt.pending_images, param)
    return PromptInput(prompt.text, token_ids, features)
