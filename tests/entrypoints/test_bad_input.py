"""Bad input raises typed errors with clear messages, before any work is scheduled."""

from __future__ import annotations

import json
import shutil

import pytest

from octavo import LLM, SamplingParams
from octavo.errors import (
    InvalidArgumentError,
    InvalidSamplingParamsError,
    ModelLoadError,
    ModelNotFoundError,
    PromptTooLongError,
    RequestTooLargeError,
    UnsupportedModelError,
)


@pytest.mark.parametrize(
    "kwargs, param",
    [
        (dict(temperature=-0.5), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(n=0), "n"),
        (dict(top_k=-3), "top_k"),
        (dict(min_p=2.0), "min_p"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(min_tokens=5, max_tokens=2), "min_tokens"),
        (dict(presence_penalty=3.0), "presence_penalty"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(logprobs=-1), "logprobs"),
        (dict(stop=[""]), "stop"),
        (dict(stop_token_ids=[-4]), "stop_token_ids"),
        (dict(seed="x"), "seed"),
        # Representable: every integer in int64 (msgpack, tensors), every float finite.
        (dict(seed=2**64), "seed"),
        (dict(seed=-(2**63) - 1), "seed"),
        (dict(stop_token_ids=[2**64]), "stop_token_ids"),
        (dict(top_k=2**63), "top_k"),
        (dict(n=2**63), "n"),
        (dict(max_tokens=2**64), "max_tokens"),
        (dict(logprobs=2**70), "logprobs"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(repetition_penalty=float("inf")), "repetition_penalty"),
        (dict(top_p=float("nan")), "top_p"),
    ],
)
def test_invalid_sampling_params(kwargs, param):
    with pytest.raises(InvalidSamplingParamsError) as info:
        SamplingParams(**kwargs)
    assert info.value.param == param and param in str(info.value)


@pytest.fixture(scope="module")
def llm(llama_dir):
    llm = LLM(str(llama_dir), dtype="float32", max_model_len=64, num_kv_blocks=8)
    yield llm


def assert_nothing_scheduled(llm):
    assert not llm.engine.has_unfinished_requests()
    assert llm.engine.scheduler.kv.num_free_blocks == llm.engine.scheduler.kv.num_blocks


def test_prompt_longer_than_max_model_len(llm):
    with pytest.raises(PromptTooLongError, match="max_model_len is 64"):
        llm.generate([[5] * 64])
    assert_nothing_scheduled(llm)


def test_one_bad_prompt_refuses_the_whole_batch(llm):
    with pytest.raises(InvalidArgumentError, match="out of range"):
        llm.generate([[5, 6], [5, 100000]])
    assert_nothing_scheduled(llm)


def test_empty_prompt_and_wrong_types(llm):
    with pytest.raises(InvalidArgumentError, match="empty"):
        llm.generate([{"prompt_token_ids": []}])
    with pytest.raises(InvalidArgumentError, match="string or a list of token ids"):
        llm.generate([3.5])
    with pytest.raises(InvalidArgumentError, match="2 SamplingParams for 1 prompts"):
        llm.generate(["a"], [SamplingParams(), SamplingParams()])
    with pytest.raises(InvalidArgumentError, match="logprobs=50 exceeds"):
        llm.generate(["a"], SamplingParams(logprobs=50))
    assert_nothing_scheduled(llm)


def test_request_that_can_never_fit_the_kv_cache(llama_dir):
    llm = LLM(str(llama_dir), dtype="float32", max_model_len=256, num_kv_blocks=2)
    with pytest.raises(RequestTooLargeError, match="KV cache holds only 2 blocks"):
        llm.generate([[5] * 40], SamplingParams(max_tokens=10))
    assert_nothing_scheduled(llm)


def test_unknown_llm_option(llama_dir):
    with pytest.raises(InvalidArgumentError, match="unknown LLM option"):
        LLM(str(llama_dir), not_an_option=1)


def test_negative_prefill_graph_tokens(llama_dir):
    with pytest.raises(InvalidArgumentError, match="max_prefill_graph_tokens must be 0 or more"):
        LLM(str(llama_dir), max_prefill_graph_tokens=-1)


