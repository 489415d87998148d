"""Which task a checkpoint serves, and how it pools (``PoolerConfig``).

The task: ``--task`` when given; otherwise the architecture's own
(``*ForSequenceClassification`` classify, ``BertModel`` and ``XLMRobertaModel``
embed), and a causal LM embeds when the checkpoint carries a
sentence-transformers pipeline (``modules.json`` with a Pooling module, as
Qwen3-Embedding does) and generates otherwise.

Embeddings follow sentence-transformers' files when present: the modes of
``1_Pooling/config.json`` (old ``pooling_mode_*`` flags or the newer
``pooling_mode``), normalisation iff a Normalize module is listed,
``max_seq_length`` and ``do_lower_case`` from ``sentence_bert_config.json``.
A module Octavo does not run (Dense, ...) is refused, never skipped, since
skipping it would change the vectors. Without those files: the
architecture's default mode (CLS for encoders, last token for decoders),
normalised. Classifiers read ``config.json``: labels from ``id2label``, the
activation from the cross-encoder's saved one, else ``problem_type``, else
sigmoid for one label and softmax for more.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from octavo.core.pooling_params import PoolerConfig
from octavo.errors import InvalidArgumentError, ModelLoadError, UnsupportedModelError
from octavo.models.config import ModelArchConfig, read_json
from octavo.models.pooling import POOLING_MODES

logger = logging.getLogger(__name__)

TASKS = ("auto", "generate", "embed", "classify")
# sentence-transformers' pre-v4 flags, in the order it concatenates them.
_LEGACY_MODE_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
SIMILARITIES = ("cosine", "dot", "euclidean", "manhattan")
# A cross-encoder's saved activation (torch class path) -> ours.
_ACTIVATION_CLASSES = {"Identity": "none", "Sigmoid": "sigmoid", "Softmax": "softmax"}


def resolve_task(requested: str, model_class: type, model_dir: Path | None) -> str:
    """``generate``, ``embed`` or ``classify`` for this checkpoint."""
    if requested not in TASKS:
        raise InvalidArgumentError(f"task must be one of {', '.join(TASKS)}, got {requested!r}", param="task")
    native = getattr(model_class, "pooling_task", None)
    if requested == "auto":
        if native is not None:
            return native
        return "embed" if model_dir is not None and _has_st_pooling(model_dir) else "generate"
    if native is not None and requested != native:
        raise InvalidArgumentError(
            f"{model_class.__name__} serves {native!r}; it cannot serve --task {requested}", param="task"
        )
    if native is None and requested == "classify":
        raise InvalidArgumentError(
            f"--task classify needs a *ForSequenceClassification checkpoint, not {model_class.__name__}", param="task"
        )
    return requested


def build_pooler_config(task: str, arch: ModelArchConfig, model_dir: Path | None, model_class: type) -> PoolerConfig:
    """How ``model_class`` (a pooling model: ``is_encoder``, ``default_pooling_mode``,
    ``max_input_len``) serving ``task`` (embed or classify) pools."""
    is_encoder = model_class.is_encoder
    max_len = model_class.max_input_len(arch)
    # BERT's default when the config does not say (as BertEmbeddings builds it).
    num_token_types = int(arch.raw.get("type_vocab_size", 2)) if is_encoder else 0
    st = _read_st_files(model_dir) if model_dir is not None else None
    if st is not None and st["max_seq_length"] is not None:
        max_len = min(max_len, int(st["max_seq_length"]))
    common = dict(
        max_model_len=max_len,
        is_encoder=is_encoder,
        num_token_types=num_token_types,
        lowercase=bool(st and st["lowercase"]),
        similarity=st["similarity"] if st else "cosine",
    )
    if task == "classify":
        num_labels, labels = _labels(arch.raw)
        return PoolerConfig(
            task="classify", output_size=num_labels, activation=_activation(arch.raw, num_labels), labels=labels, **common
        )
    if st is not None and st["modes"]:
        modes, normalize = st["modes"], st["normalize"]
    else:
        modes, normalize = [model_class.default_pooling_mode], True
    matryoshka = arch.raw.get("matryoshka_dimensions")
    return PoolerConfig(
        task="embed",
        output_size=arch.hidden_size * len(modes),
        pooling_modes=modes,
        normalize=normalize,
        matryoshka_dimensions=[int(d) for d in matryoshka] if matryoshka else None,
        **common,
    )


def _st_modules(model_dir: Path) -> list[dict[str, Any]] | None:
    path = model_dir / "modules.json"
    if not path.exists():
        return None
    try:
        modules = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ModelLoadError(f"{path} is not a list of modules")
    return modules


def _module_kind(module: dict[str, Any]) -> str:
    return str(module.get("type", "")).rsplit(".", 1)[-1]


def _has_st_pooling(model_dir: Path) -> bool:
    modules = _st_modules(model_dir)
    return bool(modules) and any(_module_kind(m) == "Pooling" for m in modules)


def _read_st_files(model_dir: Path) -> dict[str, Any] | None:
    modules = _st_modules(model_dir)
    if modules is None:
        return None
    result: dict[str, Any] = {"modes": None, "normalize": False, "max_seq_length": None, "lowercase": False}
    for module in sorted(modules, key=lambda m: m.get("idx", 0)):
        kind, folder = _module_kind(module), model_dir / str(module.get("path", ""))
        if kind == "Transformer":
            bert_config = folder / "sentence_bert_config.json"
            if bert_config.exists():
                config = read_json(bert_config)
                result["max_seq_length"] = config.get("max_seq_length")
                result["lowercase"] = bool(config.get("do_lower_case", False))
        elif kind == "Pooling":
            result["modes"] = _pooling_modes(read_json(folder / "config.json"), folder)
        elif kind == "Normalize":
            result["normalize"] = True
        else:
            raise UnsupportedModelError(
                f"modules.json lists a sentence-transformers {kind or '(untyped)'} module, which Octavo does not run "
                "(it runs Transformer, Pooling and Normalize); its embeddings would differ"
            )
    if modules and result["modes"] is None:
        raise UnsupportedModelError("modules.json has no Pooling module: the model gives no sentence embedding")
    result["similarity"] = _st_similarity(model_dir)
    return result


def _st_similarity(model_dir: Path) -> str:
    """``config_sentence_transformers.json``'s pair similarity; its default prompt is only reported."""
    path = model_dir / "config_sentence_transformers.json"
    config = read_json(path) if path.exists() else {}
    prompt_name = config.get("default_prompt_name")
    if prompt_name:
        logger.warning(
            "%s: sentence-transformers prepends the prompt %r to every text by default; Octavo embeds texts as "
            "they are sent, so send the prompt with them to get the same vectors", path, prompt_name,
        )
    similarity = config.get("similarity_fn_name") or "cosine"
    if similarity not in SIMILARITIES:
        raise UnsupportedModelError(f"{path}: similarity_fn_name {similarity!r} is not supported ({', '.join(SIMILARITIES)})")
    return similarity


