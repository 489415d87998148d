"""A decoder checkpoint's shape, read from its ``config.json``.

Octavo reads the JSON itself (no ``AutoConfig``, no remote code), accepting
both the older ``rope_scaling`` + ``rope_theta`` keys and the newer
``rope_parameters`` dict of transformers 5 (per layer type for Gemma 3:
``full_attention`` and ``sliding_attention``).

Options the layers cannot honour (an unknown RoPE type, an activation the
MLPs lack) are refused here, naming the option, so that nothing is silently
approximated. ``hf_overrides`` (vLLM's option: a longer context through
``rope_scaling``, say) are applied to the JSON before it is read, and
checked the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from octavo.errors import ModelLoadError, UnsupportedModelError
from octavo.models.moe_config import MoEConfig, parse_moe_config

# What ``models.layers`` implement; anything else is refused at load.
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")
SUPPORTED_ACTIVATIONS = ("silu", "swish", "gelu", "gelu_pytorch_tanh")
# Sliding-window layers when ``layer_types`` is absent: every other layer
# (Gemma 2), five of every six (Gemma 3) or three of every four (OLMo 3, Cohere2).
_SLIDING_PATTERNS = {"gemma2": 2, "gemma3_text": 6, "gemma3": 6, "olmo3": 4, "cohere2": 4}
# ``partial_rotary_factor`` where config.json leaves it out (HF's defaults).
_PARTIAL_ROTARY_DEFAULTS = {"glm": 0.5, "glm4": 0.5}
# Model types whose HF config ties the embeddings when ``tie_word_embeddings`` is absent.
_TIED_BY_DEFAULT = ("ernie4_5", "smollm3", "starcoder2", "cohere", "cohere2")
# Quantized formats a family dequantizes to the model dtype while loading
# (gpt-oss's MXFP4 experts): no quantization method runs for them.
_DEQUANTIZED_ON_LOAD = {"gpt_oss": ("mxfp4",)}


def _quantization_config(raw: dict[str, Any]) -> dict[str, Any] | None:
    """``quantization_config``, unless the family dequantizes it on load
    (still in ``raw`` for the model to read)."""
    quant = raw.get("quantization_config")
    if isinstance(quant, dict) and quant.get("quant_method") in _DEQUANTIZED_ON_LOAD.get(raw.get("model_type"), ()):
        return None
    return quant


@dataclass
class ModelArchConfig:
    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_parameters: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    hidden_act: str
    # Per layer: the sliding-window size, or None for full attention.
    sliding_windows: list[int | None]
    torch_dtype: str | None
    quantization_config: dict[str, Any] | None
    raw: dict[str, Any] = field(repr=False, default_factory=dict)
    # Mixture-of-experts settings; None for a dense model.
    moe: MoEConfig | None = None
    # RoPE of the sliding-window layers where it differs from the global one
    # (Gemma 3's local base); None: the same as every other layer.
    local_rope_theta: float | None = None
    local_rope_parameters: dict[str, Any] | None = None
    # Layers that apply no rotary embedding at all (NoPE: SmolLM3).
    nope_layers: frozenset[int] = frozenset()
    # The fraction of each q/k head that RoPE rotates (Phi-4-mini 0.75, GLM 0.5).
    partial_rotary_factor: float = 1.0

    @property
    def bos_token_id(self) -> int | None:
        return self.raw.get("bos_token_id")

    @property
    def rotary_dim(self) -> int:
        """How many leading dims of each q/k head RoPE rotates (HF's ``int(head_dim * factor)``)."""
        return int(self.head_dim * self.partial_rotary_factor)


def _rope(raw: dict[str, Any], layer_type: str = "full_attention") -> tuple[float, dict[str, Any] | None]:
    params = raw.get("rope_parameters")
    scaling = raw.get("rope_scaling")
    if isinstance(scaling, dict) and scaling and isinstance(params, dict) and not isinstance(params.get(layer_type), dict):
        # Both (an ``hf_overrides`` of a transformers-5 config): the legacy key wins, as in transformers.
        theta = raw.get("rope_theta", params.get("rope_theta", 10000.0))
        return float(theta), dict(scaling)
    if isinstance(params, dict) and params:
        if isinstance(params.get(layer_type), dict):
            params = params[layer_type]
        theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
        return float(theta), dict(params)
    theta = float(raw.get("rope_theta", 10000.0))
    scaling = raw.get("rope_scaling")
    return theta, dict(scaling) if scaling else None


def _local_rope(raw: dict[str, Any]) -> tuple[float | None, dict[str, Any] | None]:
    """Gemma 3: the sliding layers' own RoPE (``rope_local_base_freq`` in older configs)."""
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and isinstance(params.get("sliding_attention"), dict):
        return _rope(raw, "sliding_attention")
    if "rope_local_base_freq" in raw:
        return float(raw["rope_local_base_freq"]), None
    if raw.get("model_type") == "olmo3" and raw.get("rope_scaling"):
        # OLMo 3's older configs: HF applies ``rope_scaling`` to the full-attention layers only.
        return float(raw.get("rope_theta", 10000.0)), None
    return None, None


def _cohere2_nope_layers(raw: dict[str, Any], num_layers: int) -> frozenset[int]:
    """Command-R7B rotates q and k in its sliding-window layers only: its
    global layers (``layer_types``, else every ``sliding_window_pattern``-th)
    have no RoPE, and without a window HF rotates in none of them."""
    if not raw.get("sliding_window"):
        return frozenset(range(num_layers))
    windows = _sliding_windows(raw, num_layers)
    return frozenset(i for i in range(num_layers) if windows[i] is None)


def _nope_layers(raw: dict[str, Any], num_layers: int) -> frozenset[int]:
    """The layers without RoPE. HF's ``no_rope_layers`` flags each layer
    with 1 where it *does* apply RoPE; SmolLM3's default leaves it out of
    every ``no_rope_layer_interval``-th layer (4th, 8th, ...); Cohere2's and
    EXAONE 4.0's (with a sliding window) are their global layers."""
    if raw.get("model_type") == "cohere2":
        return _cohere2_nope_layers(raw, num_layers)
    if raw.get("model_type") == "exaone4":  # hybrid attention: RoPE in the sliding layers only
        types = raw.get("layer_types") or []
        if raw.get("sliding_window") is None or len(types) < num_layers:
            return frozenset()
        return frozenset(i for i in range(num_layers) if types[i] != "sliding_attention")
    flags = raw.get("no_rope_layers")
    if flags is None:
        if raw.get("model_type") != "smollm3":
            return frozenset()
        interval = raw.get("no_rope_layer_interval") or 4
        if not isinstance(interval, int) or interval < 1:
            raise ModelLoadError(f"config.json: no_rope_layer_interval must be a positive integer, got {interval!r}")
        return frozenset(i for i in range(num_layers) if (i + 1) % interval == 0)
    if len(flags) < num_layers:
        raise ModelLoadError(f"config.json: no_rope_layers has {len(flags)} entries for {num_layers} layers")
    return frozenset(i for i in range(num_layers) if not flags[i])


def _sliding_windows(raw: dict[str, Any], num_layers: int) -> list[int | None]:
    window = raw.get("sliding_window")
    smollm3 = raw.get("model_type") == "smollm3"
    # SmolLM3 slides only when asked (HF's default is off), in its NoPE layers
    # unless ``layer_types`` says otherwise.
    if raw.get("use_sliding_window") is False or not window or (smollm3 and not raw.get("use_sliding_window")):
        return [None] * num_layers
    layer_types = raw.get("layer_types")
    if layer_types:
        return [window if kind == "sliding_attention" else None for kind in layer_types]
    if smollm3:
        nope = _nope_layers(raw, num_layers)
        return [window if i in nope else None for i in range(num_layers)]
    pattern = raw.get("sliding_window_pattern") or _SLIDING_PATTERNS.get(raw.get("model_type", ""))
    if pattern:
        return [window if (i + 1) % pattern else None for i in range(num_layers)]
    if "max_window_layers" in raw:  # Qwen2 convention: layers past it slide
        return [window if i >= raw["max_window_layers"] else None for i in range(num_layers)]
    return [window] * num_layers


def _complete_longrope(params: dict[str, Any], raw: dict[str, Any]) -> None:
    """LongRoPE reads two config values from outside its dict (as Hugging Face does)."""
    original = params.get("original_max_position_embeddings") or raw.get("original_max_position_embeddings")
    if not original:
        raise ModelLoadError("config.json: longrope scaling needs original_max_position_embeddings")
    params["original_max_position_embeddings"] = int(original)
    if params.get("factor") is None:
        params["factor"] = int(raw.get("max_position_embeddings", original)) / int(original)


def _partial_rotary_factor(raw: dict[str, Any], rope_parameters: dict[str, Any] | None) -> float:
    """``partial_rotary_factor`` from ``rope_parameters`` (transformers 5) or the
    top level; GLM's configs default to 0.5 when they leave it out, as HF's do."""
    factor = (rope_parameters or {}).get("partial_rotary_factor")
    if factor is None:
        factor = raw.get("partial_rotary_factor")
    if factor is None:
        factor = _PARTIAL_ROTARY_DEFAULTS.get(raw.get("model_type", ""), 1.0)
    return float(factor)


def _check_supported(config: "ModelArchConfig") -> None:
    """Refuse options the layers do not implement, naming the option."""
    raw = config.raw
    partial, rotary_dim = config.partial_rotary_factor, config.rotary_dim
    if partial != 1 and (not 0 < partial < 1 or rotary_dim < 2 or rotary_dim % 2):
        raise UnsupportedModelError(
            f"config.json: partial_rotary_factor {partial} with head_dim {config.head_dim} rotates {rotary_dim} dims "
            "(a factor in (0, 1] giving an even, nonzero number of dims is supported)"
        )
    for what, params in (("", config.rope_parameters), (" of the sliding-window layers", config.local_rope_parameters)):
        rope_type = (params or {}).get("rope_type") or (params or {}).get("type") or "default"
        if rope_type == "mrope":  # Qwen2-VL's M-RoPE: with text alone every section has the same position
            params["rope_type"] = rope_type = "default"
        if rope_type in ("su", "longrope"):  # "su": Phi-3's first name for LongRoPE
            params["rope_type"] = rope_type = "longrope"
            _complete_longrope(params, raw)
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedModelError(
                f"config.json: rope_type {rope_type!r}{what} is not supported "
                f"({', '.join(SUPPORTED_ROPE_TYPES)} are)"
            )
    if config.hidden_act not in SUPPORTED_ACTIVATIONS:
        raise UnsupportedModelError(
            f"config.json: hidden_act {config.hidden_act!r} is not supported ({', '.join(SUPPORTED_ACTIVATIONS)} are)"
        )


def _speculators_config(raw: dict[str, Any]) -> dict[str, Any]:
    """A ``speculators``-library checkpoint's config as its head's own: the
    layer's config (``transformer_layer_config``) with the EAGLE-3 fields
    (``models/eagle3.py``; that library's heads norm before the residual)."""
    kind = raw.get("speculators_model_type")
    if kind != "eagle3":
        raise UnsupportedModelError(f"config.json: speculators_model_type {kind!r} is not supported (eagle3 is)")
    layer = raw.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ModelLoadError("config.json: a speculators config needs the object 'transformer_layer_config'")
    flat = {**layer, "architectures": ["Eagle3LlamaForCausalLM"]}
    for key in ("draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids"):
        if raw.get(key) is not None:
            flat[key] = raw[key]
    flat["norm_before_residual"] = raw.get("norm_before_residual", True)
    return flat


def _text_config(raw: dict[str, Any]) -> dict[str, Any]:
    """A vision-language config's language model (``models/text_only.py``): its
    ``text_config``, with the top level's embedding tie (which transformers
    follows for the whole model), and its quantization and dtype where the
    text config leaves them out. The rest of the top level (the vision tower's
    config, the projector's, the image token) stays readable as
    ``raw["multimodal_config"]`` for the models that take images."""
    text = {**raw["text_config"], "architectures": raw.get("architectures")}
    text["multimodal_config"] = {key: value for key, value in raw.items() if key != "text_config"}
    if raw.get("tie_word_embeddings") is not None:
        text["tie_word_embeddings"] = raw["tie_word_embeddings"]
    for key in ("quantization_config", "torch_dtype", "dtype"):
        if text.get(key) is None and raw.get(key) is not None:
            text[key] = raw[key]
    return text


def parse_arch_config(raw: dict[str, Any]) -> ModelArchConfig:
    if "speculators_model_type" in raw:
        raw = _speculators_config(raw)
    if "text_config" in raw and "hidden_size" not in raw:
        raw = _text_config(raw)
    architectures = raw.get("architectures") or []
    if not architectures:
        raise ModelLoadError("config.json has no 'architectures' entry")
    try:
        num_heads = int(raw["num_attention_heads"])
        hidden_size = int(raw["hidden_size"])
        num_layers = int(raw["num_hidden_layers"])
        theta, rope_parameters = _rope(raw)
        local_theta, local_parameters = _local_rope(raw)
        config = ModelArchConfig(
            architecture=architectures[0],
            model_type=raw.get("model_type", ""),
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden_size,
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or num_heads),
            head_dim=int(raw.get("head_dim") or hidden_size // num_heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_parameters=rope_parameters,
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", raw.get("model_type") in _TIED_BY_DEFAULT)),
            # ERNIE 4.5 names both ``use_bias`` (every projection).
            attention_bias=bool(raw.get("attention_bias", raw.get("use_bias", False))),
            mlp_bias=bool(raw.get("mlp_bias", raw.get("use_bias", False))),
            # Gemma names its activation hidden_activation (hidden_act is legacy).
            hidden_act=raw.get("hidden_activation") or raw.get("hidden_act") or "silu",
            sliding_windows=_sliding_windows(raw, num_layers),
            torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
            quantization_config=_quantization_config(raw),
            raw=raw,
            moe=parse_moe_config(raw, num_layers),
            local_rope_theta=local_theta,
            local_rope_parameters=local_parameters,
            nope_layers=_nope_layers(raw, num_layers),
            partial_rotary_factor=_partial_rotary_factor(raw, rope_parameters),
        )
    except KeyError as exc:
        raise ModelLoadError(f"config.json is missing the field {exc.args[0]!r}") from exc
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"config.json has a field of the wrong type: {exc}") from exc
    _check_supported(config)
    return config


