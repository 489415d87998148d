"""Install the Triton layer ops on a loaded model.

A platform's ``optimize_model`` calls ``install_triton_ops(model)``; it sets
the ``impl`` hooks the layers expose (``RMSNorm.impl`` /
``RMSNorm.fused_add_impl``, ``RotaryEmbedding.impl``, ``SiluAndMul.impl``).
Layers keep their torch code as the fallback and the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from octavo.models.layers.activation import SiluAndMul
from octavo.models.layers.norm import RMSNorm
from octavo.models.layers.rotary import RotaryEmbedding


@dataclass
class InstalledOps:
    """How many layers of each kind now run a Triton kernel."""

    num_rms_norms: int = 0
    num_rotary_embeddings: int = 0
    num_silu_and_muls: int = 0


def install_triton_ops(model: nn.Module) -> InstalledOps:
    from octavo.kernels.activation import silu_and_mul
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
    return installed
