"""The skinny-batch GEMV (and its fused SiLU- and GeGLU-and-mul) against ``F.linear``."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from octavo.kernels.gemv import GemvConfig, gemv, gemv_gelu_tanh_mul, gemv_silu_mul, linear_gemv  # noqa: E402
from octavo.ops.reference import gelu_tanh_and_mul as gelu_tanh_and_mul_reference  # noqa: E402
from octavo.ops.reference import silu_and_mul as silu_and_mul_reference  # noqa: E402
from tests.kernels.tolerances import INTERPRETING  # noqa: E402

TOLERANCES = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}
CONFIGS = [
    GemvConfig(block_n=8, block_k=32, num_warps=4, num_stages=2, defer_reduce=True),
    GemvConfig(block_n=4, block_k=64, num_warps=2, num_stages=1, defer_reduce=False),
    # Prefetching: three whole K steps; two with a partial last one; one step only (no loop body).
    GemvConfig(block_n=8, block_k=32, num_warps=4, num_stages=2, defer_reduce=True, prefetch=True),
    GemvConfig(block_n=4, block_k=64, num_warps=2, num_stages=1, defer_reduce=False, prefetch=True),
    GemvConfig(block_n=2, block_k=128, num_warps=2, num_stages=1, defer_reduce=True, prefetch=True),
    # Pipelined by Triton (the interpreter runs the loop as written; the launch takes the stages).
    GemvConfig(block_n=8, block_k=32, num_warps=4, num_stages=3, defer_reduce=True, pipelined=True),
]
CONFIG_IDS = ["defer", "per_step", "defer_prefetch", "per_step_prefetch", "one_step_prefetch", "pipelined"]


def randn(*shape, dtype=torch.float32, device="cpu", seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(device)


@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("num_tokens", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gemv_matches_linear(dtype, num_tokens, config, device):
    # 44 features: not a multiple of block_n; 96 inputs: a multiple of 32, not of 64.
    x = randn(num_tokens, 96, dtype=dtype, device=device)
    weight = randn(44, 96, dtype=dtype, device=device, seed=1)
    bias = randn(44, dtype=dtype, device=device, seed=2)
    expected = F.linear(x.float(), weight.float(), bias.float()).to(dtype)
    torch.testing.assert_close(gemv(x, weight, bias, config=config), expected, **TOLERANCES[dtype])
    torch.testing.assert_close(gemv(x, weight, config=config), F.linear(x.float(), weight.float()).to(dtype),
                               **TOLERANCES[dtype])


def gated_tolerance(dtype: torch.dtype) -> dict[str, float]:
    # The interpreter truncates each of the fused path's four bfloat16 casts
    # (gate, up, activation, product) where a GPU rounds to nearest: up to
    # about four ulps apart, where the GPU stays within the GEMV tolerance.
    if INTERPRETING and dtype == torch.bfloat16:
        return dict(atol=2e-2, rtol=4 * 2**-7)
    return TOLERANCES[dtype]


GATED_REFERENCES = {"silu": silu_and_mul_reference, "gelu_tanh": gelu_tanh_and_mul_reference}


@pytest.mark.parametrize("gated", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gemv_gated_matches_unfused(dtype, config, gated, device):
    x = randn(2, 80, dtype=dtype, device=device)
    weight = randn(2 * 36, 80, dtype=dtype, device=device, seed=1) * 0.3  # [gate; up], 36 features each
    bias = randn(2 * 36, dtype=dtype, device=device, seed=2)
    for b in (None, bias):
        gate_up = F.linear(x.float(), weight.float(), None if b is None else b.float()).to(dtype)
        out = gemv(x, weight, b, gated=gated, config=config)
        assert out.shape == (2, 36)
        torch.testing.assert_close(out, GATED_REFERENCES[gated](gate_up), **gated_tolerance(dtype))
    torch.testing.assert_close(gemv_silu_mul(x, weight, None), gemv(x, weight, None, silu_mul=True))
    torch.testing.assert_close(gemv_gelu_tanh_mul(x, weight, None), gemv(x, weight, None, gated="gelu_tanh"))


def test_gemv_gelu_tanh_matches_hf_far_into_the_tails(device):
    # Gate values up to +-12 reach tanh's saturation, where the kernel's
    # exp-based tanh must still agree with torch's (HF's gelu_pytorch_tanh).
    x = torch.eye(4, 64, device=device)
    gate = torch.linspace(-12, 12, 32).reshape(8, 4)
    weight = torch.zeros(16, 64)
    weight[:8, :4], weight[8:, :4] = gate, 1.0  # gate features read x's first 4 inputs; up = 1
    weight = weight.to(device)
    expected = gelu_tanh_and_mul_reference(F.linear(x, weight))
    torch.testing.assert_close(gemv(x, weight, gated="gelu_tanh"), expected, **TOLERANCES[torch.float32])


def test_gemv_refuses_unknown_activation(device):
    with pytest.raises(ValueError, match="relu"):
        gemv(randn(1, 32, device=device), randn(8, 32, device=device), gated="relu")


def test_gemv_reads_strided_rows(device):
    # A view with a row stride larger than its width (a slice of a wider buffer).
    wide = randn(2, 128, device=device)
    x = wide[:, :64]
    weight = randn(16, 64, device=device, seed=1)
    torch.testing.assert_close(gemv(x, weight), F.linear(x, weight), **TOLERANCES[torch.float32])


def test_linear_gemv_takes_what_the_kernel_cannot(device):
    # The layer op's entry point: 2-D rows for the kernel, F.linear for the rest.
    weight = randn(24, 32, device=device, seed=1)
    for x in (randn(0, 32, device=device), randn(1, 32, device=device), randn(2, 1, 32, device=device)):
        out = linear_gemv(x, weight, None)
        assert out.shape == (*x.shape[:-1], 24)
        torch.testing.assert_close(out, F.linear(x, weight), **TOLERANCES[torch.float32])


def test_gemv_rejects_bad_input(device):
    with pytest.raises(ValueError, match="at most 8"):
        gemv(randn(9, 32, device=device), randn(8, 32, device=device))
    with pytest.raises(ValueError, match="contiguous"):
        gemv(randn(1, 32, device=device), randn(32, 8, device=device).t())


def test_configs_from_environment(monkeypatch):
    from octavo.kernels import gemv as module

    module.config_from_env.cache_clear()
    monkeypatch.setenv("OCTAVO_GEMV_SILU", "2,512,8,2,0")
    assert module.default_config(True) == GemvConfig(2, 512, 8, 2, defer_reduce=False)
    assert module.default_config(False) == module.DEFAULT_CONFIG
    monkeypatch.setenv("OCTAVO_GEMV", "many")
    module.config_from_env.cache_clear()  # read once per process
    with pytest.raises(ValueError, match="OCTAVO_GEMV"):
        module.default_config(False)
    module.config_from_env.cache_clear()


def test_tuned_configs_keep_their_tiles_at_one_row():
    # A swept config wider than the default's products runs as swept at one
    # row; more rows take fewer feature rows, then a narrower K tile, so that
    # registers do not spill and the warps stay along K.
    from octavo.kernels import gemv as module

    wide = GemvConfig(4, 4096, 8, 2)
    assert module.fit_to_rows(wide, 1) == wide
    assert module.fit_to_rows(wide, 2) == GemvConfig(2, 4096, 8, 2)
    assert module.fit_to_rows(wide, 8) == GemvConfig(1, 2048, 8, 2)
    default = module.DEFAULT_CONFIG  # 4 features x 2,048 inputs: 8,192 products at one row
    assert module.fit_to_rows(default, 2) == dataclasses.replace(default, block_n=2)
    assert module.fit_to_rows(default, 4) == dataclasses.replace(default, block_n=1)
    assert module.fit_to_rows(default, 8) == dataclasses.replace(default, block_n=1, block_k=1024)
    per_step = GemvConfig(4, 2048, 4, 2, defer_reduce=False)  # nothing held across steps: as it is
    assert module.fit_to_rows(per_step, 8) == per_step


def test_gated_gemv_tiles_for_several_rows(monkeypatch, device):
    # One row: the swept config; 2-8 rows: one feature a program, deferred, 4 warps along K.
    from octavo.kernels import gemv as module

    monkeypatch.delenv("OCTAVO_GEMV_SILU", raising=False)
    module.config_from_env.cache_clear()
    try:
        weight = randn(2 * 36, 80, device=device, seed=1) * 0.3
        for rows in (2, 5):
            x = randn(rows, 80, device=device)
            expected = silu_and_mul_reference(F.linear(x, weight))
            torch.testing.assert_close(gemv(x, weight, gated="silu"), expected, **gated_tolerance(torch.float32))
        assert module.default_config(True, 1) == module.DEFAULT_SILU_CONFIG
        assert module.default_config(True, 2) == GemvConfig(1, 2048, 4, 2, defer_reduce=True)
        assert module.default_config(True, 3) == GemvConfig(1, 1024, 4, 2, defer_reduce=True)
        assert module.default_config(True, 8) == GemvConfig(1, 1024, 4, 2, defer_reduce=True)
        monkeypatch.setenv("OCTAVO_GEMV_SILU", "2,512,8,2,0")  # a tuning run's tiles win at every row count
        module.config_from_env.cache_clear()
        assert module.default_config(True, 4) == GemvConfig(2, 512, 8, 2, defer_reduce=False)
    finally:
        module.config_from_env.cache_clear()


def test_scaled_gemv_reads_its_own_tiles(monkeypatch, device):
    # OCTAVO_GEMV_8BIT tunes the 8-bit weight GEMV apart from the 16-bit one.
    from octavo.kernels import gemv as module

    module.config_from_env.cache_clear()
    x, weight = randn(1, 64, device=device), randn(8, 64, device=device, seed=1)
    scale = torch.rand(8, device=device) + 0.5
    for value, config in (("2,32,4,2", GemvConfig(2, 32, 4, 2)), ("2,16,4,2,1,1", GemvConfig(2, 16, 4, 2, prefetch=True))):
        module.config_from_env.cache_clear()
        monkeypatch.setenv("OCTAVO_GEMV_8BIT", value)
        try:
            out = module.scaled_linear_gemv(x, weight, scale, None)
            torch.testing.assert_close(out, F.linear(x, weight * scale[:, None]), **TOLERANCES[torch.float32])
            assert module.config_from_env("OCTAVO_GEMV_8BIT") == config
        finally:
            module.config_from_env.cache_clear()
