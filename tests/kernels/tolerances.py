"""Where kernel tests run, and how exactly their results must match."""

from __future__ import annotations

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# Triton's interpreter truncates float32 -> bfloat16 casts where GPUs round
# to nearest even, so bfloat16 results may differ by one ulp there.
INTERPRETING = DEVICE.type == "cpu"


def assert_same_rounding(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Bit-equal, except bfloat16 under the interpreter: within one ulp."""
    if INTERPRETING and actual.dtype == torch.bfloat16:
        torch.testing.assert_close(actual, expected, atol=0, rtol=2**-7)
    else:
        assert torch.equal(actual, expected)
