"""Speculative decoding's options checked against the rest of the engine's
(``build_engine``'s helpers): what cannot work together is refused before
any worker starts, naming the option; and the KV lookahead a draft model
needs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from octavo.core.speculative_config import SpeculativeConfig
from octavo.errors import InvalidArgumentError
from octavo.models.config import ModelArchConfig, load_arch_config, read_json
from octavo.runtime.config import WorkerConfig

if TYPE_CHECKING:
    from octavo.engine_args import EngineArgs


def check_speculative_args(args: EngineArgs) -> None:
    """The options alone (``EngineArgs.validate``): both conflicts are
    explicit choices, so they are refused, not silently dropped."""
    speculative = SpeculativeConfig.from_dict(args.speculative_config)
    if speculative is None:
        return
    if args.async_scheduling:
        raise InvalidArgumentError(
            "speculative decoding runs with synchronous steps; drop async_scheduling", param="speculative_config"
        )
    if args.pipeline_parallel_size > 1 and speculative.uses_draft_model:
        raise InvalidArgumentError(
            "draft models and heads run with pipeline_parallel_size 1 (n-gram drafts run with pipeline parallelism)",
            param="speculative_config",
        )
    if args.logprobs_mode.startswith("processed"):
        raise InvalidArgumentError(
            f"speculative decoding reports raw logprobs; logprobs_mode {args.logprobs_mode!r} is not supported with it",
            param="speculative_config",
        )


def check_speculative_engine(
    args: EngineArgs, arch: ModelArchConfig, platform, worker_config: WorkerConfig
) -> SpeculativeConfig | None:
    """The options against the platform and the model (a draft model's
    vocabulary and parallel size); returns them parsed."""
    speculative = SpeculativeConfig.from_dict(args.speculative_config)
    if speculative is None:
        return None
    if not args.enforce_eager and platform.step_buckets(worker_config) is not None:
        raise InvalidArgumentError(
            f"speculative decoding needs steps of any shape; platform {platform.name!r} compiles fixed step shapes",
            param="speculative_config",
        )
    if speculative.uses_draft_model:  # a draft model, an EAGLE head or MTP layers
        if speculative.draft_tensor_parallel_size not in (None, args.tensor_parallel_size):
            raise InvalidArgumentError(
                f"draft_tensor_parallel_size must be the target's tensor_parallel_size ({args.tensor_parallel_size})",
                param="speculative_config",
            )
        draft = load_arch_config(Path(speculative.model))
        if speculative.method == "mtp":
            _check_mtp(draft, Path(speculative.model))
        if draft.vocab_size != arch.vocab_size:
            raise InvalidArgumentError(
                f"the draft model's vocabulary ({draft.vocab_size} tokens) is not the target's ({arch.vocab_size}): "
                "its tokens would mean something else", param="speculative_config",
            )
    return speculative


def _check_mtp(arch: ModelArchConfig, path: Path) -> None:
    from octavo.models.mtp import ARCHITECTURES

    if arch.architecture not in ARCHITECTURES:
        raise InvalidArgumentError(
            f"speculative method 'mtp' reads the MTP layer of {', '.join(ARCHITECTURES)} checkpoints, "
            f"not of {arch.architecture}", param="speculative_config",
        )
    from octavo.models.mtp import checkpoint_has_mtp_layer

    if int(arch.raw.get("num_nextn_predict_layers") or 0) < 1 or not checkpoint_has_mtp_layer(path, arch.num_hidden_layers):
        raise InvalidArgumentError(
            "speculative method 'mtp': the checkpoint has no multi-token-prediction layer (num_nextn_predict_layers, "
            f"tensors model.layers.{arch.num_hidden_layers}.*)",
            param="speculative_config",
        )


def with_checkpoint_method(speculative: dict) -> dict:
    """``speculative_config`` with the method a ``speculators``-format
    checkpoint names (its ``speculators_model_type``) when the config names
    none, as vLLM reads it; other dicts as they are."""
    if "method" in speculative or not isinstance(speculative.get("model"), str):
        return speculative
    config_path = Path(speculative["model"]) / "config.json"
    if not config_path.is_file():
        return speculative
    kind = read_json(config_path).get("speculators_model_type")
    return {**speculative, "method": kind} if isinstance(kind, str) else speculative


def lookahead_tokens(worker_config: WorkerConfig) -> int:
    """KV slots past each step's tokens: one for decode overlap; a draft
    model writes its guesses' KV there (``num_speculative_tokens``)."""
    if worker_config.overlap_decode:
        return 1
    return worker_config.num_speculative_tokens if worker_config.speculative_model else 0
