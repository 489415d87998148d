"""When a checkpoint's tokenizer can be read without transformers, and what it holds.

Importing transformers for ``AutoTokenizer`` costs seconds at start-up (it
loads ``AutoConfig``, whose model configurations import
``torch.distributed.tensor`` and sympy), while the ``tokenizers`` library reads
``tokenizer.json`` in a fraction of a second. The two agree only where
transformers loads ``tokenizer.json`` as it is. transformers 5 rebuilds some
tokenizer classes' pipelines from the vocabulary (``LlamaTokenizer`` sets its
own normalizer, pre-tokenizer and decoder), routes some model types to other
classes, and adds special tokens, patches regexes or changes truncation as
the files ask. ``read_tokenizer_files`` accepts only the cases where the
result is known to be the file as it is, and names the first thing it does
not know otherwise (the caller then loads transformers): never a silently
different tokenizer.

Invariants (what an accepted ``TokenizerFiles`` promises):

* transformers 5 is installed (the rules below are its rules);
* ``tokenizer.json`` declares no truncation or padding (transformers turns
  them on and off per call);
* every named special token and every entry of ``added_tokens_decoder`` is
  already a special added token of ``tokenizer.json`` with the same flags, so
  transformers' start-up adds nothing;
* ``tokenizer_config.json`` holds only keys whose meaning is mirrored here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")

# Classes that transformers 5 maps to ``TokenizersBackend``, which loads
# tokenizer.json as it is.
GENERIC_CLASSES = frozenset({"PreTrainedTokenizerFast", "TokenizersBackend"})
LLAMA_CLASSES = frozenset({"LlamaTokenizer", "LlamaTokenizerFast"})

# Model types (config.json) for which AutoTokenizer keeps the class that
# tokenizer_config.json names: none is registered for them, or the generic
# one, or a model-specific one that the names in the file win over. Others are
# routed elsewhere (qwen2 to Qwen2Tokenizer, which rebuilds the pipeline;
# Mistral's to its own tokenizer and regex patches). A test checks this
# against transformers' own tables.
MODEL_TYPES = frozenset(
    {
        "llama", "granite", "granitemoe", "olmo2", "olmoe", "phi3", "deepseek_v2", "deepseek_v3",
        "qwen3", "qwen2_moe", "qwen3_moe", "gemma", "gemma2", "gemma3_text",
        "olmo3", "seed_oss", "smollm3", "ernie4_5",
    }
)

# tokenizer_config.json keys whose effect is mirrored (or which have none on
# transformers 5's TokenizersBackend, like bookkeeping written by
# save_pretrained). Keys that choose other files (fast_tokenizer_files,
# tokenizer_file, vocab_file) are left out: transformers then decides.
KNOWN_CONFIG_KEYS = frozenset(
    {
        *NAMED_SPECIAL_TOKENS,
        "tokenizer_class", "added_tokens_decoder", "additional_special_tokens", "extra_special_tokens",
        # Popped by transformers when tokenizer.json exists: the post-processor decides.
        "add_bos_token", "add_eos_token",
        "clean_up_tokenization_spaces", "model_max_length", "chat_template", "padding_side", "truncation_side",
        "model_input_names", "use_default_system_prompt", "legacy", "add_prefix_space", "backend", "is_local",
        "local_files_only", "name_or_path", "split_special_tokens", "errors", "sp_model_kwargs",
        "spaces_between_special_tokens", "processor_class", "do_lower_case",
    }
)

# The pipeline transformers 5's LlamaTokenizer builds (legacy False, a prefix
# space added): accepted only where tokenizer.json already is exactly this.
_LLAMA_PIPELINE = {
    "normalizer": None,
    "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False},
    "decoder": {
        "type": "Sequence",
        "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        ],
    },
}
_LLAMA_MODEL = {
    "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
    "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
}


# transformers' model_max_length where the config gives none.
_NO_LENGTH_LIMIT = int(1e30)


class Unsupported(Exception):
    """Why transformers must load this tokenizer (the fast path does not know the case)."""


@dataclass(frozen=True)
class TokenizerFiles:
    directory: Path
    backend: Any  # the tokenizers.Tokenizer read from tokenizer.json
    special_tokens: dict[str, str]  # named special tokens, as transformers' special_tokens_map
    extra_special_tokens: tuple[str, ...]
    chat_template: str | None
    clean_up_tokenization_spaces: bool
    model_max_length: int
    padding_side: str
    truncation_side: str
    add_empty_post_processor: bool  # transformers sets "$A:0 / $A:0 $B:1" where the file has none
    model_type: str  # the backend's model (BPE, Unigram, WordPiece, ...)


def transformers_major() -> int | None:
    """transformers' major version from its metadata (no import)."""
    try:
        return int(metadata.version("transformers").split(".")[0])
    except (metadata.PackageNotFoundError, ValueError):
        return None


