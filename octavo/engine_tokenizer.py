"""The engine's tokenizer: loaded on a thread beside the model's load.

``build_engine`` (``engine_args.py``) starts it before the workers, so that
importing transformers and reading the tokenizer (seconds) overlap the
model's load, whose copies release the interpreter lock.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from octavo.core.tokenizer import load_tokenizer
from octavo.runtime.startup import timed_phase


def load_tokenizer_in_background(
    tokenizer: str | None, chat_template: str | None, model_path: Path, load_format: str
) -> Future:
    """``load_model_tokenizer``'s result, loading on a thread of its own."""
    # Imported on the tokenizer's thread, the tokenizers library's
    # Tokenizer.from_file held the interpreter lock for the whole read (0.25 s
    # for Llama 2's tokenizer.json), stalling this thread; imported here, it
    # lets go of it (docs/startup.md). The import itself takes ~15 ms.
    with contextlib.suppress(ImportError):
        import tokenizers  # noqa: F401
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="octavo-tokenizer")

    def load():
        with timed_phase("load tokenizer (on its thread)"):
            return load_model_tokenizer(tokenizer, chat_template, model_path, load_format)

    future = pool.submit(load)
    pool.shutdown(wait=False)
    return future


def load_model_tokenizer(tokenizer: str | None, chat_template: str | None, model_path: Path, load_format: str):
    """The tokenizer of ``--tokenizer`` if given, else the model's own (a GGUF
    file's vocabulary for GGUF), with the ``--chat-template`` file's template."""
    template = Path(chat_template).read_text() if chat_template else None
    if load_format == "gguf" and tokenizer is None:
        from octavo.models.gguf_loader import gguf_tokenizer

        return gguf_tokenizer(model_path, template)
    return load_tokenizer(tokenizer or model_path, template)
