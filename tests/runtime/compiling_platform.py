"""A stand-in for a compiling platform (as XLA is), on the CPU.

``ShapeCompilingCpu`` declares the TPU's step buckets and attention backend
and "compiles" one program per distinct set of shapes its step function
sees (the padded inputs and the attention metadata built from them), which
is what makes XLA recompile; it records the runner hooks it is called
through. Tests register it with ``sandbox.add("compiling", PLUGIN)``.
"""

from __future__ import annotations

import dataclasses

import torch

from octavo.platforms.cpu import CpuPlatform
from octavo.platforms.tpu import tpu_step_buckets

PLUGIN = """
OCTAVO_PLUGIN_API_VERSION = "1.1"
from tests.runtime.compiling_platform import ShapeCompilingCpu

@hookimpl
def octavo_platforms():
    return [ShapeCompilingCpu]
"""


def shape_key(*values) -> tuple:
    """The shapes of every tensor in ``values``, looking into dataclasses."""
    key: list = []
    for value in values:
        if isinstance(value, torch.Tensor):
            key.append(tuple(value.shape))
        elif dataclasses.is_dataclass(value):
            key.extend(shape_key(*(getattr(value, f.name) for f in dataclasses.fields(value))))
    return tuple(key)


class ShapeCompilingCpu(CpuPlatform):
    name = "shape_compiling_cpu"
    priority = -1
    fresh_step_inputs = True
    attention_backends = ("static_paged",)
    events: list[str] = []

    def __init__(self) -> None:
        super().__init__()
        self.programs: set[tuple] = set()

    def grad_mode(self):
        self.events.append("grad_mode")
        return torch.no_grad()

    def begin_step(self) -> None:
        self.events.append("begin")

    def end_step(self) -> None:
        self.events.append("end")

    def step_buckets(self, config):
        return tpu_step_buckets(config)

    def compile_step(self, step):
        def compiled(input_ids, positions, attn_metadata, logits_indices):
            assert not torch.is_inference_mode_enabled() and not torch.is_grad_enabled()
            self.programs.add(shape_key(input_ids, positions, logits_indices, attn_metadata))
            self.events.append("compiled step")
            return step(input_ids, positions, attn_metadata, logits_indices)

        return compiled

    def compilations(self) -> int:
        return len(self.programs)