def read_tokenizer_files(directory: Path) -> TokenizerFiles:
    """The tokenizer in ``directory`` when the fast path reproduces transformers 5; else ``Unsupported``."""
    if transformers_major() != 5:
        raise Unsupported("the fast path mirrors transformers 5")
    tokenizer_json = directory / "tokenizer.json"
    config_path = directory / "tokenizer_config.json"
    if not tokenizer_json.is_file() or not config_path.is_file():
        raise Unsupported("no tokenizer.json and tokenizer_config.json")
    for name in ("added_tokens.json", "chat_template.json", "additional_chat_templates", "tekken.json"):
        if (directory / name).exists():
            raise Unsupported(f"{name} is present")
    config = _read_json(config_path)
    unknown = sorted(set(config) - KNOWN_CONFIG_KEYS)
    if unknown:
        raise Unsupported(f"tokenizer_config.json has {unknown}")
    _check_model_config(directory / "config.json")
    if config.get("split_special_tokens") or config.get("use_default_system_prompt"):
        raise Unsupported("split_special_tokens or use_default_system_prompt is set")
    if config.get("tokenizer_class") not in GENERIC_CLASSES | LLAMA_CLASSES:
        raise Unsupported(f"tokenizer class {config.get('tokenizer_class')!r}")
    special, extra = _special_tokens(directory, config)
    backend = _read_backend(tokenizer_json)
    _check_class(config, backend)
    if backend.truncation is not None or backend.padding is not None:
        raise Unsupported("tokenizer.json declares truncation or padding")
    _check_added_tokens(backend, config, special, extra)
    return TokenizerFiles(
        directory=directory,
        backend=backend,
        special_tokens=special,
        extra_special_tokens=extra,
        chat_template=_chat_template(directory, config),
        clean_up_tokenization_spaces=bool(config.get("clean_up_tokenization_spaces", False)),
        model_max_length=_NO_LENGTH_LIMIT if config.get("model_max_length") is None else config["model_max_length"],
        padding_side=config.get("padding_side", "left" if config.get("tokenizer_class") in LLAMA_CLASSES else "right"),
        truncation_side=config.get("truncation_side", "right"),
        add_empty_post_processor=backend.post_processor is None,
        model_type=type(backend.model).__name__,
    )


def _read_backend(path: Path) -> Any:
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the library's own errors: transformers will say more
        raise Unsupported(f"tokenizers cannot read tokenizer.json: {exc}") from None


def _component(value: Any) -> Any:
    """A pipeline component as its JSON (None where the file has none)."""
    return None if value is None else json.loads(value.__getstate__())


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise Unsupported(f"{path.name} is unreadable: {exc}") from None
    if not isinstance(value, dict):
        raise Unsupported(f"{path.name} is not a JSON object")
    return value


