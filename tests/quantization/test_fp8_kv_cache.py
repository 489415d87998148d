"""The fp8 KV cache: ``LLM(kv_cache_dtype="fp8")`` end to end on the CPU.

Keys and values are cast to float8_e4m3fn when written and back when read
(no scales: e4m3's range of +-448 covers these activations). Against the
same model with a float32 cache (8 prompts, 24 greedy tokens): the first
step's top-5 logprobs within ``LOGPROB_TOLERANCE`` (measured 0.015-0.04),
and token ids identical up to a near-tie (each side's token in the other's
top-5). These random models have flat distributions, so sequences do part
at near-ties, after 2 to 20 tokens. The cache takes a quarter of the float32 bytes per
block, so the same budget holds four times the blocks.
"""

from __future__ import annotations

import pytest
import torch

from octavo import SamplingParams
from octavo.runtime.attention.torch_paged import write_kv_cache
from tests.models.test_hf_parity import make_prompts

LOGPROB_TOLERANCE = 0.1


def test_write_kv_cache_fp8():
    """index_copy_ has no fp8 CPU kernel; the write goes through uint8 views."""
    cache = torch.zeros(2, 4, 16, 2, 8, dtype=torch.float8_e4m3fn)
    key, value = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    slots = torch.tensor([5, -1, 17])
    write_kv_cache(key, value, cache, slots)
    flat = cache.view(2, -1, 2, 8)
    torch.testing.assert_close(flat[0, [5, 17]].float(), key[[0, 2]].to(torch.float8_e4m3fn).float())
    torch.testing.assert_close(flat[1, [5, 17]].float(), value[[0, 2]].to(torch.float8_e4m3fn).float())
    assert flat[0, 0].float().abs().sum() == 0  # the skipped slot (-1) wrote nothing


def _top5(completion) -> list[list[int]]:
    return [sorted(d, key=lambda t: d[t].rank)[:5] for d in completion.logprobs]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_fp8_kv_cache_close_to_float32(arch, checkpoint_dirs, make_llm):
    path = checkpoint_dirs[arch]
    from octavo.models.config import load_arch_config

    prompts = [{"prompt_token_ids": p} for p in make_prompts(load_arch_config(path).vocab_size)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=5)
    budget = 1 << 18  # small enough that neither cache hits the max_num_seqs cap
    reference_llm = make_llm(path, kv_cache_memory_bytes=budget)
    fp8_llm = make_llm(path, kv_cache_dtype="fp8", kv_cache_memory_bytes=budget)
    runner = fp8_llm.engine.executor.worker.runner
    assert {cache.dtype for cache in runner.kv_caches} == {torch.float8_e4m3fn}
    assert fp8_llm.engine.scheduler.kv.num_blocks == 4 * reference_llm.engine.scheduler.kv.num_blocks
    reference = reference_llm.generate(prompts, params)
    outputs = fp8_llm.generate(prompts, params)
    for ours, ref in zip(outputs, reference):
        a, b = ours.outputs[0], ref.outputs[0]
        for token, entry in b.logprobs[0].items():  # the first step's top-5, both ways
            if token in a.logprobs[0]:
                assert abs(a.logprobs[0][token].logprob - entry.logprob) < LOGPROB_TOLERANCE
        if a.token_ids == b.token_ids:
            continue
        step = next(i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y)
        assert a.token_ids[step] in _top5(b)[step] and b.token_ids[step] in _top5(a)[step], (step, a.token_ids, b.token_ids)


def _checkpoint_with(source, out, extra: dict[str, torch.Tensor]):
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(source, out)
    tensors = load_file(str(out / "model.safetensors"))
    save_file({**tensors, **extra}, str(out / "model.safetensors"))
    return out


SCALES = {
    "model.layers.0.self_attn.k_scale": torch.tensor(0.5),
    "model.layers.0.self_attn.v_scale": torch.tensor([2.0]),
    "model.layers.1.self_attn.kv_scale": torch.tensor(0.25),  # AutoFP8's single scale for both
}


def test_checkpoint_kv_scales(quant_llama_dir, tmp_path):
    """Scales from the checkpoint reach each layer's backend (its own copy)
    for an fp8 cache; keys and values are stored divided by them; logits stay
    close to a float32 cache's. A 16/32-bit cache stores values as they are
    and ignores them."""
    from tests.quantization import helpers

    path = _checkpoint_with(quant_llama_dir, tmp_path / "scaled", SCALES)
    prompt = list(range(3, 90, 3))
    reference = helpers.prefill_logits(helpers.load(path), prompt)
    loaded = helpers.load(path, kv_cache_dtype="fp8")
    first, second = loaded.layer_backends
    assert (first.k_scale, first.v_scale, second.k_scale, second.v_scale) == (0.5, 2.0, 0.25, 0.25)
    assert first is not second
    logits = helpers.prefill_logits(loaded, prompt)
    assert float((logits - reference).norm() / reference.norm()) < 0.05
    plain = helpers.load(path)
    assert all((b.k_scale, b.v_scale) == (1.0, 1.0) for b in plain.layer_backends)


def test_kv_scale_aliases_and_refusals(quant_llama_dir, tmp_path):
    from octavo.errors import ModelLoadError
    from tests.quantization import helpers

    path = _checkpoint_with(quant_llama_dir, tmp_path / "alias", {
        "model.layers.1.self_attn.k_proj.output_scale": torch.tensor(0.75),
        "model.layers.1.self_attn.v_proj.output_scale": torch.tensor(1.5),
    })
    backends = helpers.load(path, kv_cache_dtype="fp8").layer_backends
    assert (backends[0].k_scale, backends[1].k_scale, backends[1].v_scale) == (1.0, 0.75, 1.5)
    per_head = _checkpoint_with(quant_llama_dir, tmp_path / "per_head", {"model.layers.0.self_attn.k_scale": torch.ones(2)})
    with pytest.raises(ModelLoadError, match="only per-tensor scales are supported, not per-head"):
        helpers.load(per_head, kv_cache_dtype="fp8")
    zero = _checkpoint_with(quant_llama_dir, tmp_path / "zero", {"model.layers.0.self_attn.v_scale": torch.tensor(0.0)})
    with pytest.raises(ModelLoadError, match=r"model.layers.0.self_attn.attn: KV-cache scales must be positive"):
        helpers.load(zero, kv_cache_dtype="fp8")
