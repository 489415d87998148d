"""Request and response bodies of the pooling routes (pydantic), held to the
same rules as the generation routes' (``protocol.py``, ``responses.py``):
requests accept unknown fields but type the known ones strictly (numbers the
engine can represent, non-negative token ids); responses are closed, and
are what the served OpenAPI document says the routes answer.

- ``/v1/embeddings``: OpenAI's body, plus ``truncate_prompt_tokens`` and
  ``normalize``.
- ``/score``, ``/v1/score``: vLLM's (``text_1``, ``text_2``).
- ``/rerank``, ``/v1/rerank``, ``/v2/rerank``: Jina's and Cohere's (``query``,
  ``documents`` as strings or ``{"text": ...}``, ``top_n``, ``return_documents``);
  Jina's answer, which Cohere's clients read too.
- ``/classify``: vLLM's (``input`` like the embeddings route's).
"""

from __future__ import annotations

from typing import Literal

from octavo.entrypoints.openai.field_types import Int64, Prompt
from octavo.entrypoints.openai.protocol import OpenAIModel
from octavo.entrypoints.openai.responses import ResponseModel

# ----------------------------------------------------------------- requests


class PoolingRequestFields(OpenAIModel):
    model: str | None = None
    # Keep this many tokens of each input (-1: the model's limit); unset: a too-long input is a 400.
    truncate_prompt_tokens: Int64 | None = None
    user: str | None = None


class EmbeddingRequest(PoolingRequestFields):
    input: Prompt
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Int64 | None = None
    normalize: bool | None = None


class ClassifyRequest(PoolingRequestFields):
    input: Prompt


class ScoreRequest(PoolingRequestFields):
    text_1: str | list[str]
    text_2: str | list[str]


class RerankDocument(OpenAIModel):
    text: str


class RerankRequest(PoolingRequestFields):
    query: str
    documents: list[str | RerankDocument]
    top_n: Int64 | None = None
    return_documents: bool | None = True
    # Cohere's document chunking: not implemented, so refused when set.
    max_chunks_per_doc: Int64 | None = None


# ---------------------------------------------------------------- responses


class PoolingUsage(ResponseModel):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int


class EmbeddingUsage(ResponseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingData(ResponseModel):
    object: Literal["embedding"]
    index: int
    # float: the numbers; base64: their float32 little-endian bytes.
    embedding: list[float] | str


class EmbeddingResponse(ResponseModel):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[EmbeddingData]
    usage: EmbeddingUsage


class ScoreData(ResponseModel):
    index: int
    object: Literal["score"]
    score: float


class ScoreResponse(ResponseModel):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[ScoreData]
    usage: PoolingUsage


class RerankedDocument(ResponseModel):
    text: str


class RerankResult(ResponseModel):
    index: int
    relevance_score: float
    # Absent with return_documents=false.
    document: RerankedDocument | None = None


class RerankUsage(ResponseModel):
    total_tokens: int


class RerankResponse(ResponseModel):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


class ClassifyData(ResponseModel):
    index: int
    label: str
    probs: list[float]
    num_classes: int


class ClassifyResponse(ResponseModel):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[ClassifyData]
    usage: PoolingUsage
