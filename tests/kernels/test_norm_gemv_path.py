"""Decoders with their norms inside the decode GEMVs (``fused_add_rms_norm_linear``
before qkv, ``fused_add_rms_norm_route`` before a MoE layer's experts), on
Octavo's Triton kernels registered for the CPU (the interpreter): the same
greedy tokens as the reference ops, the fused ops taken at decode, and a
one-token MoE layer after attention in three launches."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from tests.kernels.tolerances import INTERPRETING  # noqa: E402
from tests.plugins.fake_plugins import sandbox  # noqa: E402, F401

FUSED_OPS = ("fused_add_rms_norm_linear", "fused_add_rms_norm_route")
PROMPTS = [{"prompt_token_ids": [5, 9, 23, 7, 41, 3]}]


def _greedy(llm) -> list[list[int]]:
    from octavo import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]


@pytest.mark.skipif(not INTERPRETING, reason="the Triton path on the CPU platform, through the interpreter")
@pytest.mark.parametrize("family", ["llama", "qwen3_moe"])
def test_norms_in_the_decode_gemvs_give_the_reference_tokens(family, request, make_llm, sandbox, monkeypatch):
    from octavo.kernels import norm_gemv
    from octavo.plugins.manager import reset_plugin_manager
    from tests.kernels.triton_on_cpu import add_triton_on_cpu, count_calls

    path = request.getfixturevalue("llama_dir") if family == "llama" else request.getfixturevalue("family_dir")(family)
    plain = make_llm(path)
    expected = _greedy(plain)
    # Without an implementation (the composition only), the layers call the
    # norm, the projection and the MoE block's own routing as before.
    plain_layers = list(plain.engine.executor.worker.runner.model.model.layers)
    assert not any(layer.norm_qkv or layer.norm_route for layer in plain_layers)
    calls = count_calls(monkeypatch, norm_gemv, FUSED_OPS)
    monkeypatch.setenv("OCTAVO_NORM_GEMV", "1")  # off by default (no faster on an H100)
    add_triton_on_cpu(sandbox, ops=("linear", "moe_topk_softmax", "fused_moe") + FUSED_OPS)
    reset_plugin_manager()
    llm = make_llm(path)
    layers = list(llm.engine.executor.worker.runner.model.model.layers)
    assert all(layer.norm_qkv for layer in layers)
    routed = [layer.norm_route for layer in layers]  # Qwen3-MoE's sparse layers (its first is dense)
    assert routed == [type(layer.mlp).__name__ == "SparseMoeBlock" for layer in layers]
    assert any(routed) == (family == "qwen3_moe")
    assert layers[0].input_layernorm.ops.choice("fused_add_rms_norm_linear").describe() == (
        "fused_add_rms_norm_linear: norm_gemv [triton_on_cpu] up to 1 token and where it accepts the call, "
        "else composed (fused_add_rms_norm, linear)"
    )
    assert _greedy(llm) == expected
    # Three one-token decode steps (the fourth token comes from the last of
    # them): every layer but the first fuses its input norm into qkv.
    num_layers, decode_steps = len(layers), 3
    assert calls["fused_add_rms_norm_linear"] == decode_steps * (num_layers - 1)
    assert calls["fused_add_rms_norm_route"] == decode_steps * sum(routed)


@pytest.mark.skipif(not INTERPRETING, reason="counts launches through Triton's interpreter")
def test_one_token_moe_layer_after_attention_is_three_launches(monkeypatch):
    """The post-attention norm, the router and its top-k in one kernel,
    then the experts' gate-up and down (the unfused layer: norm, router
    GEMV, top-k, gate-up, down)."""
    from triton.runtime.interpreter import InterpretedFunction

    from octavo.kernels import norm_gemv
    from octavo.kernels.fused_moe import fused_moe
    from octavo.models.layers.norm import RMSNorm
    from octavo.ops import reference_layer_ops
    from tests.kernels.test_moe_decode import _moe_block

    ops = dataclasses.replace(reference_layer_ops(), fused_moe=fused_moe,
                              fused_add_rms_norm_route=norm_gemv.fused_add_rms_norm_route)
    block, reference_block = _moe_block(ops), _moe_block(reference_layer_ops())
    norm = RMSNorm(32, 1e-6, ops=ops)
    norm.weight.copy_(1.0 + 0.1 * torch.randn(32, generator=torch.Generator().manual_seed(3)))
    hidden, residual = (torch.randn(1, 32, generator=torch.Generator().manual_seed(s)) for s in (5, 6))
    launches = []
    original_run = InterpretedFunction.run

    def run(self, *args, **kwargs):
        launches.append(self.__name__)
        return original_run(self, *args, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", run)
    weights, ids, normed, summed = norm.add_then_route(hidden, residual, block.gate.weight, block.top_k, block.renormalize)
    out = block.after_route(normed, weights, ids)
    assert launches == ["_norm_gemv_kernel", "_gate_up_kernel", "_down_topk_sum_kernel"]
    norm_reference = RMSNorm(32, 1e-6, ops=reference_layer_ops())
    norm_reference.weight.copy_(norm.weight)
    expected_normed, expected_summed = norm_reference(hidden, residual)
    torch.testing.assert_close(summed, expected_summed)
    torch.testing.assert_close(out, reference_block(expected_normed), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("setting, registered", [(None, False), ("0", False), ("1", True), ("yes", False)])
def test_the_kernels_serve_their_ops_only_when_turned_on(setting, registered, monkeypatch):
    from octavo.kernels.builtin import builtin_layer_ops

    if setting is None:
        monkeypatch.delenv("OCTAVO_NORM_GEMV", raising=False)
    else:
        monkeypatch.setenv("OCTAVO_NORM_GEMV", setting)
    served = {impl.op for impl in builtin_layer_ops() if impl.name == "norm_gemv"}
    assert served == (set(FUSED_OPS) if registered else set())
