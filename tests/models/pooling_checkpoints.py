"""Small random-weight checkpoints of every pooling architecture, and the
transformers reference for each (pooled vectors, classifier logits).

Encoders get a tiny WordPiece tokenizer (BERT's pair template, segment ids);
decoders reuse the byte-level BPE test tokenizer. Each checkpoint has a
twist that exercises its path: mean pooling + Normalize from a
sentence-transformers config (BERT), several pooling modes concatenated
(XLM-R), a bare-decoder checkpoint without the ``model.`` prefix (the
Qwen3-Embedding layout), three labels (classifiers), one label (cross-encoders).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

# id 1 is the padding id of every config (RoBERTa's convention), and never in an input.
SPECIAL = ["<s>", "[PAD]", "</s>", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = (
    "the a cat dog sits runs on mat fast slow red blue house river money bank market stock fell rose "
    "octavo serves many short sentences quickly and returns one vector per input with care what is "
    "where who how machine learning inference engine embeddings rerank score query document"
).split()
ENCODER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, pad_token_id=1)
DECODER = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=512, bos_token_id=0, eos_token_id=1, pad_token_id=2,
)

# name -> (transformers config class, model class, config overrides, sentence-transformers pooling or None, encoder?)
POOLING_ARCHS = {
    "bert": ("BertConfig", "BertModel", dict(max_position_embeddings=64), {"pooling_mode_mean_tokens": True}, True),
    "bert_cls3": ("BertConfig", "BertForSequenceClassification", dict(max_position_embeddings=64, num_labels=3), None, True),
    "bert_cross": ("BertConfig", "BertForSequenceClassification", dict(max_position_embeddings=64, num_labels=1), None, True),
    "xlm_roberta": (
        "XLMRobertaConfig", "XLMRobertaModel", dict(max_position_embeddings=66, type_vocab_size=1),
        {"pooling_mode": ["cls", "max", "weightedmean"]}, True,
    ),
    "xlm_roberta_cls3": (
        "XLMRobertaConfig", "XLMRobertaForSequenceClassification",
        dict(max_position_embeddings=66, type_vocab_size=1, num_labels=3), None, True,
    ),
    "roberta_cross": (
        "RobertaConfig", "RobertaForSequenceClassification",
        dict(max_position_embeddings=66, type_vocab_size=1, num_labels=1), None, True,
    ),
    "qwen3_embed": ("Qwen3Config", "Qwen3Model", dict(head_dim=32), {"pooling_mode_lasttoken": True}, False),
    "llama_cls2": ("LlamaConfig", "LlamaForSequenceClassification", dict(num_labels=2), None, False),
    "qwen2_cls3": ("Qwen2Config", "Qwen2ForSequenceClassification", dict(num_labels=3), None, False),
    "qwen3_cls3": ("Qwen3Config", "Qwen3ForSequenceClassification", dict(head_dim=32, num_labels=3), None, False),
}


def build_wordpiece_tokenizer(out_dir: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = {token: i for i, token in enumerate(SPECIAL + WORDS + [".", ",", "?"])}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tokenizer.decoder = decoders.WordPiece()
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 512, "cls_token": "[CLS]",
        "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]", "mask_token": "[MASK]",
        "model_input_names": ["input_ids", "token_type_ids", "attention_mask"],
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config))
    return out_dir


def write_st_config(out_dir: Path, pooling: dict, normalize: bool = True, max_seq_length: int | None = None) -> None:
    """A sentence-transformers pipeline: Transformer, Pooling, (Normalize)."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (out_dir / "modules.json").write_text(json.dumps(modules))
    (out_dir / "1_Pooling").mkdir(exist_ok=True)
    (out_dir / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    if max_seq_length is not None:
        (out_dir / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}))


def build_pooling_checkpoint(out_dir: Path, name: str, tokenizer_dir: Path, seed: int = 0) -> Path:
    import transformers
    from tokenizers import Tokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    config_name, model_name, overrides, pooling, is_encoder = POOLING_ARCHS[name]
    vocab_size = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size()
    settings = dict(ENCODER if is_encoder else DECODER, vocab_size=vocab_size, **overrides)
    config = getattr(transformers, config_name)(**settings)
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config)
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if "norm" not in param_name.lower():
                param.normal_(0.0, 0.08)
    model.save_pretrained(str(out_dir))
    if model_name == "Qwen3Model":
        # Qwen3-Embedding's layout: the bare decoder, labelled as the causal LM.
        saved = json.loads((out_dir / "config.json").read_text())
        (out_dir / "config.json").write_text(json.dumps({**saved, "architectures": ["Qwen3ForCausalLM"]}))
    for file in tokenizer_dir.iterdir():
        if file.is_file():
            shutil.copy(file, out_dir / file.name)
    if pooling is not None:
        write_st_config(out_dir, pooling)
    return out_dir


def hf_model(path: Path):
    """The transformers model saved at ``path`` (a classifier, or the bare encoder / decoder)."""
    import transformers

    config = json.loads((path / "config.json").read_text())
    architecture = config["architectures"][0]
    if architecture.endswith("ForSequenceClassification"):
        cls = transformers.AutoModelForSequenceClassification
    else:
        cls = transformers.AutoModel
    return cls.from_pretrained(str(path), dtype=torch.float32).eval()


@torch.no_grad()
def _hf_forward(model, token_ids: list[int], token_type_ids: list[int] | None):
    """One unpadded input through ``model`` (a batch of one)."""
    kwargs = {"input_ids": torch.tensor([token_ids])}
    if token_type_ids is not None:
        kwargs["token_type_ids"] = torch.tensor([token_type_ids])
    return model(**kwargs)


def hf_hidden_states(model, token_ids: list[int], token_type_ids: list[int] | None = None) -> torch.Tensor:
    """Last hidden states [len, hidden]."""
    return _hf_forward(model, token_ids, token_type_ids).last_hidden_state[0]


def hf_logits(model, token_ids: list[int], token_type_ids: list[int] | None = None) -> torch.Tensor:
    return _hf_forward(model, token_ids, token_type_ids).logits[0]


def reference_pool(hidden: torch.Tensor, mode: str) -> torch.Tensor:
    """sentence-transformers' pooling of one unpadded sequence, written out plainly."""
    if mode == "cls":
        return hidden[0]
    if mode == "lasttoken":
        return hidden[-1]
    if mode == "mean":
        return hidden.mean(0)
    if mode == "max":
        return hidden.max(0).values
    if mode == "mean_sqrt_len_tokens":
        return hidden.sum(0) / len(hidden) ** 0.5
    if mode == "weightedmean":
        weights = torch.arange(1, len(hidden) + 1, dtype=hidden.dtype)[:, None]
        return (hidden * weights).sum(0) / weights.sum()
    raise ValueError(mode)
