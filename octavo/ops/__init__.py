"""Layer ops (plugin API 1.1): named operations a platform may accelerate.

Every layer operation a platform may want its own kernel for (RMSNorm,
rotary embedding, activations, skinny-batch GEMMs, fused MoE, quantized
GEMMs) is a named op with a plain-torch reference that defines it
(``specs.OP_SPECS``). Plugins offer implementations through the
``octavo_layer_ops`` hook (``OpImpl``: the op, a name, the function, the
conditions it serves under, a priority); the model builder resolves every
op once per model (``resolve_layer_ops``) and builds the model inside
``layer_ops_scope``; layers call the table they were built with
(``current_layer_ops()``). Kernels never import models: this registry is
how they reach the layers.

Nothing but torch is imported here; implementations named by
``"module:function"`` are imported only on a platform they serve.
"""

from octavo.ops.dispatch import reference_layer_ops
from octavo.ops.impl import REFERENCE, OpContext, OpImpl
from octavo.ops.resolution import resolve_layer_ops
from octavo.ops.specs import OP_SPECS, OpSpec, Tolerance, op_names
from octavo.ops.table import ChainStep, LayerOps, OpChoice, current_layer_ops, layer_ops_scope

__all__ = [
    "OP_SPECS",
    "REFERENCE",
    "ChainStep",
    "LayerOps",
    "OpChoice",
    "OpContext",
    "OpImpl",
    "OpSpec",
    "Tolerance",
    "current_layer_ops",
    "layer_ops_scope",
    "op_names",
    "reference_layer_ops",
    "resolve_layer_ops",
]

