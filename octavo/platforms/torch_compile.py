"""``torch.compile`` for platforms that compile steps with it (cpu, and vendor plugins).

``CountedCompiler`` is a ``Platform.compile_step`` that wraps a step in
``torch.compile`` with a named backend (``inductor``, ``openvino``, ...) and
counts every graph that backend compiles: ``Platform.compilations`` returns
``count``. Steps are compiled with static shapes (``dynamic=False``): the
runner's buckets are the shapes. The attention should be an opaque op
(``octavo.runtime.attention.opaque``), so that the graph's shapes depend on
the number of tokens only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

logger = logging.getLogger(__name__)

# Dynamo keeps this many compiled variants of one function before it gives
# up and runs it eagerly; each bucket is one variant.
MAX_VARIANTS = 64


class CountedCompiler:
    def __init__(self, backend: str, options: dict | None = None) -> None:
        self.backend = backend
        self.options = options or {}
        self.count = 0

    def _compile_graph(self, graph_module: torch.fx.GraphModule, example_inputs: list) -> Callable:
        self.count += 1
        from torch._dynamo import lookup_backend

        logger.debug("torch.compile (%s): graph %d, %d nodes", self.backend, self.count, len(graph_module.graph.nodes))
        return lookup_backend(self.backend)(graph_module, example_inputs, **self.options)

    def __call__(self, step: Callable) -> Callable:
        """What ``Platform.compile_step`` returns."""
        import torch._dynamo

        config = torch._dynamo.config
        for name in ("recompile_limit", "cache_size_limit"):  # the name changed across torch versions
            if hasattr(config, name):
                setattr(config, name, max(getattr(config, name), MAX_VARIANTS))
        return torch.compile(step, backend=self._compile_graph, dynamic=False)
