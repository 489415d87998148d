"""vLLM's server-wide defaults: ``--default-chat-template-kwargs`` (template
variables for every request, a request's own winning), ``--enable-force-include-usage``
(a usage chunk ending every stream), ``--override-generation-config``, and the
flags accepted for vLLM's command lines (``--trust-remote-code`` refused with the reason)."""

from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient

from octavo import LLM
from octavo.entrypoints.cli.common import engine_args_from
from octavo.entrypoints.openai.app import build_app
from octavo.entrypoints.openai.config import ServerConfig
from octavo.errors import InvalidArgumentError, OctavoError
from tests.entrypoints.server.test_serve_cli import parse

MESSAGES = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def client(chat_model_dir):
    llm = LLM(str(chat_model_dir), dtype="float32", max_model_len=256, num_kv_blocks=64,
              override_generation_config={"temperature": 0.0})
    config = ServerConfig(served_model_names=["m"], default_chat_template_kwargs={"enable_thinking": False},
                          enable_force_include_usage=True)
    with TestClient(build_app(llm.engine, config)) as test_client:
        test_client.tokenizer = llm.get_tokenizer()
        yield test_client
    llm.engine.shutdown()


def template_length(tokenizer, **kwargs) -> int:
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True, **kwargs)
    return len(tokenizer.encode(text, add_special_tokens=False))


def test_default_template_kwargs_apply_unless_the_request_sets_them(client):
    off, plain = template_length(client.tokenizer, enable_thinking=False), template_length(client.tokenizer)
    assert off > plain  # the template writes an empty <think> block
    assert client.post("/tokenize", json={"messages": MESSAGES}).json()["count"] == off
    body = {"messages": MESSAGES, "max_tokens": 1}
    assert client.post("/v1/chat/completions", json=body).json()["usage"]["prompt_tokens"] == off
    own = {**body, "chat_template_kwargs": {"enable_thinking": True}}
    assert client.post("/v1/chat/completions", json=own).json()["usage"]["prompt_tokens"] == plain


def test_every_stream_ends_with_usage(client):
    for path, body in (("/v1/chat/completions", {"messages": MESSAGES}), ("/v1/completions", {"prompt": "Hi"})):
        with client.stream("POST", path, json={**body, "max_tokens": 2, "stream": True}) as response:
            data = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
        assert data[-1] == "[DONE]" and json.loads(data[-2])["usage"]["completion_tokens"] == 2


def test_override_generation_config_sets_the_sampling_defaults(client):
    from octavo.models.generation_defaults import engine_sampling_defaults, override_sampling_defaults

    assert engine_sampling_defaults(client.app.state.octavo.engine.engine)["temperature"] == 0.0
    for bad in ({"max_new_tokens": 5}, {"temperature": "hot"}):
        with pytest.raises(OctavoError) as caught:
            override_sampling_defaults(bad)
        assert "override-generation-config" in str(caught.value)


def test_vllm_flags(capsys):
    args = parse(["--no-enable-prefix-caching", "--enable-chunked-prefill", "--enable-prompt-tokens-details",
                  "--override-generation-config", '{"top_p": 0.9}'])
    engine_args = engine_args_from(args)
    assert not engine_args.enable_prefix_caching and engine_args.enable_chunked_prefill
    assert engine_args.override_generation_config == {"top_p": 0.9}
    with pytest.raises(SystemExit):
        parse(["--trust-remote-code"])
    assert "Octavo never runs code from a checkpoint" in capsys.readouterr().err
    assert parse(["--tokenizer-mode", "hf", "--config-format", "auto"]).tokenizer_mode == "hf"
    for flag, value, words in (("--tokenizer-mode", "mistral", "mistral_common"), ("--config-format", "mistral", "params.json")):
        with pytest.raises(SystemExit):
            parse([flag, value])
        assert words in capsys.readouterr().err
    from octavo.entrypoints.cli import serve

    with pytest.raises(InvalidArgumentError):
        serve.server_config_from(parse(["--default-chat-template-kwargs", '{"tools": []}']))