def _check_model_config(path: Path) -> None:
    """AutoTokenizer consults the model's config: remote code, routing by model type, name
    patterns. A tokenizer directory without one keeps the class its files name."""
    if not path.is_file():
        return
    config = _read_json(path)
    if config.get("model_type") not in MODEL_TYPES:
        raise Unsupported(f"AutoTokenizer may choose another class for model type {config.get('model_type')!r}")
    for key in ("auto_map", "tokenizer_class", "_name_or_path"):
        if key in config:
            raise Unsupported(f"config.json sets {key}")


def _check_class(config: dict, backend: Any) -> None:
    name = config.get("tokenizer_class")
    if name in GENERIC_CLASSES:
        return
    if name in LLAMA_CLASSES:
        if config.get("legacy", False) or config.get("add_prefix_space") not in (None, True):
            raise Unsupported("LlamaTokenizer with legacy spacing or without a prefix space")
        pipeline = {key: _component(getattr(backend, key)) for key in _LLAMA_PIPELINE}
        model = backend.model
        fields = {key: getattr(model, key, None) for key in _LLAMA_MODEL if key != "type"}
        if pipeline != _LLAMA_PIPELINE or {"type": type(model).__name__, **fields} != _LLAMA_MODEL:
            raise Unsupported("tokenizer.json differs from the pipeline transformers' LlamaTokenizer rebuilds")
        return
    raise Unsupported(f"tokenizer class {name!r}")


def _token_text(value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise Unsupported(f"{key} is not a plain string")
    return value


def _special_tokens(directory: Path, config: dict) -> tuple[dict[str, str], tuple[str, ...]]:
    """The named and extra special tokens, with special_tokens_map.json filling the gaps
    (transformers reads it when the config has no added_tokens_decoder)."""
    merged = dict(config)
    map_path = directory / "special_tokens_map.json"
    if map_path.is_file() and "added_tokens_decoder" not in config:
        for key, value in _read_json(map_path).items():
            if key in merged and merged[key] != value:
                raise Unsupported(f"special_tokens_map.json and tokenizer_config.json disagree on {key}")
            merged[key] = value
    named = {key: _token_text(merged[key], key) for key in NAMED_SPECIAL_TOKENS if merged.get(key) is not None}
    old_name, new_name = merged.get("additional_special_tokens"), merged.get("extra_special_tokens")
    if old_name and new_name and old_name != new_name:
        raise Unsupported("additional_special_tokens and extra_special_tokens differ")
    extra = new_name or old_name or []
    if not isinstance(extra, list):
        raise Unsupported("extra_special_tokens is not a list")
    return named, tuple(_token_text(token, "extra_special_tokens") for token in extra)


_FLAGS = ("content", "lstrip", "rstrip", "single_word", "normalized", "special")


def _check_added_tokens(backend: Any, config: dict, special: dict[str, str], extra: tuple[str, ...]) -> None:
    by_id = {
        index: {flag: getattr(token, flag) for flag in _FLAGS}
        for index, token in backend.get_added_tokens_decoder().items()
    }
    added = {token["content"]: token for token in by_id.values()}
    for token in [*special.values(), *extra]:
        entry = added.get(token)
        if entry is None or not entry["special"] or entry["normalized"]:
            raise Unsupported(f"special token {token!r} is not a special, unnormalized added token of tokenizer.json")
    for index, wanted in (config.get("added_tokens_decoder") or {}).items():
        have = by_id.get(int(index))
        if not isinstance(wanted, dict) or have is None:
            raise Unsupported(f"added_tokens_decoder entry {index} is not in tokenizer.json")
        for flag in _FLAGS:
            if wanted.get(flag, have[flag]) != have[flag]:
                raise Unsupported(f"added_tokens_decoder entry {index} differs from tokenizer.json on {flag}")


def _chat_template(directory: Path, config: dict) -> str | None:
    """chat_template.jinja takes priority over the config's template, as in transformers."""
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if template is not None and not isinstance(template, str):
        raise Unsupported("named chat templates")
    return template
