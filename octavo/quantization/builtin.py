"""The in-tree quantization methods, as the built-in plugin registers them.

Names (``--quantization NAME`` or the checkpoint's ``quant_method``):

* ``fp8`` -- fp8 checkpoints, or quantize 16/32-bit ones while loading;
* ``compressed-tensors`` -- llm-compressor checkpoints with fp8/int8 weights;
* ``int8`` -- W8A8 int8, quantized while loading;
* ``int8_weight_only`` -- int8 weights, quantized while loading;
* ``int4`` -- weight-only int4 (groups of 128), quantized while loading;
* ``gptq``, ``awq`` -- int4 checkpoints;
* ``gguf`` -- the quantized tensors of a ``.gguf`` file (chosen by the loader).
"""

from __future__ import annotations


def builtin_quantization_methods() -> dict[str, type]:
    from octavo.quantization.awq import AWQConfig
    from octavo.quantization.compressed_tensors import CompressedTensorsConfig
    from octavo.quantization.fp8 import Fp8Config
    from octavo.quantization.gguf import GGUFConfig
    from octavo.quantization.gptq import GPTQConfig
    from octavo.quantization.int4 import Int4Config
    from octavo.quantization.int8 import Int8Config, Int8WeightOnlyConfig

    classes = (Fp8Config, CompressedTensorsConfig, Int8Config, Int8WeightOnlyConfig, Int4Config, GPTQConfig, AWQConfig, GGUFConfig)
    return {cls.name: cls for cls in classes}


# What runs on the CPU: all of them (fp8 weight-only, int8 through
# torch._int_mm, int4 and GGUF through the torch dequantizers).
CPU_QUANTIZATION_METHODS = (
    "fp8", "compressed-tensors", "int8", "int8_weight_only", "int4", "gptq", "awq", "gguf",
)
