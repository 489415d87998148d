"""``octavo serve`` on the real all-MiniLM-L6-v2 (the task picked from the
checkpoint: embeddings), through the ``openai`` SDK: every sentence of a
fixed set within cosine 0.9999 of sentence-transformers, base64 (the SDK's
default) and float alike; rerank and score from the same embeddings; a
generation route is a clear 400; every new route needs the key."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from tests.entrypoints.server.server_process import ServerProcess
from tests.models.minilm import MIN_COSINE, SENTENCES, cosines, minilm_path, st_embeddings

pytest.importorskip("fastapi")
API_KEY = "embed-key"
MODEL = "minilm"


@pytest.fixture(scope="module")
def minilm_server(tmp_path_factory):
    path = minilm_path()
    args = ["--api-key", API_KEY, "--served-model-name", MODEL, "--max-num-seqs", "32"]
    process = ServerProcess(path, args, tmp_path_factory.mktemp("embed-server") / "server.log")
    process.wait_healthy()
    yield process
    process.stop()


@pytest.fixture
def client(minilm_server):
    import openai

    with openai.OpenAI(base_url=f"{minilm_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120) as client:
        yield client


def post(server, path: str, body: dict, key: str | None = API_KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{server.url}{path}", json=body, headers=headers, timeout=120)


@pytest.mark.parametrize("encoding_format", [None, "float"])
def test_openai_sdk_embeddings_match_sentence_transformers(client, encoding_format):
    options = {"encoding_format": encoding_format} if encoding_format else {}  # the SDK asks for base64 by default
    response = client.embeddings.create(model=MODEL, input=SENTENCES, **options)
    ours = np.array([item.embedding for item in sorted(response.data, key=lambda d: d.index)])
    assert cosines(ours, st_embeddings()).min() >= MIN_COSINE
    assert response.model == MODEL and response.usage.prompt_tokens == response.usage.total_tokens > len(SENTENCES)


def test_one_text_and_matryoshka_dimensions(client):
    reference = st_embeddings()
    one = client.embeddings.create(model=MODEL, input=SENTENCES[1]).data[0].embedding
    assert cosines(one, reference[1]) >= MIN_COSINE
    short = np.array(client.embeddings.create(model=MODEL, input=SENTENCES[1], dimensions=64).data[0].embedding)
    assert short.shape == (64,) and abs(np.linalg.norm(short) - 1) < 1e-5
    assert cosines(short, reference[1][:64]) >= MIN_COSINE


def test_rerank_and_score_use_cosine_similarity(minilm_server):
    reference = st_embeddings()
    query, documents = SENTENCES[4], SENTENCES[5:8]
    expected = reference[5:8] @ reference[4]
    ranked = post(minilm_server, "/v1/rerank", {"model": MODEL, "query": query, "documents": documents}).json()
    assert [r["index"] for r in ranked["results"]] == list(np.argsort(-expected))
    assert np.allclose([r["relevance_score"] for r in ranked["results"]], np.sort(expected)[::-1], atol=1e-4)
    scored = post(minilm_server, "/v1/score", {"text_1": query, "text_2": documents}).json()
    assert np.allclose([d["score"] for d in scored["data"]], expected, atol=1e-4)


def test_the_wrong_route_and_a_missing_key(minilm_server, client):
    import openai

    with pytest.raises(openai.BadRequestError, match="does not generate text") as raised:
        client.completions.create(model=MODEL, prompt="hello", max_tokens=2)
    assert raised.value.code == "unsupported_task"
    error = post(minilm_server, "/classify", {"input": "hello"}).json()["error"]
    assert error["code"] == "unsupported_task"
    too_long = post(minilm_server, "/v1/embeddings", {"input": "word " * 300}).json()["error"]
    assert too_long["code"] == "prompt_too_long" and "truncate_prompt_tokens" in too_long["message"]
    for path in ("/v1/embeddings", "/rerank", "/v1/score", "/classify"):
        assert post(minilm_server, path, {"input": "hello"}, key=None).status_code == 401


POOLING_PATHS = {"/v1/embeddings", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank", "/classify"}


def test_the_pooling_routes_keep_their_openapi_contract(minilm_server):
    """schemathesis on the pooling operations of the served document, on the pooling server:
    bodies that follow it and bodies that break it, never a 5xx, every answer as declared."""
    pytest.importorskip("schemathesis")
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis.generation import GenerationMode
    from schemathesis.specs.openapi.checks import negative_data_rejection

    from tests.entrypoints.server.test_fuzz_openapi import CHECKS

    headers = {"Authorization": f"Bearer {API_KEY}"}
    document = httpx.get(f"{minilm_server.url}/openapi.json", headers=headers, timeout=60).json()
    assert POOLING_PATHS <= set(document["paths"])
    for component in document["components"]["schemas"].values():
        if component.get("additionalProperties") is True:
            component["additionalProperties"] = False  # spend the examples on the known fields
    schema = schemathesis.openapi.from_dict(document)
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        checks = CHECKS + ([negative_data_rejection] if mode == GenerationMode.NEGATIVE else [])
        for result in schema.get_all_operations():
            operation = result.ok()
            if operation.path not in POOLING_PATHS:
                continue

            @settings(max_examples=5, deadline=None, database=None, suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def check(case):
                case.call_and_validate(base_url=minilm_server.url, headers=headers, checks=checks, timeout=60)

            check()
    assert httpx.get(f"{minilm_server.url}/health", timeout=60).status_code == 200


def test_sagemaker_invocations_pick_the_pooling_route(minilm_server):
    query, documents = SENTENCES[4], SENTENCES[5:8]
    for body, path in (({"input": SENTENCES[:2]}, "/v1/embeddings"), ({"query": query, "documents": documents}, "/v1/rerank"),
                       ({"text_1": query, "text_2": documents}, "/v1/score")):
        got, expected = post(minilm_server, "/invocations", body).json(), post(minilm_server, path, body).json()
        for volatile in ("id", "created"):
            got.pop(volatile, None), expected.pop(volatile, None)
        assert got == expected, path
    refused = post(minilm_server, "/invocations", {"messages": [{"role": "user", "content": "hi"}]})
    assert refused.status_code == 400 and "input" in refused.json()["error"]["message"]
