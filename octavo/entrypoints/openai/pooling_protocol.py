"""Request bodies of the pooling routes (pydantic), typed as strictly as the
generation routes' (``protocol.py``): unknown fields are accepted, known
ones must have the right JSON type.

- ``/v1/embeddings``: OpenAI's body, plus ``truncate_prompt_tokens`` and
  ``normalize``.
- ``/score``, ``/v1/score``: vLLM's (``text_1``, ``text_2``).
- ``/rerank``, ``/v1/rerank``, ``/v2/rerank``: Jina's and Cohere's (``query``,
  ``documents`` as strings or ``{"text": ...}``, ``top_n``, ``return_documents``).
- ``/classify``: vLLM's (``input`` like the embeddings route's).
"""

from __future__ import annotations

from typing import Literal

from octavo.entrypoints.openai.protocol import OpenAIModel

# What an embeddings or classify request's ``input`` may be.
PoolingInputField = str | list[str] | list[int] | list[list[int]]


class PoolingRequestFields(OpenAIModel):
    model: str | None = None
    truncate_prompt_tokens: int | None = None
    user: str | None = None


class EmbeddingRequest(PoolingRequestFields):
    input: PoolingInputField
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    normalize: bool | None = None


class ClassifyRequest(PoolingRequestFields):
    input: PoolingInputField


class ScoreRequest(PoolingRequestFields):
    text_1: str | list[str]
    text_2: str | list[str]


class RerankDocument(OpenAIModel):
    text: str


class RerankRequest(PoolingRequestFields):
    query: str
    documents: list[str | RerankDocument]
    top_n: int | None = None
    return_documents: bool | None = True
    # Cohere's document chunking: not implemented, so refused when set.
    max_chunks_per_doc: int | None = None
