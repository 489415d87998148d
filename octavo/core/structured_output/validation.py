"""The compile check front ends run before queueing a constrained request.

``RequestValidator`` (the engine's and the data-parallel front's) mixes this
in: ``grammar_compiler`` is the process's compiler and cache (made on first
use, from the engine's tokenizer, vocabulary, EOS ids and limits), and
``check_structured_outputs`` compiles a request's constraint, blocking up to
the time limit, so that a constraint that cannot be used is refused before
anything is queued. The server awaits the same compiler without blocking its
event loop (``entrypoints/openai/structured.py``).
"""

from __future__ import annotations

import threading
from typing import Any

from octavo.core.structured_output.compiler import GrammarCompiler
from octavo.errors import InvalidArgumentError

_COMPILER_LOCK = threading.Lock()


class StructuredOutputValidation:
    tokenizer: Any | None
    limits: Any  # EngineLimits

    @property
    def grammar_compiler(self) -> GrammarCompiler:
        """This process's grammar compiler (and cache), made on first use."""
        compiler = getattr(self, "_grammar_compiler", None)
        if compiler is None:
            with _COMPILER_LOCK:
                compiler = getattr(self, "_grammar_compiler", None)
                if compiler is None:
                    compiler = self._grammar_compiler = self._make_grammar_compiler()
        return compiler

    def _make_grammar_compiler(self) -> GrammarCompiler:
        if self.tokenizer is None:
            raise InvalidArgumentError("structured outputs need a tokenizer", param="structured_outputs")
        try:
            import xgrammar  # noqa: F401
        except ImportError:
            raise InvalidArgumentError(
                "structured outputs need xgrammar: pip install 'octavo[serve]'", param="structured_outputs"
            ) from None
        limits = self.limits
        return GrammarCompiler(self.tokenizer, limits.vocab_size, limits.eos_token_ids, limits.structured_outputs)

    def check_structured_outputs(self, params: Any) -> None:
        """Compile ``params``' constraint now (blocking, bounded by the time limit)."""
        if params.structured_outputs is not None:
            compiler = self.grammar_compiler
            compiler.wait(compiler.submit(params.structured_outputs))
