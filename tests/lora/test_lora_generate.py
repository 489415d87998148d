"""LoRA adapters through ``LLM.generate`` against Hugging Face + PEFT, float32 on the CPU.

Two adapters (every projection at rank 8; q/v only at rank 4 with rsLoRA and
a per-module alpha) and the base model in one batch: greedy tokens
identical to PEFT's, per prompt. Then fewer slots than adapters (the
scheduler holds requests back; the runner evicts and reloads), prefix-cache
isolation between adapters, and the adapters Octavo refuses.
"""

from __future__ import annotations

import json
import shutil

import pytest

from octavo import LoRARequest, SamplingParams
from octavo.errors import LoRAAdapterError
from tests.lora.conftest import NUM_NEW_TOKENS, PROMPTS

pytestmark = pytest.mark.usefixtures("one_thread")


def greedy() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, min_tokens=NUM_NEW_TOKENS)


def lora(name: str | None, adapters) -> LoRARequest | None:
    ids = {"every": 1, "qv": 2}
    return None if name is None else LoRARequest(name, ids[name], str(adapters[name]))


def run_mixed(llm, adapters, names):
    prompts = [{"prompt_token_ids": p} for _ in names for p in PROMPTS]
    loras = [lora(name, adapters) for name in names for _ in PROMPTS]
    outputs = llm.generate(prompts, greedy(), lora_request=loras)
    return {name: [o.outputs[0].token_ids for o in outputs[i * len(PROMPTS):(i + 1) * len(PROMPTS)]]
            for i, name in enumerate(names)}


def test_adapters_and_base_in_one_batch_match_peft(llama_dir, adapters, references, make_llm):
    llm = make_llm(llama_dir, enable_lora=True, max_loras=2, max_lora_rank=8)
    names = ["every", None, "qv"]
    assert run_mixed(llm, adapters, names) == {name: references[name] for name in names}


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_adapters_with_speculative_decoding_match_peft(llama_dir, adapters, references, make_llm, method):
    """Drafts are computed with their request's adapter (each token's slot),
    so speculation leaves PEFT's tokens; a draft model runs without adapters."""
    config = ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
              if method == "ngram" else {"model": str(llama_dir), "num_speculative_tokens": 3})
    llm = make_llm(llama_dir, enable_lora=True, max_loras=2, max_lora_rank=8, speculative_config=config)
    names = ["every", None, "qv"]
    assert run_mixed(llm, adapters, names) == {name: references[name] for name in names}
    assert llm.engine.get_stats().spec_decoding.num_draft_tokens > 0


def test_more_adapters_than_slots(llama_dir, adapters, references, make_llm):
    # One slot: the scheduler runs one adapter's requests at a time and the
    # runner swaps the slot's weights between them (twice: from disk, then its cache).
    llm = make_llm(llama_dir, enable_lora=True, max_loras=1, max_lora_rank=8)
    names = ["qv", "every", None]
    assert run_mixed(llm, adapters, names) == {name: references[name] for name in names}
    assert run_mixed(llm, adapters, ["every", "qv"]) == {name: references[name] for name in ["every", "qv"]}


def test_prefix_cache_is_per_adapter(llama_dir, adapters, references, make_llm):
    llm = make_llm(llama_dir, enable_lora=True, max_loras=2, max_lora_rank=8)
    prompt = {"prompt_token_ids": PROMPTS[1]}
    base = llm.generate([prompt], greedy())[0]
    first = llm.generate([prompt], greedy(), lora_request=lora("every", adapters))[0]
    again = llm.generate([prompt], greedy(), lora_request=lora("every", adapters))[0]
    other = llm.generate([prompt], greedy(), lora_request=lora("qv", adapters))[0]
    assert base.outputs[0].token_ids == references[None][1]
    # The base model's blocks are not the adapter's: no hit, the adapter's own tokens.
    assert first.num_cached_tokens == 0 and first.outputs[0].token_ids == references["every"][1]
    assert again.num_cached_tokens == 16 and again.outputs[0].token_ids == references["every"][1]
    assert other.num_cached_tokens == 0 and other.outputs[0].token_ids == references["qv"][1]


def _copy_adapter(source, target, config_changes=None, tensors=None):
    from safetensors.torch import save_file

    copy = shutil.copytree(source, target)
    if config_changes:
        config = json.loads((copy / "adapter_config.json").read_text())
        (copy / "adapter_config.json").write_text(json.dumps({**config, **config_changes}))
    if tensors is not None:
        save_file(tensors, str(copy / "adapter_model.safetensors"))
    return copy


