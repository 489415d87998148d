"""generation_config.json sampling values as the defaults of requests that do
not set them (--generation-config auto|vllm|DIR), in the LLM API, the CLI and
the server's conversion of request fields."""

from __future__ import annotations

import argparse
import json
import shutil
from types import SimpleNamespace

import pytest

from octavo.core.engine import ModelInfo
from octavo.errors import InvalidArgumentError, ModelLoadError
from octavo.models.generation_defaults import parse_sampling_defaults, sampling_defaults

GENERATION = {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "do_sample": True, "max_new_tokens": 99, "eos_token_id": 1}
SAMPLING = {"temperature": 0.6, "top_p": 0.9, "top_k": 20}


@pytest.fixture(scope="module")
def sampled_dir(llama_dir, tmp_path_factory):
    """The tiny Llama with a generation config that asks for sampling."""
    path = tmp_path_factory.mktemp("sampled") / "llama"
    shutil.copytree(llama_dir, path)
    (path / "generation_config.json").write_text(json.dumps(GENERATION))
    return path


def test_only_sampling_values_are_read_and_checked(tmp_path, sampled_dir):
    assert sampling_defaults("auto", sampled_dir) == SAMPLING
    assert sampling_defaults("vllm", sampled_dir) == {}
    assert sampling_defaults("auto", None) == {}  # a GGUF file has no generation_config.json
    assert sampling_defaults(str(sampled_dir), tmp_path) == SAMPLING
    with pytest.raises(InvalidArgumentError, match="--generation-config"):
        sampling_defaults(str(tmp_path), sampled_dir)
    with pytest.raises(ModelLoadError, match="temperature must be a number"):
        parse_sampling_defaults({"temperature": "hot"}, "g.json")
    with pytest.raises(ModelLoadError, match="g.json: .*top_p"):
        parse_sampling_defaults({"top_p": 0.0}, "g.json")


def test_llm_generate_without_params_uses_the_model_defaults(make_llm, sampled_dir):
    llm = make_llm(sampled_dir)
    assert llm.engine.info.sampling_defaults == SAMPLING
    params = llm._params_list(None, 1)[0]
    assert (params.temperature, params.top_p, params.top_k) == (0.6, 0.9, 20)
    plain = make_llm(sampled_dir, generation_config="vllm")
    assert plain._params_list(None, 1)[0].temperature == 1.0


def _engine(defaults):
    return SimpleNamespace(info=ModelInfo("m", "LlamaForCausalLM", "float32", "cpu", sampling_defaults=defaults))


def test_cli_flags_win_then_the_model_then_greedy():
    from octavo.entrypoints.cli.generate import sampling_params_for

    flags = dict(temperature=None, top_p=None, top_k=None, min_p=None, repetition_penalty=None, max_tokens=8, seed=0)
    assert sampling_params_for(argparse.Namespace(**flags), _engine({})).temperature == 0.0
    params = sampling_params_for(argparse.Namespace(**flags), _engine(SAMPLING))
    assert (params.temperature, params.top_p, params.top_k) == (0.6, 0.9, 20)
    params = sampling_params_for(argparse.Namespace(**{**flags, "temperature": 0.2}), _engine(SAMPLING))
    assert (params.temperature, params.top_p) == (0.2, 0.9)


def test_server_fields_left_unset_take_the_model_defaults():
    from octavo.entrypoints.openai.config import ServerConfig
    from octavo.entrypoints.openai.serving import make_sampling_params

    ctx = SimpleNamespace(engine=SimpleNamespace(engine=_engine(SAMPLING)), config=ServerConfig())
    params = make_sampling_params(ctx, temperature=None, top_p=0.5, top_k=None, max_tokens=4)
    assert (params.temperature, params.top_p, params.top_k, params.max_tokens) == (0.6, 0.5, 20, 4)
