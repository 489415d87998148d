"""Octavo: a small, fast, pluggable LLM inference and serving engine."""

from octavo.core.lora_request import LoRARequest
from octavo.core.outputs import CompletionOutput, Logprob, PoolingOutput, PoolingRequestOutput, RequestOutput
from octavo.core.pooling_params import PoolingParams
from octavo.core.sampling_params import RequestOutputKind, SamplingParams
from octavo.core.structured_output.params import StructuredOutputsParams
from octavo.version import __version__


def __getattr__(name: str):
    # LLM pulls in torch and transformers; import it only when asked for.
    if name == "LLM":
        from octavo.entrypoints.llm import LLM

        return LLM
    if name in ("BeamSearchParams", "BeamSearchOutput", "BeamSearchSequence"):
        from octavo.entrypoints import beam_search

        return getattr(beam_search, name)
    if name == "EngineArgs":
        from octavo.engine_args import EngineArgs

        return EngineArgs
    raise AttributeError(f"module 'octavo' has no attribute {name!r}")


__all__ = [
    "LLM",
    "BeamSearchOutput",
    "BeamSearchParams",
    "BeamSearchSequence",
    "CompletionOutput",
    "EngineArgs",
    "Logprob",
    "LoRARequest",
    "PoolingOutput",
    "PoolingParams",
    "PoolingRequestOutput",
    "RequestOutput",
    "RequestOutputKind",
    "SamplingParams",
    "StructuredOutputsParams",
    "__version__",
]