def _pooling_modes(config: dict[str, Any], folder: Path) -> list[str]:
    mode = config.get("pooling_mode")
    if mode is None:
        modes = [name for flag, name in _LEGACY_MODE_FLAGS.items() if config.get(flag)] or ["mean"]
    else:
        modes = [mode] if isinstance(mode, str) else list(mode)
    unknown = [m for m in modes if m not in POOLING_MODES]
    if unknown:
        raise UnsupportedModelError(f"{folder}/config.json: pooling mode {unknown[0]!r} is not supported ({', '.join(POOLING_MODES)})")
    return modes


def _labels(raw: dict[str, Any]) -> tuple[int, list[str]]:
    id2label = raw.get("id2label")
    if isinstance(id2label, dict) and id2label:
        try:
            by_index = {int(k): str(v) for k, v in id2label.items()}
        except ValueError as exc:
            raise ModelLoadError(f"config.json: id2label has a key that is not an index: {exc}") from exc
        num_labels = len(by_index)
        return num_labels, [by_index.get(i, f"LABEL_{i}") for i in range(num_labels)]
    num_labels = int(raw.get("num_labels", 2))
    return num_labels, [f"LABEL_{i}" for i in range(num_labels)]


def _activation(raw: dict[str, Any], num_labels: int) -> str:
    saved = (raw.get("sentence_transformers") or {}).get("activation_fn") or raw.get("sbert_ce_default_activation_function")
    if saved:
        name = str(saved).rsplit(".", 1)[-1]
        if name not in _ACTIVATION_CLASSES:
            raise UnsupportedModelError(f"config.json: the cross-encoder activation {saved!r} is not supported")
        return _ACTIVATION_CLASSES[name]
    problem_type = raw.get("problem_type")
    if problem_type == "regression":
        return "none"
    if problem_type == "multi_label_classification":
        return "sigmoid"
    if problem_type == "single_label_classification":
        return "softmax"
    return "sigmoid" if num_labels == 1 else "softmax"