EFFORT_TEMPLATE = "{% if reasoning_effort is defined %}Reasoning: {{ reasoning_effort }}\n{% endif %}"


@pytest.fixture(scope="module")
def effort_client(chat_model_dir, tmp_path_factory):
    from tests.checkpoints import TOOL_CHAT_TEMPLATE

    path = tmp_path_factory.mktemp("template") / "effort.jinja"
    path.write_text(EFFORT_TEMPLATE + TOOL_CHAT_TEMPLATE.strip())
    llm = LLM(str(chat_model_dir), dtype="float32", max_model_len=256, num_kv_blocks=64, chat_template=str(path))
    with TestClient(build_app(llm.engine, ServerConfig(served_model_names=["m"]))) as test_client:
        yield test_client
    llm.engine.shutdown()


def test_reasoning_effort_reaches_a_template_that_reads_it(effort_client, client):
    body = {"messages": MESSAGES, "max_tokens": 1}
    plain = effort_client.post("/v1/chat/completions", json=body).json()["usage"]["prompt_tokens"]
    high = effort_client.post("/v1/chat/completions", json={**body, "reasoning_effort": "high"}).json()
    assert high["usage"]["prompt_tokens"] > plain
    answer = effort_client.post("/v1/responses", json={
        "input": MESSAGES, "max_output_tokens": 1, "reasoning": {"effort": "high", "summary": "auto"},
        "include": ["reasoning.encrypted_content"]}).json()
    assert answer["usage"]["input_tokens"] == high["usage"]["prompt_tokens"]
    assert answer["reasoning"] == {"effort": "high", "summary": "auto"}
    # A template that does not read it: a 400 naming the field, never a silent no-op.
    refused = client.post("/v1/chat/completions", json={**body, "reasoning_effort": "high"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "reasoning_effort"


def test_log_requests_logs_prompts_cut_at_max_log_len(chat_model_dir, caplog):
    import logging

    llm = LLM(str(chat_model_dir), dtype="float32", max_model_len=256, num_kv_blocks=64)
    config = ServerConfig(served_model_names=["m"], enable_log_requests=True, max_log_len=5)
    try:
        with TestClient(build_app(llm.engine, config)) as test_client, caplog.at_level(logging.INFO):
            assert test_client.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 1}).status_code == 200
    finally:
        llm.engine.shutdown()
    (record,) = [r for r in caplog.records if r.getMessage().startswith("received request")]
    message = record.getMessage()
    assert "prompt: 'Once '" in message and "max_tokens=1" in message
    assert message.endswith("]") and len(message.rsplit("[", 1)[1].split(",")) == 5  # five token ids


def test_return_tokens_as_token_ids_by_default(llama_dir):
    """``--return-tokens-as-token-ids``: logprob tokens are ``token_id:N`` unless a request says false."""
    llm = LLM(str(llama_dir), dtype="float32", max_model_len=128, num_kv_blocks=32)
    config = ServerConfig(served_model_names=["m"], return_tokens_as_token_ids=True, log_stats_interval_s=0)
    try:
        with TestClient(build_app(llm.engine, config)) as test_client:
            body = {"model": "m", "prompt": [5, 6, 7], "max_tokens": 3, "logprobs": 2, "ignore_eos": True}
            tokens = test_client.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]["tokens"]
            assert len(tokens) == 3 and all(t.startswith("token_id:") for t in tokens)
            body["return_tokens_as_token_ids"] = False
            tokens = test_client.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]["tokens"]
            assert not any(t.startswith("token_id:") for t in tokens)
    finally:
        llm.engine.shutdown()
    from octavo.entrypoints.cli import serve

    assert serve.server_config_from(parse(["/m", "--return-tokens-as-token-ids"])).return_tokens_as_token_ids
