"""The real all-MiniLM-L6-v2 through ``LLM.embed`` against sentence-transformers
(float32, CPU): cosine >= 0.9999 for every sentence of a fixed set; scores
are the cosines of those embeddings."""

from __future__ import annotations

import numpy as np

from tests.models.minilm import MIN_COSINE, SENTENCES, cosines, minilm_path, st_embeddings


def test_embeddings_match_sentence_transformers(make_llm):
    path, reference = minilm_path(), st_embeddings()
    llm = make_llm(path)
    outputs = llm.embed(SENTENCES)
    ours = np.array([output.outputs.embedding for output in outputs])
    assert ours.shape == reference.shape == (len(SENTENCES), 384)
    assert cosines(ours, reference).min() >= MIN_COSINE
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)  # the Normalize module

    scores = llm.score(SENTENCES[4], SENTENCES[5:7])
    expected = reference[5:7] @ reference[4]
    assert np.allclose([s.outputs.score for s in scores], expected, atol=1e-4)
    assert scores[0].outputs.score > scores[1].outputs.score