def read_json(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError as exc:
        raise ModelLoadError(f"{path} is missing") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} does not hold a JSON object")
    return data


def load_arch_config(model_dir: Path, overrides: dict[str, Any] | None = None) -> ModelArchConfig:
    """The checkpoint's shape; ``overrides`` (vLLM's ``hf_overrides``) replace
    config.json's values first (``apply_overrides``)."""
    raw = read_json(model_dir / "config.json")
    if not overrides:
        return parse_arch_config(raw)
    config = parse_arch_config(apply_overrides(raw, overrides))
    theta = overrides.get("rope_theta")
    if isinstance(theta, (int, float)) and config.rope_theta != float(theta):
        # A transformers-5 config keeps its theta in rope_parameters, which transformers reads instead.
        raise UnsupportedModelError(
            "hf_overrides: 'rope_theta' is not read from this config.json (its rope_parameters hold the "
            "theta); override rope_parameters instead"
        )
    return config


def apply_overrides(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with ``overrides``' keys replaced, values whole (a new
    ``rope_scaling`` replaces the old one), except a nested model config
    (``text_config``): there only the keys the override names change, the
    same way (vLLM's rule)."""
    merged = dict(raw)
    for key, value in overrides.items():
        if key.endswith("_config") and isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = apply_overrides(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_generation_config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "generation_config.json"
    return read_json(path) if path.exists() else {}
