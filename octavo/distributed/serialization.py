"""msgpack codec for the messages between the engine and its workers.

Invariants:
- Nothing is ever pickled: a message is msgpack, and the only objects that
  decode into Python classes are the dataclasses and enums registered here
  (a whitelist). An unknown class name in a payload is an error, not an
  import.
- Dataclasses travel as ``[class name, {field: value}]`` inside an msgpack
  extension; decoding calls the class's constructor, so ``SamplingParams``
  re-validates itself on the receiving side.
- ``set``/``frozenset`` and ``tuple`` survive the round trip (msgpack alone
  would turn them into lists); dict keys may be ints (logprob dicts).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import msgpack

from octavo.core.engine import EngineLimits, ModelInfo
from octavo.core.image_features import ImageFeature
from octavo.core.kv_cache_manager import PrefixCacheStats
from octavo.core.outputs import (
    CompletionOutput,
    Logprob,
    PoolingOutput,
    PoolingRequestOutput,
    RequestMetrics,
    RequestOutput,
)
from octavo.core.lora_request import LoRARequest
from octavo.core.pooling_params import PoolerConfig, PoolingParams
from octavo.core.sampling_params import RequestOutputKind, SamplingParams
from octavo.core.scheduler import SchedulerConfig, SchedulerStats
from octavo.core.scheduler_config import SpecDecodingStats
from octavo.core.speculative_config import SpeculativeConfig
from octavo.core.scheduler_output import (
    CachedRequestData,
    CompilationCounts,
    GrammarBitmask,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
    TokenLogprobs,
)
from octavo.core.structured_output.compiler import StructuredOutputLimits
from octavo.core.structured_output.params import StructuredOutputsParams
from octavo.runtime.config import WorkerConfig

_EXT_DATACLASS = 1
_EXT_SET = 2
_EXT_FROZENSET = 3
_EXT_ENUM = 4
_EXT_TUPLE = 5

_DATACLASSES: dict[str, type] = {}
_ENUMS: dict[str, type[enum.Enum]] = {}


def register(cls: type) -> type:
    """Allow ``cls`` (a dataclass or an Enum) in messages."""
    if isinstance(cls, type) and issubclass(cls, enum.Enum):
        _ENUMS[cls.__name__] = cls
    elif dataclasses.is_dataclass(cls):
        _DATACLASSES[cls.__name__] = cls
    else:
        raise TypeError(f"{cls!r} is neither a dataclass nor an Enum")
    return cls


for _cls in (
    WorkerConfig,
    SchedulerOutput,
    NewRequestData,
    CachedRequestData,
    ModelRunnerOutput,
    CompilationCounts,
    TokenLogprobs,
    SamplingParams,
    RequestOutputKind,
    RequestOutput,
    CompletionOutput,
    Logprob,
    RequestMetrics,
    SchedulerStats,
    SchedulerConfig,
    PrefixCacheStats,
    EngineLimits,
    ModelInfo,
    GrammarBitmask,
    StructuredOutputsParams,
    StructuredOutputLimits,
    PoolingParams,
    PoolerConfig,
    PoolingOutput,
    PoolingRequestOutput,
    LoRARequest,
    SpeculativeConfig,
    SpecDecodingStats,
    ImageFeature,
):
    register(_cls)


def _default(obj: Any) -> msgpack.ExtType:
    if isinstance(obj, enum.Enum):
        name = type(obj).__name__
        if name not in _ENUMS:
            raise TypeError(f"enum {name} is not registered for IPC")
        return msgpack.ExtType(_EXT_ENUM, _pack([name, obj.value]))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        name = type(obj).__name__
        if _DATACLASSES.get(name) is not type(obj):
            raise TypeError(f"dataclass {name} is not registered for IPC")
        values = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init}
        return msgpack.ExtType(_EXT_DATACLASS, _pack([name, values]))
    if isinstance(obj, frozenset):
        return msgpack.ExtType(_EXT_FROZENSET, _pack(list(obj)))
    if isinstance(obj, set):
        return msgpack.ExtType(_EXT_SET, _pack(list(obj)))
    if isinstance(obj, tuple):
        return msgpack.ExtType(_EXT_TUPLE, _pack(list(obj)))
    raise TypeError(f"cannot send a {type(obj).__name__} between processes")


def _ext_hook(code: int, data: bytes) -> Any:
    value = _unpack(data)
    if code == _EXT_DATACLASS:
        name, fields = value
        cls = _DATACLASSES.get(name)
        if cls is None:
            raise ValueError(f"message holds unregistered class {name!r}")
        return cls(**fields)
    if code == _EXT_ENUM:
        name, enum_value = value
        if name not in _ENUMS:
            raise ValueError(f"message holds unregistered enum {name!r}")
        return _ENUMS[name](enum_value)
    if code == _EXT_SET:
        return set(value)
    if code == _EXT_FROZENSET:
        return frozenset(value)
    if code == _EXT_TUPLE:
        return tuple(value)
    raise ValueError(f"unknown msgpack extension {code}")


def _pack(obj: Any) -> bytes:
    # strict_types: tuples and subclasses of dict/list reach ``_default``
    # instead of being flattened silently.
    return msgpack.packb(obj, default=_default, use_bin_type=True, strict_types=True)


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)


def encode(obj: Any) -> bytes:
    """msgpack bytes for ``obj`` (plain values and registered classes)."""
    return _pack(obj)


def decode(data: bytes) -> Any:
    return _unpack(data)
