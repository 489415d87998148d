"""A second example: a compiled backend through the runner hooks (plugin API 1.1).

``example_openvino`` is the cpu platform with every decode step of up to 8
requests compiled by OpenVINO (``torch.compile(backend="openvino")``). It
takes no change to Octavo and no kernel: the cpu platform's compiled-decode
hooks already do the work (``step_buckets`` pads decode steps to powers of
two and warms them up, attention is the opaque op ``octavo::attention``, so
OpenVINO compiles the rest of the model around it), and
``octavo.platforms.torch_compile.CountedCompiler`` wraps any
``torch.compile`` backend and counts its graphs (``compilations()``). All
this platform adds is the backend's name and the import that registers it.

Chosen only by name (``--platform example_openvino``); available where the
``openvino`` package is installed (the ``openvino`` extra of this package).
"""

from __future__ import annotations

import importlib

from octavo.platforms import probe
from octavo.platforms.cpu import CpuPlatform
from octavo.platforms.torch_compile import CountedCompiler


class ExampleOpenVinoPlatform(CpuPlatform):
    name = "example_openvino"
    priority = -1  # never chosen automatically: it is the cpu platform, compiled

    def __init__(self) -> None:
        super().__init__()
        importlib.import_module("openvino.torch")  # registers the "openvino" torch.compile backend
        self._compiler = CountedCompiler("openvino")

    @classmethod
    def is_available(cls) -> bool:
        return probe.module_installed("openvino")

    @classmethod
    def availability_detail(cls) -> str:
        if not cls.is_available():
            return "openvino is not installed (pip install 'octavo-example-accelerator[openvino]')"
        return "openvino installed; decode steps compiled by torch.compile(backend='openvino')"

    def versions(self) -> dict[str, str]:
        return {**super().versions(), "openvino": probe.package_version("openvino")}
