"""Reading a checkpoint's pooling setup: the task, sentence-transformers'
modules, per-architecture defaults and a classifier's labels and activation."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from octavo.errors import InvalidArgumentError, UnsupportedModelError
from octavo.models.bert import BertForSequenceClassification, BertModel
from octavo.models.config import parse_arch_config
from octavo.models.decoder_pooling import as_embedding_model
from octavo.models.pooling_config import build_pooler_config, resolve_task
from octavo.models.qwen3 import Qwen3ForCausalLM
from tests.models.pooling_checkpoints import write_st_config

BERT = dict(
    architectures=["BertModel"], model_type="bert", vocab_size=100, hidden_size=32, intermediate_size=64,
    num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=512, type_vocab_size=2,
)


def arch(**overrides):
    return parse_arch_config({**BERT, **overrides})


def test_the_task_comes_from_the_architecture_or_sentence_transformers_files(tmp_path):
    assert resolve_task("auto", BertModel, tmp_path) == "embed"
    assert resolve_task("auto", BertForSequenceClassification, tmp_path) == "classify"
    assert resolve_task("auto", Qwen3ForCausalLM, tmp_path) == "generate"
    write_st_config(tmp_path, {"pooling_mode_lasttoken": True})
    assert resolve_task("auto", Qwen3ForCausalLM, tmp_path) == "embed"  # Qwen3-Embedding
    assert resolve_task("generate", Qwen3ForCausalLM, tmp_path) == "generate"


@pytest.mark.parametrize(
    "task, model_class, message",
    [
        ("generate", BertModel, "cannot serve --task generate"),
        ("classify", BertModel, "cannot serve --task classify"),
        ("embed", BertForSequenceClassification, "cannot serve --task embed"),
        ("classify", Qwen3ForCausalLM, "needs a \\*ForSequenceClassification checkpoint"),
        ("summarize", BertModel, "task must be one of"),
    ],
)
def test_a_task_the_model_cannot_serve_is_refused(tmp_path, task, model_class, message):
    with pytest.raises(InvalidArgumentError, match=message):
        resolve_task(task, model_class, tmp_path)


def test_sentence_transformers_modes_normalize_and_limits(tmp_path):
    write_st_config(tmp_path, {"pooling_mode": ["cls", "mean"]}, normalize=False, max_seq_length=128)
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128, "do_lower_case": True}))
    pooler = build_pooler_config("embed", arch(), tmp_path, BertModel)
    assert pooler.pooling_modes == ["cls", "mean"] and pooler.output_size == 64
    assert not pooler.normalize and pooler.lowercase
    assert pooler.max_model_len == 128 and pooler.num_token_types == 2 and pooler.is_encoder


def test_legacy_flags_keep_sentence_transformers_order(tmp_path):
    flags = {"pooling_mode_lasttoken": True, "pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True}
    write_st_config(tmp_path, flags)
    pooler = build_pooler_config("embed", arch(), tmp_path, BertModel)
    assert pooler.pooling_modes == ["cls", "mean", "lasttoken"] and pooler.normalize


def test_defaults_without_sentence_transformers_files(tmp_path):
    encoder = build_pooler_config("embed", arch(matryoshka_dimensions=[8, 16]), tmp_path, BertModel)
    assert encoder.pooling_modes == ["cls"] and encoder.normalize and encoder.matryoshka_dimensions == [8, 16]
    decoder = build_pooler_config("embed", arch(), tmp_path, as_embedding_model(Qwen3ForCausalLM))
    assert decoder.pooling_modes == ["lasttoken"] and not decoder.is_encoder and decoder.num_token_types == 0


def test_a_module_octavo_does_not_run_is_refused(tmp_path):
    write_st_config(tmp_path, {"pooling_mode": "mean"})
    modules = json.loads((tmp_path / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"})
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(UnsupportedModelError, match="Dense"):
        build_pooler_config("embed", arch(), tmp_path, BertModel)


def test_an_unknown_pooling_mode_is_refused(tmp_path):
    write_st_config(tmp_path, {"pooling_mode": "median"})
    with pytest.raises(UnsupportedModelError, match="median"):
        build_pooler_config("embed", arch(), tmp_path, BertModel)


@pytest.mark.parametrize(
    "overrides, activation",
    [
        ({"num_labels": 1}, "sigmoid"),
        ({"id2label": {"0": "neg", "1": "pos"}}, "softmax"),
        ({"num_labels": 3, "problem_type": "multi_label_classification"}, "sigmoid"),
        ({"num_labels": 1, "problem_type": "regression"}, "none"),
        ({"num_labels": 1, "sbert_ce_default_activation_function": "torch.nn.modules.linear.Identity"}, "none"),
        ({"num_labels": 1, "sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Sigmoid"}}, "sigmoid"),
    ],
)
def test_classifier_labels_and_activation(tmp_path, overrides, activation):
    config = arch(architectures=["BertForSequenceClassification"], **overrides)
    pooler = build_pooler_config("classify", config, tmp_path, BertForSequenceClassification)
    assert pooler.activation == activation
    assert pooler.output_size == len(pooler.labels)
    if "id2label" in overrides:
        assert pooler.labels == ["neg", "pos"]


def test_an_unknown_cross_encoder_activation_is_refused(tmp_path):
    config = arch(num_labels=1, sbert_ce_default_activation_function="torch.nn.modules.activation.Tanh")
    with pytest.raises(UnsupportedModelError, match="Tanh"):
        build_pooler_config("classify", config, tmp_path, BertForSequenceClassification)


def test_xlm_roberta_positions_leave_room_for_the_padding_offset():
    from octavo.models.xlm_roberta import XLMRobertaModel

    config = SimpleNamespace(max_position_embeddings=514, raw={"pad_token_id": 1})
    assert XLMRobertaModel.max_input_len(config) == 512


def test_the_pair_similarity_and_default_prompt_come_from_sentence_transformers(tmp_path, caplog):
    write_st_config(tmp_path, {"pooling_mode": "mean"})
    config = {"similarity_fn_name": "dot", "default_prompt_name": "query", "prompts": {"query": "query: "}}
    (tmp_path / "config_sentence_transformers.json").write_text(json.dumps(config))
    with caplog.at_level("WARNING"):
        pooler = build_pooler_config("embed", arch(), tmp_path, BertModel)
    assert pooler.similarity == "dot"
    assert "prepends the prompt 'query'" in caplog.text
    (tmp_path / "config_sentence_transformers.json").write_text(json.dumps({"similarity_fn_name": "jaccard"}))
    with pytest.raises(UnsupportedModelError, match="jaccard"):
        build_pooler_config("embed", arch(), tmp_path, BertModel)


@pytest.mark.parametrize("similarity", ["cosine", "dot", "euclidean", "manhattan"])
def test_bi_encoder_scores_follow_the_similarity(similarity):
    from octavo.entrypoints.pooling_inputs import ScorePlan

    a, b = np.array([2.0, 4.0]), np.array([3.0, 4.0])
    expected = {
        "cosine": [a @ b / (np.linalg.norm(a) * 5.0), 1.0],
        "dot": [a @ b, 25.0],
        "euclidean": [-np.linalg.norm(a - b), 0.0],  # sentence-transformers' negated distances
        "manhattan": [-np.abs(a - b).sum(), 0.0],
    }[similarity]
    plan = ScorePlan([("a", "b"), ("b", "b")], False, [], [(0, 1), (1, 1)], similarity)
    assert np.allclose(plan.scores([a, b]), expected)
