"""Pooling models against Hugging Face transformers, float32 on the CPU: the
pooled vectors and the classification logits of every architecture within
1e-4, for a batch of inputs of different lengths computed together
(padding-free) while the reference runs each input alone."""

from __future__ import annotations

import json
import random

import pytest
import torch
import torch.nn.functional as F

from octavo import PoolingParams
from tests.models.pooling_checkpoints import hf_hidden_states, hf_logits, hf_model, reference_pool

TOLERANCE = 1e-4
LENGTHS = (1, 4, 9, 17, 30)
MAX_MODEL_LEN = {name: 64 for name in ("bert", "bert_cls3", "bert_cross", "xlm_roberta", "xlm_roberta_cls3", "roberta_cross")}


def random_inputs(vocab_size: int, lengths=LENGTHS, seed: int = 0) -> list[list[int]]:
    """Token ids from 3 up: never a padding id (1 for encoders, 2 for decoders)."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab_size) for _ in range(n)] for n in lengths]


def vocab_size(path) -> int:
    return json.loads((path / "config.json").read_text())["vocab_size"]


def st_modes(path) -> list[str]:
    from octavo.models.pooling_config import _pooling_modes

    return _pooling_modes(json.loads((path / "1_Pooling" / "config.json").read_text()), path)


def assert_close(ours, ref, tolerance: float = TOLERANCE) -> None:
    ours, ref = torch.tensor(ours, dtype=torch.float64), ref.to(torch.float64)
    assert ours.shape == ref.shape
    error = (ours - ref).abs().max().item()
    assert error < tolerance, f"max abs error {error}"


def llm_for(make_llm, name: str, path, **options):
    return make_llm(path, max_model_len=MAX_MODEL_LEN.get(name, 256), **options)


@pytest.mark.parametrize("name", ["bert", "xlm_roberta", "qwen3_embed"])
def test_embeddings_match_transformers(name, pooling_dirs, make_llm):
    path = pooling_dirs(name)
    prompts = random_inputs(vocab_size(path))
    llm = llm_for(make_llm, name, path)
    token_prompts = [{"prompt_token_ids": p} for p in prompts]
    normalized = llm.embed(token_prompts)
    raw = llm.embed(token_prompts, PoolingParams(normalize=False))
    model, modes = hf_model(path), st_modes(path)
    for prompt, ours, ours_raw in zip(prompts, normalized, raw):
        hidden = hf_hidden_states(model, prompt)
        ref = torch.cat([reference_pool(hidden, mode) for mode in modes])
        assert_close(ours_raw.outputs.embedding, ref)
        assert_close(ours.outputs.embedding, F.normalize(ref, dim=0))


def test_decoder_with_task_embed_pools_the_last_token(checkpoint_dirs, make_llm):
    """A causal LM checkpoint (with its LM head) served as an embedder: the
    last token's hidden state, normalised (no sentence-transformers files)."""
    path = checkpoint_dirs["qwen3"]
    prompts = random_inputs(vocab_size(path))
    llm = make_llm(path, task="embed")
    outputs = llm.embed([{"prompt_token_ids": p} for p in prompts])
    model = hf_model(path)
    for prompt, output in zip(prompts, outputs):
        ref = F.normalize(hf_hidden_states(model, prompt)[-1], dim=0)
        assert_close(output.outputs.embedding, ref)


@pytest.mark.parametrize("name", ["bert_cls3", "xlm_roberta_cls3", "roberta_cross", "qwen2_cls3", "qwen3_cls3", "llama_cls2"])
def test_classifier_logits_match_transformers(name, pooling_dirs, make_llm):
    path = pooling_dirs(name)
    prompts = random_inputs(vocab_size(path))
    llm = llm_for(make_llm, name, path)
    token_prompts = [{"prompt_token_ids": p} for p in prompts]
    logits = llm.classify(token_prompts, PoolingParams(task="classify", use_activation=False))
    probs = llm.classify(token_prompts)
    model = hf_model(path)
    for prompt, ours_logits, ours_probs in zip(prompts, logits, probs):
        ref = hf_logits(model, prompt)
        assert_close(ours_logits.outputs.probs, ref)
        # Softmax over the labels; one label (a cross-encoder): sigmoid.
        activated = torch.sigmoid(ref) if len(ref) == 1 else torch.softmax(ref, dim=0)
        assert_close(ours_probs.outputs.probs, activated)


def test_cross_encoder_scores_text_pairs_with_segment_ids(pooling_dirs, make_llm):
    """A one-label BERT cross-encoder: each (query, document) is one input whose
    second segment has token type 1; its score is the sigmoid of the logit."""
    from transformers import AutoTokenizer

    path = pooling_dirs("bert_cross")
    query = "where is the cat"
    documents = ["the cat sits on the mat", "the stock market fell", "a dog runs fast on the river bank"]
    llm = llm_for(make_llm, "bert_cross", path)
    scores = llm.score(query, documents)
    tokenizer, model = AutoTokenizer.from_pretrained(str(path)), hf_model(path)
    for document, output in zip(documents, scores):
        encoded = tokenizer(query, document)
        assert any(encoded["token_type_ids"])
        ref = torch.sigmoid(hf_logits(model, encoded["input_ids"], encoded["token_type_ids"]))
        assert_close([output.outputs.score], ref)