def test_prefill_graph_tokens_reach_the_worker(llama_dir, make_llm):
    llm = make_llm(llama_dir, max_prefill_graph_tokens=512)
    assert llm.engine.executor.worker.runner.config.max_prefill_graph_tokens == 512


def test_missing_model(tmp_path):
    with pytest.raises(ModelNotFoundError, match="not found"):
        LLM(str(tmp_path / "nope"))


@pytest.fixture
def broken_copy(llama_dir, tmp_path):
    target = tmp_path / "model"
    shutil.copytree(llama_dir, target)
    return target


def test_unknown_architecture(broken_copy):
    config = json.loads((broken_copy / "config.json").read_text())
    config["architectures"] = ["FancyForCausalLM"]
    (broken_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match="FancyForCausalLM.*supported:.*\\bLlamaForCausalLM"):
        LLM(str(broken_copy))


def test_missing_config(broken_copy):
    (broken_copy / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="config.json is missing"):
        LLM(str(broken_copy))


def test_corrupt_config(broken_copy):
    (broken_copy / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        LLM(str(broken_copy))


def test_missing_weights_and_pickle_refused(broken_copy):
    (broken_copy / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no \\*.safetensors"):
        LLM(str(broken_copy))
    (broken_copy / "pytorch_model.bin").write_bytes(b"not even a pickle")
    with pytest.raises(ModelLoadError, match="pickle weights"):
        LLM(str(broken_copy))


def test_truncated_weights(broken_copy):
    weights = broken_copy / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="model.safetensors"):
        LLM(str(broken_copy))


def test_missing_tensor(broken_copy):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(broken_copy / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(broken_copy / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="model.layers.1.mlp.gate_up_proj.weight"):
        LLM(str(broken_copy))


def test_wrong_tensor_shape(broken_copy):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(broken_copy / "model.safetensors"))
    tensors["model.norm.weight"] = tensors["model.norm.weight"][:10].contiguous()
    save_file(tensors, str(broken_copy / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="model.norm.weight"):
        LLM(str(broken_copy))


def test_bad_dtype_and_max_model_len(llama_dir):
    with pytest.raises(InvalidArgumentError, match="unknown dtype"):
        LLM(str(llama_dir), dtype="float8")
    with pytest.raises(InvalidArgumentError, match="max_position_embeddings"):
        LLM(str(llama_dir), max_model_len=100000)


def test_huge_top_k_samples_like_no_top_k(llm):
    """top_k beyond the vocabulary keeps every token (the sampler clamps it; it once overflowed a tensor)."""
    prompt = "Once upon a time"
    huge = llm.generate(prompt, SamplingParams(temperature=0.8, top_k=2**62, seed=7, max_tokens=8))[0].outputs[0]
    none = llm.generate(prompt, SamplingParams(temperature=0.8, top_k=0, seed=7, max_tokens=8))[0].outputs[0]
    assert huge.token_ids == none.token_ids


def test_stop_token_ids_must_be_in_the_vocabulary(llm):
    vocab_size = llm.engine.limits.vocab_size
    with pytest.raises(InvalidArgumentError, match=f"token id {vocab_size} is out of range") as info:
        llm.generate("hello", SamplingParams(stop_token_ids=[vocab_size]))
    assert info.value.param == "stop_token_ids"
    assert_nothing_scheduled(llm)


def test_a_failed_add_takes_back_what_it_queued(llm, monkeypatch):
    """A request's children are queued all or none, whatever raised half-way."""
    scheduler = llm.engine.scheduler
    add_request = scheduler.add_request
    queued = []

    def second_one_fails(request):
        queued.append(request.request_id)
        if len(queued) == 2:
            raise RuntimeError("boom")
        add_request(request)

    monkeypatch.setattr(scheduler, "add_request", second_one_fails)
    with pytest.raises(RuntimeError, match="boom"):
        llm.engine.add_request("r", "hello", SamplingParams(n=3))
    monkeypatch.undo()
    assert_nothing_scheduled(llm)
    assert not llm.engine.output_processor.states
    assert llm.generate("hello", SamplingParams(max_tokens=2))[0].finished
