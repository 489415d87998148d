"""What every model class receives and provides.

A model is built from a ``ModelInitContext`` and must offer
``forward(input_ids, positions, ctx) -> hidden_states``,
``compute_logits(hidden_states) -> logits`` and
``load_weights(iterable of (name, tensor))``.

A pooling model (embeddings, classification) offers ``pool(hidden_states,
PoolingMetadata) -> [num_seqs, size]`` in place of ``compute_logits``, and
says what it serves in the class attributes ``pooling_task`` ("embed" or
"classify") and ``is_encoder`` (bidirectional, no KV cache; its ``forward``
also takes ``token_type_ids``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from octavo.core.attention import AttentionBackend, AttentionSpec
from octavo.core.pooling_params import PoolerConfig
from octavo.models.config import ModelArchConfig
from octavo.ops import LayerOps, reference_layer_ops
from octavo.quantization.base import QuantizationConfig


@dataclass
class ModelInitContext:
    config: ModelArchConfig
    dtype: torch.dtype
    quant_config: QuantizationConfig | None
    # The platform's choice of attention backend for a given spec.
    attention_backend: Callable[[AttentionSpec], AttentionBackend]
    max_model_len: int
    block_size: int
    kv_cache_dtype: torch.dtype
    # Mixture-of-experts layers: whole experts per tensor-parallel rank
    # instead of a slice of every expert (``--enable-expert-parallel``).
    expert_parallel: bool = False
    # The layer ops resolved for this model (plugin API 1.1). Octavo's layers
    # take them from the scope the builder opens around construction; a
    # model may also pass them explicitly.
    ops: LayerOps = field(default_factory=reference_layer_ops)
    # How the model pools, when it serves embeddings or classification.
    pooler: PoolerConfig | None = None
