"""Gemma 2's fused decode path end to end: its sandwich norms (norm, add,
norm in one op, across layer boundaries too) and its GeGLU fused into the
gate-up GEMV, on Octavo's Triton kernels (the interpreter on the CPU),
greedy tokens identical to the same model on the references."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from tests.plugins.fake_plugins import sandbox  # noqa: E402, F401

FUSED_OPS = (
    "rms_norm_f32_scale", "fused_add_rms_norm_f32_scale", "post_norm_add_rms_norm_f32_scale",
    "linear", "linear_gelu_tanh_and_mul",
)


def greedy_tokens(llm) -> list[list[int]]:
    from octavo import SamplingParams

    prompts = [{"prompt_token_ids": [5, 9, 23, 7, 41, 3]}, {"prompt_token_ids": [12, 8, 30]}]
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def test_gemma2_fused_norms_and_geglu_match_the_references(family_dir, make_llm, sandbox):
    from octavo.plugins.manager import reset_plugin_manager
    from tests.kernels.triton_on_cpu import add_triton_on_cpu

    path = family_dir("gemma2")
    expected = greedy_tokens(make_llm(path))

    add_triton_on_cpu(sandbox, gemv_max_tokens=2, ops=FUSED_OPS)  # both requests' decode rows take the GEMV
    reset_plugin_manager()
    llm = make_llm(path)
    model = llm.engine.executor.worker.runner.model.model
    layers = list(model.layers)
    ops = layers[0].input_layernorm.ops
    assert ops.choice("post_norm_add_rms_norm_f32_scale").impl == "triton"
    assert ops.choice("linear_gelu_tanh_and_mul").describe() == (
        "linear_gelu_tanh_and_mul: gemv [triton_on_cpu] up to 2 tokens, else composed (linear, gelu_tanh_and_mul)"
    )
    assert all(layer.mlp.linear_act_and_mul is ops.linear_gelu_tanh_and_mul for layer in layers)
    # Every layer's last norm fuses the next one's input norm; the last layer, the final norm.
    assert model.next_norms == [layer.input_layernorm for layer in layers[1:]] + [model.norm]
    assert greedy_tokens(llm) == expected
