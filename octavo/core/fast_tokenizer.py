"""A Hugging Face tokenizer read with the ``tokenizers`` library alone.

``FastTokenizer`` answers what the engine asks of a tokenizer (encode, decode,
special tokens and their ids, the vocabulary, the chat template) the way
transformers 5's ``TokenizersBackend`` does for the same files, without
importing transformers (seconds at start-up on a small CPU). It is built only
from files ``octavo.core.tokenizer_files`` accepted. Any other call (a batched
``tokenizer(texts, pairs, truncation=...)``, a keyword it does not mirror, an
attribute it lacks) goes to the transformers tokenizer, loaded on first use
from the same directory: slower the first time, never different.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from octavo.core.chat_template import UnsupportedChatInput, render_chat
from octavo.core.tokenizer_files import TokenizerFiles

logger = logging.getLogger(__name__)

# transformers' clean-up of decoded text (applied only to non-BPE models: it
# deletes real spaces before punctuation in byte-level text).
_CLEAN_UP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
             (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


# apply_chat_template's parameters for tokenizing the text, which transformers
# keeps out of the template's variables (the fast path renders text only).
_TOKENIZING_OPTIONS = frozenset({
    "sanitize_control_tokens", "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs",
})


class FastTokenizer:
    is_fast = True

    def __init__(self, files: TokenizerFiles) -> None:
        from tokenizers import processors

        self._files = files
        self._tokenizer = files.backend
        if files.add_empty_post_processor:
            # transformers' update_post_processor without BOS or EOS: pairs get type id 1.
            self._tokenizer.post_processor = processors.TemplateProcessing(
                single="$A:0", pair="$A:0 $B:1", special_tokens=[]
            )
        self.chat_template = files.chat_template
        self.name_or_path = str(files.directory)
        self.model_max_length = files.model_max_length
        self.padding_side = files.padding_side
        self.truncation_side = files.truncation_side
        self.clean_up_tokenization_spaces = files.clean_up_tokenization_spaces
        self._delegate: Any = None
        self._delegate_lock = threading.Lock()

    # ------------------------------------------------------------ special tokens

    @property
    def special_tokens_map(self) -> dict[str, str]:
        return dict(self._files.special_tokens)

    @property
    def all_special_tokens(self) -> list[str]:
        return list(dict.fromkeys([*self._files.special_tokens.values(), *self._files.extra_special_tokens]))

    @property
    def all_special_ids(self) -> list[int]:
        return [self._tokenizer.token_to_id(token) for token in self.all_special_tokens]

    def _named(self, key: str) -> str | None:
        return self._files.special_tokens.get(key)

    def _named_id(self, key: str) -> int | None:
        token = self._files.special_tokens.get(key)
        return None if token is None else self._tokenizer.token_to_id(token)

    bos_token = property(lambda self: self._named("bos_token"))
    eos_token = property(lambda self: self._named("eos_token"))
    unk_token = property(lambda self: self._named("unk_token"))
    pad_token = property(lambda self: self._named("pad_token"))
    sep_token = property(lambda self: self._named("sep_token"))
    cls_token = property(lambda self: self._named("cls_token"))
    mask_token = property(lambda self: self._named("mask_token"))
    bos_token_id = property(lambda self: self._named_id("bos_token"))
    eos_token_id = property(lambda self: self._named_id("eos_token"))
    unk_token_id = property(lambda self: self._named_id("unk_token"))
    pad_token_id = property(lambda self: self._named_id("pad_token"))
    sep_token_id = property(lambda self: self._named_id("sep_token"))
    cls_token_id = property(lambda self: self._named_id("cls_token"))
    mask_token_id = property(lambda self: self._named_id("mask_token"))

    # ---------------------------------------------------------------- vocabulary

    @property
    def backend_tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self._tokenizer.get_vocab(with_added_tokens=True)

    @property
    def added_tokens_decoder(self) -> dict[int, Any]:
        return self._tokenizer.get_added_tokens_decoder()

    def get_added_vocab(self) -> dict[str, int]:
        return {token.content: index for index, token in sorted(self.added_tokens_decoder.items())}

    def convert_ids_to_tokens(self, ids: int | list[int], skip_special_tokens: bool = False) -> str | list[str]:
        if isinstance(ids, int):
            return self._tokenizer.id_to_token(ids)
        skip = set(self.all_special_ids) if skip_special_tokens else set()
        return [self._tokenizer.id_to_token(int(i)) for i in ids if int(i) not in skip]

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> int | None | list[int | None]:
        if isinstance(tokens, str):
            return self._token_id(tokens)
        return [self._token_id(token) for token in tokens]

    def _token_id(self, token: str) -> int | None:
        index = self._tokenizer.token_to_id(token)
        return self.unk_token_id if index is None else index

    # ------------------------------------------------------------ encode, decode

    def encode(self, text: Any, add_special_tokens: bool = True, **kwargs: Any) -> list[int]:
        if not isinstance(text, str) or kwargs:
            return self.transformers_tokenizer().encode(text, add_special_tokens=add_special_tokens, **kwargs)
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(
        self, token_ids: Any, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool | None = None,
        **kwargs: Any,
    ) -> str | list[str]:
        if kwargs:
            return self.transformers_tokenizer().decode(
                token_ids, skip_special_tokens=skip_special_tokens,
                clean_up_tokenization_spaces=clean_up_tokenization_spaces, **kwargs,
            )
        if hasattr(token_ids, "tolist"):
            token_ids = token_ids.tolist()
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        if token_ids and isinstance(token_ids[0], (list, tuple)):
            return [self.decode(ids, skip_special_tokens, clean_up_tokenization_spaces) for ids in token_ids]
        text = self._tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)
        if clean_up_tokenization_spaces is None:
            clean_up_tokenization_spaces = self.clean_up_tokenization_spaces
        if clean_up_tokenization_spaces and self._files.model_type != "BPE":
            for old, new in _CLEAN_UP:
                text = text.replace(old, new)
        return text

    def batch_decode(self, sequences: Any, skip_special_tokens: bool = False, **kwargs: Any) -> list[str]:
        return [self.decode(ids, skip_special_tokens=skip_special_tokens, **kwargs) for ids in sequences]

    # -------------------------------------------------------------- chat template

    def get_chat_template(self, chat_template: str | None = None, tools: Any = None) -> str:
        template = chat_template if chat_template is not None else self.chat_template
        if template is None:
            raise ValueError("Cannot use chat template functions because tokenizer.chat_template is not set")
        return template

    def apply_chat_template(
        self, conversation: list, tools: list | None = None, documents: list | None = None,
        chat_template: str | None = None, add_generation_prompt: bool = False,
        continue_final_message: bool | str = False, tokenize: bool = True, **kwargs: Any,
    ) -> Any:
        template = self.get_chat_template(chat_template, tools)
        options = dict(
            tools=tools, documents=documents, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, **kwargs,
        )
        batched = bool(conversation) and isinstance(conversation[0], (list, tuple))
        if not (tokenize or batched or _TOKENIZING_OPTIONS.intersection(kwargs)):
            try:
                return render_chat(template, conversation, self._files.special_tokens, **options)
            except UnsupportedChatInput:
                pass
        return self.transformers_tokenizer().apply_chat_template(
            conversation, chat_template=chat_template, tokenize=tokenize, **options
        )

    # ---------------------------------------------------------- everything else

    def transformers_tokenizer(self) -> Any:
        """transformers' tokenizer for the same files (loaded once, on first use)."""
        with self._delegate_lock:
            if self._delegate is None:
                from octavo.core.tokenizer import load_transformers_tokenizer

                logger.info(
                    "loading transformers' tokenizer for %s (a call the fast tokenizer does not mirror)",
                    self.name_or_path,
                )
                self._delegate = load_transformers_tokenizer(self._files.directory)
            self._delegate.chat_template = self.chat_template
            return self._delegate

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.transformers_tokenizer()(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # Only public attributes are handed on: copying and pickling look up
        # dunder and private names, which must not load transformers.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.transformers_tokenizer(), name)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_delegate_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._delegate_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"FastTokenizer({self.name_or_path!r}, vocab={len(self)})"
