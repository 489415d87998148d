"""An fp8 (W8A8) Llama end to end with the activation quantizer fused into
its norms and SiLU-and-mul (``fused_add_rms_norm_fp8_linear``,
``silu_and_mul_fp8_linear``), on Octavo's Triton kernels (the interpreter on
the CPU, where ``torch._scaled_mm`` also runs): the fused layers take those
ops for prefill, the composition (norm, then the GEMV) for decode, and give
the tokens and logprobs of the same model on the unfused W8A8 path."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from tests.plugins.fake_plugins import sandbox  # noqa: E402, F401

UNFUSED_OPS = ("fused_add_rms_norm", "silu_and_mul", "fp8_linear")
FUSED_OPS = ("fused_add_rms_norm_fp8_linear", "silu_and_mul_fp8_linear")


def greedy(llm) -> list[tuple[list[int], list[float]]]:
    from octavo import SamplingParams

    prompts = [{"prompt_token_ids": [5, 9, 23, 7, 41, 3]}, {"prompt_token_ids": [12, 8, 30]}]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=0)
    results = []
    for output in llm.generate(prompts, params):
        completion = output.outputs[0]
        chosen = [step[token].logprob for step, token in zip(completion.logprobs, completion.token_ids)]
        results.append((completion.token_ids, chosen))
    return results


def _fp8_llm(make_llm, path, sandbox, ops):
    from octavo.plugins.manager import reset_plugin_manager
    from tests.kernels.triton_on_cpu import add_triton_on_cpu

    # Both requests' decode rows (2 tokens) take the GEMV; prefill the W8A8 path.
    add_triton_on_cpu(sandbox, gemv_max_tokens=2, ops=ops, unprobed=("fp8_linear",) + FUSED_OPS)
    reset_plugin_manager()
    return make_llm(path, quantization="fp8")


def test_fused_fp8_quantizers_match_the_unfused_path(llama_dir, make_llm, sandbox, monkeypatch):
    from octavo.kernels.quant import fp8_fused
    from tests.kernels.triton_on_cpu import count_calls

    calls = count_calls(monkeypatch, fp8_fused, FUSED_OPS)
    path = llama_dir
    expected = greedy(_fp8_llm(make_llm, path, sandbox, UNFUSED_OPS))
    assert calls == {name: 0 for name in FUSED_OPS}

    llm = _fp8_llm(make_llm, path, sandbox, UNFUSED_OPS + FUSED_OPS)
    layers = list(llm.engine.executor.worker.runner.model.model.layers)
    assert all(layer.fp8_qkv and layer.fp8_gate_up and layer.mlp.silu_fp8_down for layer in layers)
    ops = layers[0].input_layernorm.ops
    assert ops.choice("fused_add_rms_norm_fp8_linear").describe() == (
        "fused_add_rms_norm_fp8_linear: triton_quant+scaled_mm [triton_on_cpu] where it accepts the call, "
        "else composed (fused_add_rms_norm, fp8_linear)"
    )
    got = greedy(llm)
    assert [tokens for tokens, _ in got] == [tokens for tokens, _ in expected]
    for (_, ours), (_, theirs) in zip(got, expected):
        assert ours == pytest.approx(theirs, abs=1e-5)
    # The prefill step: every layer but the first (no residual yet) fuses its
    # input norm; every layer its post-attention norm and its SiLU.
    num_layers = len(layers)
    assert calls["fused_add_rms_norm_fp8_linear"] == 2 * num_layers - 1
    assert calls["silu_and_mul_fp8_linear"] == num_layers


def test_conformance_kit_checks_the_fused_fp8_ops(sandbox, tmp_path):
    import torch

    from octavo.platforms.cpu import CpuPlatform
    from octavo.testing.conformance.checks import make_context
    from octavo.testing.conformance.ops import check_ops
    from tests.kernels.triton_on_cpu import add_triton_on_cpu

    add_triton_on_cpu(sandbox, ops=FUSED_OPS, unprobed=FUSED_OPS)
    ctx = make_context(CpuPlatform(), tmp_path)
    ctx.dtypes = [torch.float32, torch.bfloat16]
    summary = check_ops(ctx)
    for op in FUSED_OPS:
        assert f"{op}=triton_quant+scaled_mm [triton_on_cpu]" in summary
