"""NVIDIA GPUs through ``torch.cuda``.

Detection: a CUDA build of torch (``torch.version.cuda``) and
``torch.cuda.device_count() > 0``. ``device_count`` asks NVML first, which
creates no CUDA context, so probing does not poison a later ``fork``; only
when NVML is missing does torch fall back to ``cudaGetDeviceCount`` (which
runs ``cuInit``). ``torch.cuda.is_available()`` is avoided on purpose: unless
``PYTORCH_NVML_BASED_CUDA_CHECK=1`` it always goes through ``cuInit``.
Nothing that creates a context (device names, capabilities) runs before the
platform is selected.

The KV cache budget comes from a profiled dummy step
(``octavo.platforms.profiling``). Attention: the backends named in
``attention_backends``, resolved through the ``octavo_attention_backends``
hook (a Triton backend goes first in that list once it is registered).
Layer ops: Octavo's Triton kernels serve the ``cuda`` device type through
the built-in plugin's ``octavo_layer_ops`` (``octavo.kernels.builtin``), as
a vendor's would; this class sets nothing on the model.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from octavo.platforms.torch_device import TorchDevicePlatform

FP8_KV_DTYPES = {
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


class CudaPlatform(TorchDevicePlatform):
    name = "cuda"
    device_type = "cuda"
    dist_backend = "nccl"
    priority = 100
    supported_dtypes = (torch.float32, torch.bfloat16, torch.float16)
    supported_quantization = None  # every installed method has a torch path on CUDA
    supports_graphs = True
    pins_host_memory = True
    # triton_sdpa_prefill: triton_paged with a long prompt's attention through cuDNN
    # (round 36, H100: TTFT at 32k 1,498 -> 1,209 ms, at 128k 15.6 -> 10.4 s).
    attention_backends = ("triton_sdpa_prefill", "triton_paged", "torch_paged")

    @classmethod
    def _torch_build_ok(cls) -> bool:
        return torch.version.cuda is not None

    @classmethod
    def is_available(cls) -> bool:
        return cls._torch_build_ok() and torch.cuda.device_count() > 0

    @classmethod
    def availability_detail(cls) -> str:
        if not cls._torch_build_ok():
            return f"torch {torch.__version__} is not a CUDA build"
        count = torch.cuda.device_count()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
        if count == 0:
            return f"no CUDA device visible{where}"
        return f"{count} device(s){where}, CUDA {torch.version.cuda}"

    def kv_cache_dtype(self, name: str) -> torch.dtype:
        if name in FP8_KV_DTYPES:
            return FP8_KV_DTYPES[name]
        return super().kv_cache_dtype(name)

    def check_config(self, config) -> None:
        super().check_config(config)
        from octavo.kernels.builtin import gemv_max_tokens, norm_gemv_enabled, quant_gemv_max_tokens

        # OCTAVO_GEMV_MAX_TOKENS / OCTAVO_QUANT_GEMV_MAX_TOKENS / OCTAVO_FP8_SKINNY_MAX_TOKENS
        # are well formed, OCTAVO_NORM_GEMV is 0 or 1 (else InvalidArgumentError)
        gemv_max_tokens()
        quant_gemv_max_tokens()
        norm_gemv_enabled()
        from octavo.kernels.quant.scaled_mm import fp8_fast_accum

        fp8_fast_accum()  # OCTAVO_FP8_FAST_ACCUM is 0 or 1
        if importlib.util.find_spec("triton") is not None:
            from octavo.kernels.quant.int4_gemv_rows import tiles_from_env
            from octavo.kernels.quant.int4_triton import rows_gemv_enabled
            from octavo.kernels.quant.skinny_8bit import w8a8_max_tokens

            w8a8_max_tokens()
            rows_gemv_enabled()  # OCTAVO_INT4_GEMV_ROWS is 0 or 1
            tiles_from_env()  # OCTAVO_INT4_GEMV_ROWS_TILES, if set, is three to six numbers
            from octavo.kernels.quant import gguf_q4k_pairs, gguf_q6k_pairs

            for pairs in (gguf_q4k_pairs, gguf_q6k_pairs):
                pairs.pairs_enabled()  # OCTAVO_GGUF_Q4K_PAIRS / _Q6K_PAIRS is 0 or 1
                pairs.tiles_from_env()  # OCTAVO_GGUF_Q4K_PAIRS_TILES / _Q6K_, if set, is three or four numbers
            from octavo.kernels.quant import fp8_gemv_rows

            fp8_gemv_rows.rows_enabled()  # OCTAVO_FP8_GEMV_ROWS is 0 or 1
            fp8_gemv_rows.tiles_from_env()  # OCTAVO_FP8_GEMV_ROWS_TILES, if set, is three numbers
            from octavo.kernels.moe_align import chunked_align_enabled

            chunked_align_enabled()  # OCTAVO_MOE_CHUNKED_ALIGN is 0 or 1
            from octavo.kernels.moe_routed import routes_in_kernel

            routes_in_kernel()  # OCTAVO_MOE_ROUTED is 0 or 1 (and OCTAVO_MOE_DECODE_MAX_TOKENS well formed)

    def graph_runner(self):
        """Decode steps are captured as CUDA graphs (HIP graphs on ROCm)."""
        from octavo.runtime.cuda_graphs import DecodeGraphs

        return DecodeGraphs

    def versions(self) -> dict[str, str]:
        # Selected platform only: naming the device creates a CUDA context.
        cuda = self.torch_namespace()
        versions = {"torch": torch.__version__, "cuda": str(torch.version.cuda)}
        for index in range(cuda.device_count()):
            major, minor = cuda.get_device_capability(index)
            versions[f"device {index}"] = f"{cuda.get_device_name(index)} (sm_{major}{minor})"
        return versions

    def default_max_num_batched_tokens(self) -> int:
        """8,192 tokens a step on devices of 70 GiB or more (H100, H200,
        MI300X: vLLM's server default there), 2,048 below.

        A larger step carries a longer prefill chunk beside the decodes: fewer
        steps for the same prompts (throughput, time to first token under
        load) against a longer step for every stream (inter-token latency);
        ``docs/serving.md`` has the H200 figures. Read from device 0's
        properties, which creates no CUDA context."""
        total_bytes = self.torch_namespace().get_device_properties(0).total_memory
        return 8192 if total_bytes >= 70 << 30 else 2048
