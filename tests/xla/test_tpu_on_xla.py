"""The ``tpu`` platform for real on torch_xla, on its CPU PJRT device.

torch_xla traces, compiles and caches XLA programs on the host exactly as it
does for a TPU. These tests need torch_xla (torch 2.9 + torch_xla 2.9), which
Octavo's main environment (torch>=2.11) cannot hold: they run in their own
virtualenv, built and run by ``.ci/xla-suite``, and are skipped elsewhere.

Evidence: the demo model and two random-weight architectures give the CPU
platform's greedy tokens in float32; after warm-up, a mix of prompt lengths
and 64 decode steps compile nothing new; the conformance kit passes for
``tpu`` on that device.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torch_xla", reason="the XLA suite runs in its own virtualenv (.ci/xla-suite)")

from octavo import LLM, SamplingParams  # noqa: E402
from octavo.default_model import DEMO_MODEL_DIR  # noqa: E402

OPTIONS = dict(dtype="float32", max_model_len=256, max_num_seqs=8, max_num_batched_tokens=64)
PROMPTS = [list(range(3, 3 + n)) for n in (3, 17, 40, 90)]  # 90 tokens: chunked over two steps
DECODE_STEPS = 64


@pytest.fixture(autouse=True)
def cpu_pjrt(monkeypatch):
    monkeypatch.setenv("OCTAVO_TPU_ALLOW_CPU_PJRT", "1")
    monkeypatch.setenv("PJRT_DEVICE", "CPU")


def _greedy(model, platform: str, prompts, max_tokens: int = 16, **options):
    llm = LLM(str(model), platform=platform, **{**OPTIONS, **options})
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    runner = llm.engine.executor.worker.runner
    stats = llm.engine.get_stats()
    llm.engine.shutdown()
    return [list(o.outputs[0].token_ids) for o in outputs], runner, stats


@pytest.mark.parametrize("arch", ["demo", "llama", "qwen3"])
def test_greedy_tokens_match_the_cpu_platform(arch, checkpoint_dirs):
    model = DEMO_MODEL_DIR if arch == "demo" else checkpoint_dirs[arch]
    expected, _, _ = _greedy(model, "cpu", PROMPTS[:3])
    tokens, runner, _ = _greedy(model, "tpu", PROMPTS[:3])
    assert runner.device.type == "xla"
    assert tokens == expected


def test_steady_state_compiles_nothing(checkpoint_dirs):
    # 16 sequences: request buckets 8 and 16, shapes no earlier test compiled
    # (XLA's program cache lives as long as the process).
    tokens, runner, stats = _greedy(
        checkpoint_dirs["llama"], "tpu", PROMPTS, max_tokens=DECODE_STEPS, max_num_seqs=16
    )
    assert all(len(t) == DECODE_STEPS for t in tokens)
    assert stats.compilations.total > 0
    assert stats.compilations.after_warmup == 0
    assert runner.static_steps is not None and runner.static_steps.num_steps > DECODE_STEPS


# 124 s in the suite on a shared 2-core host (alone: attention and model
# about 110 s each, XLA compiling a program per attention step and per
# padded engine step); the timeout leaves room for a slower, busier host.
@pytest.mark.timeout(1800)
def test_conformance_kit_passes_for_tpu():
    from octavo.testing.conformance import run_conformance

    results = run_conformance("tpu")
    for result in results:  # shown with -rA: the record of what passed and what was skipped, why
        print(f"{result.name}: {result.status}: {result.detail}")
    failed = [(r.name, r.detail) for r in results if r.status == "failed"]
    assert not failed, failed
    assert any(r.status == "passed" for r in results)
    model = next(r for r in results if r.name == "model")
    # Hugging Face's generate grows its shapes every step: on XLA it would
    # compile a program per token, so tpu's reference_device() is the CPU.
    assert model.status == "passed" and "HF ran on cpu" in model.detail
    assert os.environ["PJRT_DEVICE"] == "CPU"
