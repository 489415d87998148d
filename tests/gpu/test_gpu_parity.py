"""On a CUDA GPU: the fast path (Triton backend, CUDA graphs) against the
CPU reference path and against Hugging Face. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

from octavo import SamplingParams
from tests.checkpoints import ARCHITECTURES
from tests.hf_reference import assert_tokens_match, hf_greedy
from tests.models.test_hf_parity import make_prompts

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def greedy(max_tokens: int = 32) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=5)


def top5(completion) -> list[list[int]]:
    return [sorted(d, key=lambda t: d[t].rank)[:5] for d in completion.logprobs]


def vocab(path) -> int:
    from octavo.models.config import load_arch_config

    return load_arch_config(path).vocab_size


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_float32_gpu_matches_cpu_reference(arch, checkpoint_dirs, make_llm):
    path = checkpoint_dirs[arch]
    prompts = [{"prompt_token_ids": p} for p in make_prompts(vocab(path))]
    cpu = make_llm(path, platform="cpu").generate(prompts, greedy())
    gpu_llm = make_llm(path, platform="cuda")
    assert gpu_llm.engine.info.platform == "cuda"
    gpu = gpu_llm.generate(prompts, greedy())
    for ours, ref in zip(gpu, cpu):
        assert ours.outputs[0].token_ids == ref.outputs[0].token_ids


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_bfloat16_gpu_tracks_hf(arch, checkpoint_dirs, make_llm):
    path = checkpoint_dirs[arch]
    prompts = make_prompts(vocab(path))
    llm = make_llm(path, platform="cuda", dtype="bfloat16")
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy())
    hf_model_dtype = torch.bfloat16
    for prompt, output in zip(prompts, outputs):
        ref = hf_greedy(path, prompt, 32, dtype=hf_model_dtype, device="cuda")
        assert_tokens_match(output.outputs[0].token_ids, ref, top5(output.outputs[0]))


def test_graphs_and_eager_agree(llama_dir, make_llm):
    prompts = [{"prompt_token_ids": p} for p in make_prompts(vocab(llama_dir))]
    graphs = make_llm(llama_dir, platform="cuda", dtype="bfloat16")
    assert graphs.engine.executor.worker.runner.graphs is not None
    eager = make_llm(llama_dir, platform="cuda", dtype="bfloat16", enforce_eager=True)
    for a, b in zip(graphs.generate(prompts, greedy()), eager.generate(prompts, greedy())):
        assert_tokens_match(a.outputs[0].token_ids, _as_ref(b.outputs[0]), top5(a.outputs[0]))


def test_prefill_graphs_match_eager_in_float32(llama_dir, make_llm):
    # Whole prompts, then chunks of 24 tokens mixed with decode rows: every
    # step with up to 2048 tokens replays a prefill graph, token-identical.
    prompts = [{"prompt_token_ids": p} for p in make_prompts(vocab(llama_dir))]
    for options in ({}, {"max_num_batched_tokens": 24}):
        graphs = make_llm(llama_dir, platform="cuda", **options)
        runner = graphs.engine.executor.worker.runner
        assert runner.prefill_graphs is not None
        eager = make_llm(llama_dir, platform="cuda", enforce_eager=True, **options)
        ours = [o.outputs[0].token_ids for o in graphs.generate(prompts, greedy())]
        assert ours == [o.outputs[0].token_ids for o in eager.generate(prompts, greedy())]
        assert runner.prefill_graphs.num_replays > 0


def _as_ref(completion):
    from tests.hf_reference import HFGreedy

    ids = completion.token_ids
    return HFGreedy(ids, [completion.logprobs[i][t].logprob for i, t in enumerate(ids)], top5(completion))


def test_decode_overlap_on_gpu_matches_plain(llama_dir, make_llm):
    prompts = [{"prompt_token_ids": p} for p in make_prompts(vocab(llama_dir))]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (5, 40, 17, 33, 1, 24, 40, 9)]
    plain = make_llm(llama_dir, platform="cuda", overlap_decode=False).generate(prompts, params)
    overlapped = make_llm(llama_dir, platform="cuda", overlap_decode=True)
    outputs = overlapped.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in plain]
    assert overlapped.engine.executor.worker.runner.overlap.num_reused >= 30


def test_cuda_resolves_octavo_kernels_as_layer_ops(llama_dir, make_llm):
    llm = make_llm(llama_dir, platform="cuda", dtype="bfloat16")
    ops = llm.engine.executor.worker.runner.loaded.ops
    for op in ("rms_norm", "fused_add_rms_norm", "rotary_and_cache", "silu_and_mul"):
        assert (ops.choice(op).impl, ops.choice(op).plugin) == ("triton", "octavo_builtin"), ops.choice(op).describe()
    assert ops.choice("linear").describe() == "linear: gemv [octavo_builtin] up to 1 token, else reference"
    layer = llm.engine.executor.worker.runner.model.model.layers[0]
    assert layer.self_attn.attn.rotary_args == (ops.rotary_and_cache,)  # the fused rotary + KV write path


def test_fp8_fused_quantizers_on_gpu_match_the_unfused_path(llama_dir, make_llm, monkeypatch):
    """W8A8 with the quantizer fused into the norms and SiLU quantizes the same
    values as the separate launches: the same tokens and logprobs."""
    prompts = [{"prompt_token_ids": p} for p in make_prompts(vocab(llama_dir))]
    fused = make_llm(llama_dir, platform="cuda", dtype="bfloat16", quantization="fp8")
    ops = fused.engine.executor.worker.runner.loaded.ops
    for op in ("fused_add_rms_norm_fp8_linear", "silu_and_mul_fp8_linear"):
        assert ops.choice(op).impl == "triton_quant+scaled_mm", ops.choice(op).describe()
    expected = fused.generate(prompts, greedy(16))
    monkeypatch.setenv("OCTAVO_LAYER_OPS", "fused_add_rms_norm_fp8_linear=reference,silu_and_mul_fp8_linear=reference")
    unfused = make_llm(llama_dir, platform="cuda", dtype="bfloat16", quantization="fp8").generate(prompts, greedy(16))
    for ours, theirs in zip(expected, unfused):
        assert ours.outputs[0].token_ids == theirs.outputs[0].token_ids
        chosen = [d[t].logprob for d in ours.outputs[0].logprobs for t in d]
        assert chosen == pytest.approx([d[t].logprob for d in theirs.outputs[0].logprobs for t in d], abs=1e-3)


def test_programmatic_dependent_launch_keeps_every_token(llama_dir, make_llm, monkeypatch):
    """OCTAVO_PDL=1 (Hopper and later: the decode chain's kernels launched
    early, each waiting for the one before) gives the tokens and logprobs of
    ordinary launches, through CUDA graphs and eager prefill alike."""
    prompts = [{"prompt_token_ids": p} for p in make_prompts(vocab(llama_dir))]
    plain = make_llm(llama_dir, platform="cuda", dtype="bfloat16").generate(prompts, greedy(24))
    monkeypatch.setenv("OCTAVO_PDL", "1")
    early = make_llm(llama_dir, platform="cuda", dtype="bfloat16").generate(prompts, greedy(24))
    for ours, theirs in zip(early, plain):
        assert ours.outputs[0].token_ids == theirs.outputs[0].token_ids
        chosen = [[d[t].logprob for t in d] for d in ours.outputs[0].logprobs]
        assert chosen == [[d[t].logprob for t in d] for d in theirs.outputs[0].logprobs]


def test_int4_in_fbgemm_layout_tracks_octavo_int4(tmp_path, tokenizer_dir, make_llm, monkeypatch):
    """With fbgemm-gpu-genai installed, every 4-bit layer of a model with dims in
    multiples of 128 takes its preshuffled layout, and greedy decoding follows
    Octavo's own int4 kernels (the same quantized weights; fbgemm rounds the zero
    point's offset to bf16 once): identical ids, or a near-tie where they part."""
    pytest.importorskip("fbgemm_gpu")
    from tests.checkpoints import build_checkpoint

    shape = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
    path = build_checkpoint(tmp_path / "llama", "llama", tokenizer_dir, **shape)
    prompts = [{"prompt_token_ids": p} for p in make_prompts(vocab(path))]
    llm = make_llm(path, platform="cuda", dtype="bfloat16", quantization="int4")
    model = llm.engine.executor.worker.runner.model
    layers = [m for m in model.modules() if getattr(m, "weight_bits", None) == 4]
    assert layers and all(layer.own_layout_op is not None for layer in layers)
    ours = llm.generate(prompts, greedy(16))
    monkeypatch.setenv("OCTAVO_LAYER_OPS", "int4_linear=triton")
    theirs = make_llm(path, platform="cuda", dtype="bfloat16", quantization="int4").generate(prompts, greedy(16))
    for a, b in zip(ours, theirs):
        a_ids, b_ids = a.outputs[0].token_ids, b.outputs[0].token_ids
        if a_ids != b_ids:
            first = next(i for i, (x, y) in enumerate(zip(a_ids, b_ids)) if x != y)
            assert a_ids[first] in top5(b.outputs[0])[first] and b_ids[first] in top5(a.outputs[0])[first]


