"""Pixtral's vision encoder (transformers' ``PixtralVisionModel``): the image side of
Mistral Small 3.1 / 3.2 (``mistral3.py``).

Unlike CLIP's, it takes an image at its own size (height and width multiples
of the patch size): patches (a convolution without bias), ``ln_pre``
(RMSNorm), then pre-norm transformer layers with full (non-causal) attention
over the image's patches, positions given by a 2D rotary embedding over the
patch grid (no learned positions, no class row). A multimodal model reads the
hidden states after one layer (HF's ``hidden_states`` index: 0 is ``ln_pre``'s
output, ``i`` the output of layer ``i``), so only the layers up to it are built.

One image at a time (HF packs several into one sequence with a block mask;
attention within one image is the same), once per image, not per token:
plain torch modules in the model dtype, the whole tower on every rank.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from octavo.errors import InvalidArgumentError, ModelLoadError
from octavo.models.clip_vision import activation, feature_layer_index

# PixtralVisionConfig's defaults, for the keys a saved config may leave out.
_DEFAULTS = {
    "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
    "num_channels": 3, "patch_size": 16, "hidden_act": "gelu",
}
_NORM_EPS = 1e-5  # HF fixes ln_pre's and the layers' epsilon, whatever the config says


def pixtral_config(vision_config: dict[str, Any]) -> dict[str, Any]:
    """The vision config with PixtralVisionConfig's defaults filled in."""
    return {**_DEFAULTS, **{k: v for k, v in vision_config.items() if v is not None}}


def rope_theta(cfg: dict[str, Any]) -> float:
    """transformers 5 saves ``rope_parameters``; Mistral's releases a top-level ``rope_theta``."""
    params = cfg.get("rope_parameters") or {}
    return float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))


class VisionRMSNorm(nn.Module):
    """HF's RMSNorm: normalized in float32, cast back, then scaled by the weight."""

    def __init__(self, hidden: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def axial_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """``[head_dim / 2]`` frequencies: the even-indexed ones of the usual RoPE
    frequencies for the patch row, then the odd-indexed ones for its column."""
    if head_dim % 4:
        raise ModelLoadError(f"config.json: a vision head size of {head_dim} is not a multiple of 4 (2D rotary)")
    steps = torch.arange(0, head_dim, 2, dtype=torch.float, device="cpu")  # HF's values, whatever the build device
    inv_freq = 1.0 / (theta ** (steps / head_dim))
    return torch.cat([inv_freq[0::2], inv_freq[1::2]])


def grid_cos_sin(rows: int, cols: int, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin ``[rows * cols, head_dim]`` for the patches in row-major order;
    the angles repeat over both halves of the head (rotate_half's convention)."""
    device = inv_freq.device
    row, col = torch.meshgrid(torch.arange(rows, device=device), torch.arange(cols, device=device), indexing="ij")
    quarter = inv_freq.numel() // 2
    angles = torch.cat([row.reshape(-1, 1).float() * inv_freq[:quarter],
                        col.reshape(-1, 1).float() * inv_freq[quarter:]], dim=-1)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


class PixtralAttention(nn.Module):
    def __init__(self, hidden: int, num_heads: int, dtype: torch.dtype) -> None:
        super().__init__()
        if hidden % num_heads:
            raise ModelLoadError(f"config.json: vision hidden_size {hidden} is not a multiple of {num_heads} heads")
        self.num_heads, self.head_size = num_heads, hidden // num_heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            nn.Linear(hidden, hidden, bias=False, dtype=dtype) for _ in range(4)
        )

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]

        def heads(t: torch.Tensor) -> torch.Tensor:  # [L, H] -> [heads, L, head_size]
            return t.view(rows, self.num_heads, self.head_size).transpose(0, 1)

        q, k = heads(self.q_proj(x)), heads(self.k_proj(x))
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        # SDPA's default scale is head_size ** -0.5, Pixtral's; no mask: every patch sees every other.
        out = F.scaled_dot_product_attention(q, k, heads(self.v_proj(x)))
        return self.o_proj(out.transpose(0, 1).reshape(rows, -1))


class PixtralFeedForward(nn.Module):
    def __init__(self, hidden: int, intermediate: int, act_name: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.act = activation(act_name, "vision_config.hidden_act")
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False, dtype=dtype)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False, dtype=dtype)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class PixtralLayer(nn.Module):
    """Pre-norm: x + attention(attention_norm(x)), then x + feed_forward(ffn_norm(x))."""

    def __init__(self, cfg: dict[str, Any], dtype: torch.dtype) -> None:
        super().__init__()
        hidden = int(cfg["hidden_size"])
        self.attention_norm = VisionRMSNorm(hidden, _NORM_EPS, dtype)
        self.attention = PixtralAttention(hidden, int(cfg["num_attention_heads"]), dtype)
        self.ffn_norm = VisionRMSNorm(hidden, _NORM_EPS, dtype)
        self.feed_forward = PixtralFeedForward(hidden, int(cfg["intermediate_size"]), cfg["hidden_act"], dtype)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class PixtralVisionTower(nn.Module):
    """``forward(pixel_values [1, C, H, W]) -> [num_patches, hidden]``, patches in
    row-major order over the ``H / patch`` x ``W / patch`` grid: the hidden states
    after layer ``feature_layer`` (HF's ``hidden_states`` index)."""

    def __init__(self, vision_config: dict[str, Any], dtype: torch.dtype, feature_layer: int = -1) -> None:
        super().__init__()
        cfg = pixtral_config(vision_config)
        hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        self.patch_size = int(cfg["patch_size"])
        self.image_size = int(cfg["image_size"])  # the largest side the processor sends
        built = feature_layer_index(feature_layer, int(cfg["num_hidden_layers"]))
        self.patch_conv = nn.Conv2d(int(cfg["num_channels"]), hidden, kernel_size=self.patch_size,
                                    stride=self.patch_size, bias=False, dtype=dtype)
        self.ln_pre = VisionRMSNorm(hidden, _NORM_EPS, dtype)
        self.transformer = nn.Module()
        self.transformer.layers = nn.ModuleList(PixtralLayer(cfg, dtype) for _ in range(built))
        # HF reads the head size as hidden // heads whatever head_dim the config saves.
        # A plain attribute, not a buffer: no checkpoint tensor, and kept off meta builds.
        self.inv_freq = axial_inv_freq(hidden // heads, rope_theta(cfg))
        self.requires_grad_(False)  # inference only

    def grid(self, pixel_values: torch.Tensor) -> tuple[int, int]:
        """The patch grid (rows, columns) of one image's pixel values ``[1, C, H, W]``."""
        if pixel_values.dim() != 4 or pixel_values.shape[0] != 1:
            raise InvalidArgumentError(f"pixel values of shape {tuple(pixel_values.shape)}; one image [1, C, H, W] is")
        height, width = pixel_values.shape[-2:]
        if height % self.patch_size or width % self.patch_size or not height or not width:
            raise InvalidArgumentError(
                f"pixel values of {height}x{width}; this vision tower takes multiples of {self.patch_size}"
            )
        return height // self.patch_size, width // self.patch_size

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        rows, cols = self.grid(pixel_values)
        weight = self.patch_conv.weight
        patches = self.patch_conv(pixel_values.to(weight.device, weight.dtype))  # [1, hidden, rows, cols]
        hidden = self.ln_pre(patches[0].flatten(1).t())
        cos, sin = grid_cos_sin(rows, cols, self.inv_freq.to(hidden.device), hidden.dtype)
        for layer in self.transformer.layers:
            hidden = layer(hidden, cos, sin)
        return hidden
