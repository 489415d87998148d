"""Quantization kernels: the formats' layouts and torch dequantizers (the
references' building blocks), and Triton kernels for the GPU path, one
format per module.

The quantized GEMMs reach the layers as layer ops (``fp8_linear``,
``int8_linear``, ``int4_linear``, ``gguf_linear``, ...; references in
``octavo.ops.quant_reference``), registered for the GPU by
``octavo.kernels.builtin``. Triton modules are imported only on a platform
they serve, so that a CPU-only install never needs Triton; every Triton
entry point is tested against its reference, on the CPU through Triton's
interpreter (``TRITON_INTERPRET=1``).
"""
