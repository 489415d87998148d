"""The pooling routes in process (the app on an ``LLMEngine``, random-weight
checkpoints): embeddings, score, rerank and classify answer with the same
numbers as ``LLM``, in each API's shape; bad requests get 4xx error objects;
a route for the other kind of model is a clear 400."""

from __future__ import annotations

import base64
import contextlib

import numpy as np
import pytest

pytest.importorskip("fastapi")

from starlette.testclient import TestClient  # noqa: E402

from octavo.entrypoints.openai.app import build_app  # noqa: E402
from octavo.entrypoints.openai.config import ServerConfig  # noqa: E402
from tests.models.conftest import pooling_dirs, wordpiece_dir  # noqa: E402,F401

KEY = {"Authorization": "Bearer k"}
QUERY = "where is the cat"
DOCUMENTS = ["the stock market fell", "the cat sits on the mat", "a dog runs on the river bank"]


@contextlib.contextmanager
def serving(path, reference: bool = True, **options):
    """(reference, client): the app on one engine, and ``LLM`` on another engine
    of the same checkpoint for the expected numbers (the server's engine thread
    steps its engine; a test must not step it too)."""
    from octavo import LLM

    llms = []

    def make():
        llms.append(LLM(str(path), dtype="float32", max_model_len=64, **options))
        return llms[-1]

    try:
        served, llm = make(), make() if reference else None
        app = build_app(served.engine, ServerConfig(served_model_names=["m"], api_key="k", max_queued_requests=8))
        with TestClient(app, headers=KEY) as client:
            yield llm, client
    finally:
        for made in llms:
            made.engine.shutdown()


@pytest.fixture(scope="module")
def cross_encoder(pooling_dirs):  # noqa: F811
    with serving(pooling_dirs("bert_cross")) as pair:
        yield pair


@pytest.fixture(scope="module")
def embedder(pooling_dirs):  # noqa: F811
    with serving(pooling_dirs("bert")) as pair:
        yield pair


def assert_error(response, status: int, code: str, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code
    if param is not None:
        assert error["param"] == param
    return error


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_rerank_sorts_documents_by_the_cross_encoders_score(cross_encoder, path):
    llm, client = cross_encoder
    expected = [o.outputs.score for o in llm.score(QUERY, DOCUMENTS)]
    body = {"model": "m", "query": QUERY, "documents": [DOCUMENTS[0], {"text": DOCUMENTS[1]}, DOCUMENTS[2]], "top_n": 2}
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    result = response.json()
    order = sorted(range(3), key=lambda i: expected[i], reverse=True)[:2]
    assert [r["index"] for r in result["results"]] == order
    assert np.allclose([r["relevance_score"] for r in result["results"]], [expected[i] for i in order], atol=1e-6)
    assert [r["document"]["text"] for r in result["results"]] == [DOCUMENTS[i] for i in order]
    assert result["usage"]["total_tokens"] > 0 and result["model"] == "m"
    no_documents = client.post(path, json={**body, "return_documents": False}).json()
    assert all("document" not in r for r in no_documents["results"])


def test_score_pairs_one_to_many_and_many_to_many(cross_encoder):
    llm, client = cross_encoder
    one_to_many = client.post("/v1/score", json={"text_1": QUERY, "text_2": DOCUMENTS}).json()
    assert [d["index"] for d in one_to_many["data"]] == [0, 1, 2]
    expected = [o.outputs.score for o in llm.score(QUERY, DOCUMENTS)]
    assert np.allclose([d["score"] for d in one_to_many["data"]], expected, atol=1e-6)
    pairs = client.post("/score", json={"text_1": DOCUMENTS[:2], "text_2": DOCUMENTS[1:]}).json()
    assert len(pairs["data"]) == 2 and pairs["object"] == "list"
    mismatched = client.post("/v1/score", json={"text_1": DOCUMENTS[:2], "text_2": DOCUMENTS})
    assert_error(mismatched, 400, "invalid_argument", "text_2")


def test_bad_rerank_requests_are_4xx(cross_encoder):
    _, client = cross_encoder
    assert_error(client.post("/rerank", json={"query": QUERY, "documents": []}), 400, "invalid_argument", "documents")
    assert_error(client.post("/rerank", json={"query": QUERY, "documents": DOCUMENTS, "top_n": 0}), 400, "invalid_argument")
    assert_error(client.post("/rerank", json={"query": 3, "documents": DOCUMENTS}), 400, "invalid_request_body", "query")
    chunked = {"query": QUERY, "documents": DOCUMENTS, "max_chunks_per_doc": 2}
    assert_error(client.post("/rerank", json=chunked), 400, "invalid_argument", "max_chunks_per_doc")
    too_many = {"query": QUERY, "documents": ["the cat"] * 300}
    assert_error(client.post("/rerank", json=too_many), 400, "invalid_argument", "documents")
    assert_error(client.post("/rerank", json={"model": "other", "query": QUERY, "documents": DOCUMENTS}), 404, "model_not_found")


def test_classify_returns_labels_and_probabilities(pooling_dirs):  # noqa: F811
    with serving(pooling_dirs("bert_cls3")) as (llm, client):
        response = client.post("/classify", json={"model": "m", "input": ["the cat sits", "the market fell"]})
        assert response.status_code == 200, response.text
        data = response.json()["data"]
        expected = [o.outputs.probs for o in llm.classify(["the cat sits", "the market fell"])]
        for item, probs in zip(data, expected):
            assert np.allclose(item["probs"], probs, atol=1e-6) and item["num_classes"] == 3
            assert item["label"] == f"LABEL_{int(np.argmax(probs))}"
        assert_error(client.post("/v1/score", json={"text_1": "a", "text_2": "b"}), 400, "unsupported_task")
        assert_error(client.post("/v1/embeddings", json={"input": "a"}), 400, "unsupported_task")


def test_embeddings_float_base64_and_token_ids(embedder):
    llm, client = embedder
    texts = ["the cat sits on the mat", "octavo serves embeddings"]
    expected = np.array([o.outputs.embedding for o in llm.embed(texts)])
    as_float = client.post("/v1/embeddings", json={"model": "m", "input": texts}).json()
    assert as_float["object"] == "list" and [d["index"] for d in as_float["data"]] == [0, 1]
    assert np.allclose([d["embedding"] for d in as_float["data"]], expected, atol=1e-6)
    as_base64 = client.post("/v1/embeddings", json={"input": texts, "encoding_format": "base64"}).json()
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in as_base64["data"]]
    assert np.allclose(decoded, expected, atol=1e-6)
    token_ids = llm.get_tokenizer()(texts[0])["input_ids"]
    one = client.post("/v1/embeddings", json={"input": token_ids}).json()
    assert np.allclose(one["data"][0]["embedding"], expected[0], atol=1e-6)
    assert one["usage"] == {"prompt_tokens": len(token_ids), "total_tokens": len(token_ids)}
    short = client.post("/v1/embeddings", json={"input": texts[0], "dimensions": 4}).json()["data"][0]["embedding"]
    assert len(short) == 4 and abs(np.linalg.norm(short) - 1) < 1e-5


