"""Errors a user can cause, each with a clear message and an HTTP status.

Everything raised because of bad input (a request, a model directory, an
option) derives from :class:`OctavoError`, so that every front end (the Python
API, the CLI, the servers) can turn it into a message or an HTTP response
without knowing the concrete type. Internal bugs stay ordinary exceptions.
"""

from __future__ import annotations


class OctavoError(Exception):
    """Base class of all user-facing errors."""

    http_status: int = 400
    error_type: str = "invalid_request_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidArgumentError(OctavoError, ValueError):
    """A parameter is out of range or of the wrong kind."""


class InvalidSamplingParamsError(InvalidArgumentError):
    """A sampling parameter is invalid (negative temperature, top_p of 0, ...)."""


class PromptTooLongError(InvalidArgumentError):
    """A prompt (plus the tokens asked for) does not fit in ``max_model_len``."""

    http_status = 400


class UnsupportedTaskError(InvalidArgumentError):
    """The loaded model does not serve this kind of request (generation on an
    embedding model, embeddings on a generative one, ...)."""


class RequestTooLargeError(InvalidArgumentError):
    """A request can never fit in the KV cache, however long it waits."""

    http_status = 413


class ModelNotFoundError(OctavoError, FileNotFoundError):
    """The model path or name does not exist."""

    http_status = 404
    error_type = "not_found_error"


class ModelLoadError(OctavoError):
    """A checkpoint is missing files, corrupt, or does not match its config."""


class HubAccessError(OctavoError):
    """The Hugging Face Hub refused a download: a gated or private repo, and no token that may read it."""

    http_status = 403
    error_type = "permission_error"


class HubUnreachableError(OctavoError):
    """The Hugging Face Hub could not be reached (and the model is not in the local cache)."""

    http_status = 503
    error_type = "service_unavailable"


class UnsupportedModelError(ModelLoadError):
    """The checkpoint's architecture is not in the model registry."""


class PlatformError(OctavoError):
    """The requested platform is not installed or not usable here."""


class PluginError(OctavoError):
    """A plugin that was explicitly requested failed to load."""


class QuantizationError(OctavoError):
    """A quantization method is unknown or unsupported on this platform."""


class PrefixCacheBusyError(OctavoError):
    """The prefix cache cannot be reset while requests hold its blocks."""

    http_status = 409


class QueueFullError(OctavoError):
    """The server's queue is full; retry later."""

    http_status = 503
    error_type = "overloaded_error"


class EngineDeadError(OctavoError):
    """The engine loop failed; requests in flight cannot complete."""

    http_status = 503
    error_type = "engine_error"


class RequestAbortedError(OctavoError):
    """The request was aborted before it finished."""

    http_status = 499


class StructuredOutputError(InvalidArgumentError):
    """A structured-output constraint (JSON schema, regex, choice, grammar) is
    invalid, uses something the grammar cannot enforce, or does not compile."""


class GrammarTooLargeError(StructuredOutputError):
    """A constraint, or the grammar compiled from it, is over the size limit."""


class GrammarTimeoutError(StructuredOutputError):
    """Compiling a constraint took longer than the time limit."""


class LoRAAdapterError(InvalidArgumentError):
    """A LoRA adapter that cannot be served: LoRA off, a missing or pickled
    adapter, a rank above ``max_lora_rank``, a module the model has no LoRA
    for, or tensors of the wrong shape."""
