"""SigLIP's vision encoder (transformers' ``SiglipVisionModel``), as LLaVA
checkpoints with a SigLIP tower (llava-interleave-qwen) use it.

Patches (a convolution with bias, stride the patch size), learned positions
and no class row, no layernorm before the layers, then the same pre-norm
transformer layers as CLIP's (``clip_vision.ClipEncoderLayer``: layer_norm1,
q/k/v/out_proj with bias, full attention at scale head_size ** -0.5,
layer_norm2, fc1/fc2). LLaVA reads the hidden states after one layer (HF's
``hidden_states`` indexing: 0 is the embeddings, ``i`` the output of layer
``i``), so only the layers up to it are built; ``post_layernorm`` and the
pooling ``head`` are never applied to ``hidden_states``, so they have no
parameter here and their checkpoint tensors are skipped.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from octavo.models.clip_vision import ClipVisionTower, fixed_size_patches

# SiglipVisionConfig's defaults, for the keys a saved config may leave out.
_DEFAULTS = {
    "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
    "num_channels": 3, "image_size": 224, "patch_size": 16, "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6,
}


class SiglipEmbeddings(nn.Module):
    def __init__(self, cfg: dict[str, Any], dtype: torch.dtype) -> None:
        super().__init__()
        hidden, patch = cfg["hidden_size"], cfg["patch_size"]
        self.image_size = cfg["image_size"]
        self.patch_embedding = nn.Conv2d(
            cfg["num_channels"], hidden, kernel_size=patch, stride=patch, bias=True, dtype=dtype
        )
        self.num_patches = (self.image_size // patch) ** 2
        self.position_embedding = nn.Embedding(self.num_patches, hidden, dtype=dtype)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return fixed_size_patches(self.patch_embedding, self.image_size, pixel_values) + self.position_embedding.weight


class SiglipVisionTower(ClipVisionTower):
    """``forward(pixel_values [N, C, H, W]) -> [N, num_patches, hidden]``: the
    hidden states after layer ``feature_layer`` (HF's ``hidden_states`` index);
    CLIP's layers, no class row, no norm before them."""

    DEFAULTS = _DEFAULTS
    embeddings_class = SiglipEmbeddings
    pre_norm = False
    class_row = False