def test_grammar_masks_on_gpu_match_cpu(llama_dir, make_llm):
    # The masks reach the device through pinned staging and the platform's
    # events (plain copies on the CPU); with and without decode overlap (masks
    # applied to logits computed before the host had the previous token), the
    # constrained tokens are the CPU's and every output is valid.
    import json
    import re

    from octavo import StructuredOutputsParams

    regex = r"[a-z]{2,6}-\d{2,4}"
    # Text prompts: random ids may end inside a UTF-8 character, which the
    # detokenizer would hand out ahead of the output's text.
    prompts = ["Once upon a time", "The fox", "A cow says", "Every morning the fox walked", "Octavo is", "The sun"]
    params = [
        SamplingParams(temperature=0.0, max_tokens=48, structured_outputs=StructuredOutputsParams(json_object=True)),
        SamplingParams(temperature=0.0, max_tokens=24, structured_outputs=StructuredOutputsParams(regex=regex)),
        SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True),  # unconstrained, in the same batches
    ] * 2
    cpu = [o.outputs[0] for o in make_llm(llama_dir, platform="cpu").generate(prompts, params)]
    for overlap in (False, True):
        gpu = [o.outputs[0] for o in make_llm(llama_dir, platform="cuda", overlap_decode=overlap).generate(prompts, params)]
        assert [c.token_ids for c in gpu] == [c.token_ids for c in cpu]
    for completion, p in zip(cpu, params):
        constraint = p.structured_outputs
        if constraint is not None and constraint.regex:  # at most 11 characters: it always ends
            assert completion.finish_reason == "stop" and re.fullmatch(regex, completion.text), completion
        elif constraint is not None and completion.finish_reason == "stop":
            assert isinstance(json.loads(completion.text), dict), completion
