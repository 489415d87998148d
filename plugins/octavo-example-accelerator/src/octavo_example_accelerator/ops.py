"""The example platform's own layer-op implementations (plugin API 1.1).

A vendor brings its kernels by registering them for its platform through
``octavo_layer_ops``; Octavo's layers then call them, with no change to
Octavo's code or classes. Here two of them, written in plain torch so that
they run anywhere (a real vendor would call its own kernels):

* ``rms_norm``: the mean of squares as a float32 dot product, then the
  reference's rounding steps (normalise in float32, round to the input
  dtype, scale by the weight);
* ``linear`` for skinny batches (decode): each output feature a float32
  dot product of the token row with the weight row, rounded once. It
  serves calls of up to ``SKINNY_MAX_TOKENS`` tokens; larger batches go on
  to the reference (``F.linear``).

Both are checked against Octavo's references by the conformance kit
(``octavo plugins check example --only ops``).
"""

from __future__ import annotations

import torch

from octavo.ops import OpImpl

SKINNY_MAX_TOKENS = 4


def example_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.to(torch.float32)
    mean_square = (x32 * x32).sum(dim=-1, keepdim=True) / x.shape[-1]
    normed = (x32 / torch.sqrt(mean_square + eps)).to(x.dtype)
    return weight * normed


def example_skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = torch.einsum("tk,nk->tn", x.to(torch.float32), weight.to(torch.float32))
    if bias is not None:
        out = out + bias.to(torch.float32)
    return out.to(x.dtype)


def example_layer_ops() -> list[OpImpl]:
    return [
        OpImpl("rms_norm", "example", example_rms_norm, platforms=("example",), priority=10),
        OpImpl(
            "linear", "example_skinny", example_skinny_linear, platforms=("example",), priority=10,
            max_tokens=SKINNY_MAX_TOKENS,
        ),
    ]
