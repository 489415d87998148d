"""``octavo serve --speculative-config``: greedy completions (streamed or not)
carry the tokens of the engine without drafts, /metrics counts drafts and
accepted tokens (vLLM's spec_decode series), and a bad configuration stops
the start-up with its reason."""

from __future__ import annotations

import json

import pytest

from octavo import SamplingParams
from tests.entrypoints.server.conftest import parse_metrics
from tests.entrypoints.server.server_process import ServerProcess
from tests.models.test_hf_parity import make_prompts
from tests.runtime.test_decode_overlap import vocab

API_KEY = "spec-test-key"
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
NUM_NEW_TOKENS = 32


@pytest.fixture(scope="module")
def spec_server(llama_dir, tmp_path_factory):
    args = ["--max-model-len", "256", "--num-kv-blocks", "64", "--api-key", API_KEY, "--served-model-name", "base",
            "--speculative-config", json.dumps(NGRAM)]
    with ServerProcess.running(llama_dir, args, tmp_path_factory.mktemp("spec-server") / "server.log") as process:
        yield process


@pytest.fixture(scope="module")
def references(llama_dir):
    from octavo import LLM

    prompts = make_prompts(vocab(llama_dir))[:4]
    llm = LLM(str(llama_dir), dtype="float32", max_model_len=256, num_kv_blocks=64)
    params = SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    llm.engine.shutdown()
    return prompts, [(o.outputs[0].token_ids, o.outputs[0].text) for o in outputs]


def test_completions_match_and_metrics_count_drafts(spec_server, references):
    import httpx
    import openai

    client = openai.OpenAI(base_url=f"{spec_server.url}/v1", api_key=API_KEY)
    prompts, expected = references
    for prompt, (token_ids, text) in zip(prompts, expected):
        options = dict(model="base", prompt=prompt, max_tokens=NUM_NEW_TOKENS, temperature=0.0)
        completion = client.completions.create(**options, extra_body={"ignore_eos": True, "return_token_ids": True})
        assert completion.choices[0].token_ids == token_ids
        streamed = client.completions.create(**options, stream=True, extra_body={"ignore_eos": True})
        assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == text
    metrics = parse_metrics(httpx.get(f"{spec_server.url}/metrics", headers={"Authorization": f"Bearer {API_KEY}"}).text)
    drafts, accepted = metrics["octavo:spec_decode_num_draft_tokens_total"], metrics["octavo:spec_decode_num_accepted_tokens_total"]
    assert metrics["octavo:spec_decode_num_drafts_total"] > 0 and 0 < accepted <= drafts
    assert metrics["octavo:spec_decode_num_accepted_tokens_per_pos_total{position=0}"] > 0


def test_bad_configuration_stops_the_start(llama_dir, tmp_path):
    args = ["--max-model-len", "256", "--num-kv-blocks", "64", "--speculative-config", '{"method": "medusa", "num_speculative_tokens": 2}']
    process = ServerProcess(llama_dir, args, tmp_path / "server.log")
    try:
        with pytest.raises(RuntimeError, match="speculative method 'medusa' is not supported"):
            process.wait_healthy()
    finally:
        process.stop()