def test_refused_adapters(llama_dir, adapters, make_llm, tmp_path):
    import torch

    off = make_llm(llama_dir)
    with pytest.raises(LoRAAdapterError, match="not enabled"):
        off.generate([PROMPTS[0]], greedy(), lora_request=lora("qv", adapters))

    llm = make_llm(llama_dir, enable_lora=True, max_loras=1, max_lora_rank=4)
    llm.generate([PROMPTS[0]], greedy(), lora_request=LoRARequest("qv", 1, str(adapters["qv"])))
    pickled = _copy_adapter(adapters["qv"], tmp_path / "pickled")
    (pickled / "adapter_model.safetensors").rename(pickled / "adapter_model.bin")
    a, b = torch.zeros(4, 64), torch.zeros(64, 4)
    cases = {
        "already names the adapter": LoRARequest("every", 1, str(adapters["every"])),
        "above max_lora_rank=4": LoRARequest("every", 2, str(adapters["every"])),
        "is not a directory": LoRARequest("missing", 3, str(tmp_path / "missing")),
        "safetensors only": LoRARequest("pickled", 4, str(pickled)),
        "DoRA": LoRARequest("dora", 5, str(_copy_adapter(adapters["qv"], tmp_path / "dora", {"use_dora": True}))),
        "modules_to_save": LoRARequest(
            "saved", 6, str(_copy_adapter(adapters["qv"], tmp_path / "saved", {"modules_to_save": ["lm_head"]}))
        ),
        "has no LoRA in this model": LoRARequest("head", 7, str(_copy_adapter(adapters["qv"], tmp_path / "head", tensors={
            "base_model.model.lm_head.lora_A.weight": a, "base_model.model.lm_head.lora_B.weight": b}))),
        "not a LoRA A/B weight": LoRARequest("embed", 8, str(_copy_adapter(adapters["qv"], tmp_path / "embed", tensors={
            "base_model.model.model.embed_tokens.lora_embedding_A": a}))),
        "do not fit": LoRARequest("shape", 9, str(_copy_adapter(adapters["qv"], tmp_path / "shape", tensors={
            "base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight": a,
            "base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight": b}))),
    }
    for message, request in cases.items():
        with pytest.raises(LoRAAdapterError, match=message):
            llm.generate([PROMPTS[0]], greedy(), lora_request=request)
    # Nothing was queued by the refused requests, and the engine still serves the adapter it has.
    assert len(llm.generate([PROMPTS[0]], greedy(), lora_request=LoRARequest("qv", 1, str(adapters["qv"])))) == 1


def test_tensor_parallel_adapters_match_peft(llama_dir, adapters, references):
    # Two worker processes over gloo: q/k/v and gate/up B matrices split by
    # rows (the KV heads' by KV rank), o/down A matrices by columns with the
    # update summed with the partial outputs.
    from octavo import LLM

    llm = LLM(str(llama_dir), dtype="float32", max_model_len=256, max_num_seqs=16, num_kv_blocks=64,
              tensor_parallel_size=2, enable_lora=True, max_loras=2, max_lora_rank=8)
    try:
        names = ["qv", None, "every"]
        assert run_mixed(llm, adapters, names) == {name: references[name] for name in names}
    finally:
        llm.engine.shutdown()


def test_models_whose_loader_reorders_rows_refuse_lora(family_dir):
    # DeepSeek reorders q's rope rows at load: an adapter's B rows would not line up.
    from octavo import LLM
    from octavo.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="not supported for DeepseekV3ForCausalLM"):
        LLM(str(family_dir("deepseek_v3")), dtype="float32", max_model_len=256, enable_lora=True)


def test_adapter_of_fused_projections_matches_peft(family_dir, make_llm, tmp_path):
    # Phi-3's checkpoint fuses q/k/v and gate/up, so its adapters name qkv_proj and gate_up_proj.
    from tests.lora.adapters import build_adapter, peft_greedy

    path = family_dir("phi3")
    adapter = build_adapter(path, tmp_path / "phi3", seed=3, r=8, lora_alpha=16,
                            target_modules=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"])
    expected = [peft_greedy(path, adapter, p, NUM_NEW_TOKENS) for p in PROMPTS]
    assert expected != [peft_greedy(path, None, p, NUM_NEW_TOKENS) for p in PROMPTS]
    llm = make_llm(path, enable_lora=True, max_lora_rank=8)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy(), lora_request=LoRARequest("phi", 1, str(adapter)))
    assert [o.outputs[0].token_ids for o in outputs] == expected


@pytest.mark.parametrize("mode", ["async_scheduling", "overlap_decode"])
def test_adapters_with_steps_launched_ahead(mode, llama_dir, adapters, references, make_llm):
    # The next step is prepared before this one's tokens reach the host: the
    # token slots are uploaded with each step's inputs all the same.
    llm = make_llm(llama_dir, enable_lora=True, max_loras=2, max_lora_rank=8, **{mode: True})
    names = ["every", None, "qv"]
    assert run_mixed(llm, adapters, names) == {name: references[name] for name in names}


def test_stats_name_the_running_and_waiting_adapters(llama_dir, adapters, make_llm):
    llm = make_llm(llama_dir, enable_lora=True, max_loras=1, max_lora_rank=8)
    engine = llm.engine
    for index, name in enumerate(["every", "qv", "every"]):
        engine.add_request(f"r{index}", {"prompt_token_ids": PROMPTS[0]}, greedy(), lora_request=lora(name, adapters))
    engine.step()
    stats = engine.get_stats()
    # One slot: both "every" requests run, "qv" waits for the slot.
    assert (stats.running_lora_adapters, stats.waiting_lora_adapters, stats.num_running) == (["every"], ["qv"], 2)
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.get_stats().running_lora_adapters == []
