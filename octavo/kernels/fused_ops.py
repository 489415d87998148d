"""Install the Triton layer ops on a loaded model.

A platform's ``optimize_model`` calls ``install_triton_ops(model)``; it sets
the ``impl`` hooks the layers expose (``RMSNorm.impl`` /
``RMSNorm.fused_add_impl``, ``RotaryEmbedding.impl``, ``SiluAndMul.impl``),
and the skinny-batch GEMV (``kernels/gemv.py``) on unquantized linear layers
and the LM head (``small_batch_impl``), fused with the activation in MLPs
that offer ``fused_gate_up_act``. Layers keep their torch code as the
fallback and the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from octavo.models.layers.activation import SiluAndMul
from octavo.models.layers.embedding import ParallelLMHead
from octavo.models.layers.linear import LinearBase
from octavo.models.layers.norm import RMSNorm
from octavo.models.layers.rotary import RotaryEmbedding
from octavo.quantization.base import UnquantizedLinearMethod


@dataclass
class InstalledOps:
    """How many layers of each kind now run a Triton kernel."""

    num_rms_norms: int = 0
    num_rotary_embeddings: int = 0
    num_silu_and_muls: int = 0
    num_gemv_layers: int = 0  # linear layers and LM heads with the skinny-batch GEMV
    num_fused_gate_up_acts: int = 0


def install_triton_ops(model: nn.Module) -> InstalledOps:
    from octavo.kernels.activation import silu_and_mul
    from octavo.kernels.gemv import GEMV_MAX_TOKENS, gemv_silu_mul, linear_small_batch
    from octavo.kernels.rms_norm import fused_add_rms_norm, rms_norm
    from octavo.kernels.rotary import apply_rotary

    installed = InstalledOps()
    for module in model.modules():
        if isinstance(module, RMSNorm):
            module.impl = rms_norm
            module.fused_add_impl = fused_add_rms_norm
            installed.num_rms_norms += 1
        elif isinstance(module, RotaryEmbedding):
            module.impl = apply_rotary
            installed.num_rotary_embeddings += 1
        elif isinstance(module, SiluAndMul):
            module.impl = silu_and_mul
            installed.num_silu_and_muls += 1
        elif GEMV_MAX_TOKENS and (_is_unquantized_linear(module) or isinstance(module, ParallelLMHead)):
            module.small_batch_impl = linear_small_batch
            installed.num_gemv_layers += 1
        if GEMV_MAX_TOKENS and hasattr(module, "fused_gate_up_act") and _is_unquantized_linear(getattr(module, "gate_up_proj", None)):
            module.fused_gate_up_act = gemv_silu_mul
            module.fused_gate_up_max_tokens = GEMV_MAX_TOKENS
            installed.num_fused_gate_up_acts += 1
    return installed


def _is_unquantized_linear(module) -> bool:
    return isinstance(module, LinearBase) and isinstance(module.quant_method, UnquantizedLinearMethod)
