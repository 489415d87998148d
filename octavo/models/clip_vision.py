"""CLIP's vision encoder (transformers' ``CLIPVisionModel``): the image side of LLaVA-1.5.

Patches (a convolution without bias), a learned class row and learned
positions, ``pre_layrnorm`` (HF's spelling), then pre-norm transformer
layers with full (non-causal) attention over one image's rows. A
multimodal model reads the hidden states after one layer (HF's
``hidden_states`` indexing: 0 is the embeddings after ``pre_layrnorm``,
``i`` the output of layer ``i``), so only the layers up to it are built;
the others' checkpoint tensors find no parameter and are skipped, as is
``post_layernorm``, which HF never applies to ``hidden_states``.

This runs once per image, not per token: plain torch modules in the model
dtype, the whole tower on every tensor-parallel rank (nothing sharded).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from octavo.errors import InvalidArgumentError, ModelLoadError
from octavo.models.bert import ACTIVATIONS


def _quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


# HF's activation names -> the function: BERT's, plus CLIP's sigmoid approximation.
VISION_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {**ACTIVATIONS, "quick_gelu": _quick_gelu}

# CLIPVisionConfig's defaults, for the keys a saved config may leave out.
_DEFAULTS = {
    "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
    "num_channels": 3, "image_size": 224, "patch_size": 32, "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5,
}


def activation(name: str, what: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in VISION_ACTIVATIONS:
        raise ModelLoadError(f"config.json: {what} {name!r} is not supported ({', '.join(VISION_ACTIVATIONS)} are)")
    return VISION_ACTIVATIONS[name]


class ClipAttention(nn.Module):
    def __init__(self, hidden: int, num_heads: int, dtype: torch.dtype) -> None:
        super().__init__()
        if hidden % num_heads:
            raise ModelLoadError(f"config.json: vision hidden_size {hidden} is not a multiple of {num_heads} heads")
        self.num_heads, self.head_size = num_heads, hidden // num_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            nn.Linear(hidden, hidden, dtype=dtype) for _ in range(4)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        images, rows, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:  # [N, L, H] -> [N, heads, L, head_size]
            return t.view(images, rows, self.num_heads, self.head_size).transpose(1, 2)

        # SDPA's default scale is head_size ** -0.5, CLIP's.
        out = F.scaled_dot_product_attention(heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x)))
        return self.out_proj(out.transpose(1, 2).reshape(images, rows, -1))


class ClipMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, act: Callable, dtype: torch.dtype) -> None:
        super().__init__()
        self.act = act
        self.fc1 = nn.Linear(hidden, intermediate, dtype=dtype)
        self.fc2 = nn.Linear(intermediate, hidden, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class ClipEncoderLayer(nn.Module):
    """Pre-norm: x + attn(norm1(x)), then x + mlp(norm2(x))."""

    def __init__(self, cfg: dict[str, Any], act: Callable, dtype: torch.dtype) -> None:
        super().__init__()
        hidden, eps = cfg["hidden_size"], cfg["layer_norm_eps"]
        self.layer_norm1 = nn.LayerNorm(hidden, eps=eps, dtype=dtype)
        self.self_attn = ClipAttention(hidden, cfg["num_attention_heads"], dtype)
        self.layer_norm2 = nn.LayerNorm(hidden, eps=eps, dtype=dtype)
        self.mlp = ClipMLP(hidden, cfg["intermediate_size"], act, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class ClipEmbeddings(nn.Module):
    def __init__(self, cfg: dict[str, Any], dtype: torch.dtype) -> None:
        super().__init__()
        hidden, patch = cfg["hidden_size"], cfg["patch_size"]
        self.image_size = cfg["image_size"]
        self.patch_embedding = nn.Conv2d(
            cfg["num_channels"], hidden, kernel_size=patch, stride=patch, bias=False, dtype=dtype
        )
        self.class_embedding = nn.Parameter(torch.empty(hidden, dtype=dtype))
        self.num_patches = (self.image_size // patch) ** 2
        self.position_embedding = nn.Embedding(self.num_patches + 1, hidden, dtype=dtype)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        patches = fixed_size_patches(self.patch_embedding, self.image_size, pixel_values)
        cls = self.class_embedding.expand(pixel_values.shape[0], 1, -1)
        return torch.cat([cls, patches], dim=1) + self.position_embedding.weight


def fixed_size_patches(patch_embedding: nn.Conv2d, image_size: int, pixel_values: torch.Tensor) -> torch.Tensor:
    """``[N, patches, hidden]``: the patch convolution's rows of images of the one size the
    tower's position embeddings cover (no interpolation, as HF's default)."""
    height, width = pixel_values.shape[-2:]
    if height != image_size or width != image_size:
        raise InvalidArgumentError(f"pixel values of {height}x{width}; this vision tower takes {image_size}x{image_size}")
    weight = patch_embedding.weight
    patches = patch_embedding(pixel_values.to(weight.device, weight.dtype))  # [N, hidden, grid, grid]
    return patches.flatten(2).transpose(1, 2)


def feature_layer_index(feature_layer: int, num_layers: int) -> int:
    """HF's ``hidden_states`` index (negative: from the end of num_layers + 1) as 0..num_layers."""
    index = feature_layer + num_layers + 1 if feature_layer < 0 else feature_layer
    if not 0 <= index <= num_layers:
        raise ModelLoadError(
            f"config.json: vision_feature_layer {feature_layer} is outside the vision tower's "
            f"{num_layers + 1} hidden states"
        )
    return index


class ClipVisionTower(nn.Module):
    """``forward(pixel_values [N, C, H, W]) -> [N, 1 + num_patches, hidden]``: the
    hidden states after layer ``feature_layer`` (HF's ``hidden_states`` index).
    A subclass may change the config defaults, the embeddings and the norm before
    the layers (SigLIP's tower: ``siglip_vision.py``)."""

    DEFAULTS: dict[str, Any] = _DEFAULTS
    embeddings_class: type[nn.Module] = ClipEmbeddings
    pre_norm = True  # CLIP's ``pre_layrnorm``
    class_row = True  # the class embedding's row before the patches

    @classmethod
    def full_config(cls, vision_config: dict[str, Any]) -> dict[str, Any]:
        """``vision_config`` with the tower's defaults where a saved config leaves keys out."""
        return {**cls.DEFAULTS, **{k: v for k, v in vision_config.items() if v is not None}}

    def __init__(self, vision_config: dict[str, Any], dtype: torch.dtype, feature_layer: int = -1) -> None:
        super().__init__()
        cfg = self.full_config(vision_config)
        act = activation(cfg["hidden_act"], "vision_config.hidden_act")
        self.image_size, self.patch_size = int(cfg["image_size"]), int(cfg["patch_size"])
        self.hidden_size = int(cfg["hidden_size"])
        built = feature_layer_index(feature_layer, int(cfg["num_hidden_layers"]))
        self.embeddings = self.embeddings_class(cfg, dtype)
        if self.pre_norm:
            self.pre_layrnorm = nn.LayerNorm(cfg["hidden_size"], eps=cfg["layer_norm_eps"], dtype=dtype)
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList(ClipEncoderLayer(cfg, act, dtype) for _ in range(built))
        self.requires_grad_(False)  # inference only

    @property
    def num_patches(self) -> int:
        return self.embeddings.num_patches

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        hidden = self.embeddings(pixel_values)
        if self.pre_norm:
            hidden = self.pre_layrnorm(hidden)
        for layer in self.encoder.layers:
            hidden = layer(hidden)
        return hidden