@pytest.mark.parametrize("batches", [True, False], ids=["one-batch-command", "one-command-each"])
def test_many_inputs_are_admitted_together_or_one_by_one(embedder, monkeypatch, batches):
    """The engine takes the request's inputs in one batch command where it can
    (``AsyncEngine.add_pooling_batch``), else one command each:
    the same vectors either way."""
    from octavo.entrypoints.async_engine import AsyncEngine

    llm, client = embedder
    texts = [f"the cat number {i} sits on the mat" for i in range(12)]
    expected = np.array([o.outputs.embedding for o in llm.embed(texts)])
    monkeypatch.setattr(AsyncEngine, "takes_pooling_batches", property(lambda self: batches))
    batched = []
    add_batch = AsyncEngine.add_pooling_batch

    async def counting(self, batch, params):
        batched.append(len(batch.request_ids))
        return await add_batch(self, batch, params)

    monkeypatch.setattr(AsyncEngine, "add_pooling_batch", counting)
    data = client.post("/v1/embeddings", json={"model": "m", "input": texts}).json()["data"]
    assert np.allclose([d["embedding"] for d in data], expected, atol=1e-6)
    assert batched == ([len(texts)] if batches else [])


def test_bad_embeddings_requests_are_4xx(embedder):
    _, client = embedder
    assert_error(client.post("/v1/embeddings", json={"input": []}), 400, "invalid_argument", "input")
    assert_error(client.post("/v1/embeddings", json={"input": [[]]}), 400, "invalid_argument")
    assert_error(client.post("/v1/embeddings", json={"input": "a", "encoding_format": "hex"}), 400, "invalid_request_body")
    assert_error(client.post("/v1/embeddings", json={"input": "a", "dimensions": 0}), 400, "invalid_argument", "dimensions")
    assert_error(client.post("/v1/embeddings", json={"input": [1, 10**9]}), 400, "invalid_argument")
    assert_error(client.post("/v1/embeddings", json={"input": [1, -2]}), 400, "invalid_request_body")
    assert_error(client.post("/v1/embeddings", json={"input": "the cat " * 40}), 400, "prompt_too_long")
    truncated = client.post("/v1/embeddings", json={"input": "the cat " * 40, "truncate_prompt_tokens": -1})
    assert truncated.status_code == 200 and truncated.json()["usage"]["prompt_tokens"] == 64
    assert_error(client.post("/v1/embeddings", json={"input": ["a"] * 300}), 400, "invalid_argument", "input")
    assert_error(client.post("/classify", json={"input": "a"}), 400, "unsupported_task")
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert_error(client.post("/v1/chat/completions", json=chat), 400, "unsupported_task")
    assert_error(client.post("/v1/completions", json={"prompt": "hi"}), 400, "unsupported_task")
    assert client.post("/v1/embeddings", json={"input": "a"}, headers={"Authorization": "Bearer no"}).status_code == 401


def test_a_generative_model_refuses_the_pooling_routes(llama_dir):
    with serving(llama_dir, reference=False, max_num_seqs=4) as (_, client):
        assert_error(client.post("/v1/embeddings", json={"input": "a"}), 400, "unsupported_task", "model")
        assert_error(client.post("/rerank", json={"query": "a", "documents": ["b"]}), 400, "unsupported_task")
        assert_error(client.post("/classify", json={"input": "a"}), 400, "unsupported_task")


def test_the_task_flag_reaches_the_engine(pooling_dirs):  # noqa: F811
    """``--task`` (shared by generate and serve) overrides the checkpoint's task, or says why it cannot."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "octavo.entrypoints.cli.main", "generate", "--model", str(pooling_dirs("bert"))]
    refused = subprocess.run([*command, "--task", "generate", "hi"], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "BertModel serves 'embed'; it cannot serve --task generate" in refused.stderr
    pooled = subprocess.run([*command, "hi"], capture_output=True, text=True, timeout=300)
    assert pooled.returncode == 2 and "does not generate text" in pooled.stderr
