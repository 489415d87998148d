"""``octavo env``: platforms found, the one selected and why, plugins, versions.

Runs every installed platform's cheap probe (and nothing heavier) except for
the selected platform, whose ``versions()`` may name its devices and whose
layer ops are resolved as a model of ``--dtype`` would get them (which
implementation serves each op, from which plugin; plugins whose
implementations fail to resolve are reported broken).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform as host

ENV_VARIABLES = (
    "OCTAVO_PLATFORM", "OCTAVO_PLUGINS", "OCTAVO_DISABLE_PLUGIN_AUTOLOAD", "OCTAVO_ATTENTION_BACKEND",
    "OCTAVO_TILES_DECODE", "OCTAVO_TILES_SPLIT", "OCTAVO_TILES_PREFILL", "OCTAVO_SPLIT_MIN_SEQ_LEN", "OCTAVO_PREFILL_FRESH_KV",
    "OCTAVO_GEMV", "OCTAVO_GEMV_SILU", "OCTAVO_GEMV_MAX_TOKENS", "OCTAVO_QUANT_GEMV_MAX_TOKENS",
    "OCTAVO_LAYER_OPS", "OCTAVO_MOE_TILES", "OCTAVO_MOE_DECODE_MAX_TOKENS", "OCTAVO_MOE_DOWN_TILES",
    "OCTAVO_MOE_GEMV_MAX_TOKENS", "OCTAVO_MOE_ROUTED", "OCTAVO_POOLING_OVERLAP", "OCTAVO_PDL", "OCTAVO_FP8_SKINNY_MAX_TOKENS", "OCTAVO_SKINNY_8BIT_TILES",
    "OCTAVO_INT4_GEMV_TILES", "OCTAVO_INT4_GEMV_MAX_TOKENS", "OCTAVO_INT4_GEMV_ROWS", "OCTAVO_INT4_GEMV_ROWS_TILES",
    "OCTAVO_GGUF_Q4K_PAIRS", "OCTAVO_GGUF_Q4K_PAIRS_TILES", "OCTAVO_FP8_GEMV_ROWS", "OCTAVO_FP8_GEMV_ROWS_TILES",
    "OCTAVO_FP8_FAST_ACCUM", "OCTAVO_NORM_GEMV",
)


def add_parser(sub) -> None:
    parser = sub.add_parser("env", help="show platforms, plugins and versions, and why a platform is selected")
    parser.add_argument("--platform", default=None, help="explain selecting this platform")
    parser.add_argument("--model", "-m", default=None, help="also report this model's weight memory")
    parser.add_argument("--quantization", "-q", default=None, help="with --model: quantize as when serving")
    parser.add_argument(
        "--dtype", default="bfloat16", help="the model dtype for layer ops and --model (default bfloat16, if supported)"
    )
    parser.set_defaults(func=run)


def describe(requested: str | None = None, dtype: str = "bfloat16") -> str:
    from octavo.plugins import API_VERSION
    from octavo.plugins.manager import broken_plugins, get_plugin_manager
    from octavo.version import __version__

    lines = [f"octavo {__version__} (plugin API {API_VERSION})", f"python {host.python_version()} on {host.platform()}"]
    for package in ("torch", "transformers", "tokenizers", "triton", "pluggy", "safetensors"):
        lines.append(f"  {package}: {_version(package)}")
    overrides = [f"{name}={os.environ[name]}" for name in ENV_VARIABLES if os.environ.get(name)]
    lines.append("environment: " + (", ".join(overrides) if overrides else "no OCTAVO_* overrides"))
    lines.append("plugins: " + ", ".join(get_plugin_manager().plugin_names()))
    platform_lines = _describe_platforms(requested, dtype)  # resolving layer ops may find broken plugins
    for broken in broken_plugins():
        lines.append(f"  broken plugin {broken.name} (skipped): {broken.error}")
    lines.extend(platform_lines)
    return "\n".join(lines)


def _describe_platforms(requested: str | None, dtype: str = "bfloat16") -> list[str]:
    from octavo.errors import OctavoError
    from octavo.plugins.selection import installed_platform_entries, probe_candidates, select_platform

    lines = [
        "platforms (rule: --platform or OCTAVO_PLATFORM if set; else the highest priority among "
        "available platforms with priority >= 0; a tie at the top is an error):"
    ]
    try:
        selection = select_platform(requested)
    except OctavoError as exc:
        for candidate in probe_candidates(installed_platform_entries()):
            lines.append(_candidate_line(candidate, selected=False))
        lines.append(f"selected: none ({exc.message})")
        return lines
    for candidate in selection.candidates:
        lines.append(_candidate_line(candidate, candidate.name == selection.platform.name))
    lines.append(f"selected: {selection.platform.name} ({selection.reason})")
    lines.extend(_describe_selected(selection.platform))
    lines.extend(describe_layer_ops(selection.platform, dtype))
    return lines


def describe_layer_ops(platform, dtype_name: str) -> list[str]:
    """Which implementation serves each layer op on ``platform`` for a model of ``dtype_name``."""
    from octavo.errors import OctavoError
    from octavo.ops import OP_SPECS, resolve_layer_ops
    from octavo.runtime.config import dtype_from_name

    dtype = dtype_from_name(dtype_name)
    if dtype not in platform.supported_dtypes:
        dtype = platform.supported_dtypes[0]
    name = str(dtype).removeprefix("torch.")
    try:
        ops = resolve_layer_ops(platform, platform.device(0), dtype)
    except OctavoError as exc:
        return [f"  layer ops ({name}): cannot be resolved: {exc.message}"]
    lines = [f"  layer ops ({name}; OCTAVO_LAYER_OPS=[platform:]op=impl overrides):"]
    for op in OP_SPECS:
        choice = ops.choice(op)
        skipped = f" (not serving here: {'; '.join(choice.skipped)})" if choice.skipped else ""
        lines.append(f"    {choice.describe()}{skipped}")
    if platform.device_type == "cuda" and importlib.util.find_spec("triton") is not None:
        from octavo.kernels.pdl import pdl_status

        lines.append(f"  programmatic dependent launch (decode kernels): {pdl_status(platform.device(0))}")
    return lines


def _candidate_line(candidate, selected: bool) -> str:
    mark = "*" if selected else " "
    state = "available" if candidate.available else "unavailable"
    plugin = candidate.plugin + (f", replaces {', '.join(candidate.replaced)}'s" if candidate.replaced else "")
    return f" {mark} {candidate.name:<8} priority {candidate.priority:>4}  {state:<11} [{plugin}] {candidate.detail}"


def _describe_selected(platform) -> list[str]:
    from octavo.platforms.attention_selection import OVERRIDE_ENV, attention_override, installed_attention_backends

    backends = installed_attention_backends()
    preference = ", ".join(
        f"{name} ({'installed' if name in backends else 'not installed'})" for name in platform.attention_backends
    )
    quantization = platform.supported_quantization
    lines = [
        f"  device type: {platform.device_type}, distributed backend: {platform.dist_backend}",
        "  dtypes: " + ", ".join(str(d).removeprefix("torch.") for d in platform.supported_dtypes),
        "  quantization: " + ("any installed method" if quantization is None else ", ".join(quantization) or "none"),
        f"  graphs: {'yes' if platform.supports_graphs else 'no'}",
        f"  attention backends, preferred first: {preference}",
    ]
    if "torch_paged" not in platform.attention_backends:
        lines[-1] += "; then torch_paged (the reference) as a fallback"
    if attention_override(platform.name):
        lines.append(f"  attention backend forced by {OVERRIDE_ENV}: {attention_override(platform.name)}")
    lines.extend(describe_compiled_steps(platform))
    try:
        for key, value in platform.versions().items():
            lines.append(f"  {key}: {value}")
    except Exception as exc:  # a vendor package failing here must not hide the rest
        lines.append(f"  versions: unavailable ({type(exc).__name__}: {exc})")
    return lines


def describe_compiled_steps(platform) -> list[str]:
    """Whether ``platform`` compiles steps (runner hooks, plugin API 1.1): its
    step shapes for the default limits and its compilation count so far."""
    from octavo.core.scheduler import SchedulerConfig
    from octavo.runtime.config import WorkerConfig

    try:
        limits = SchedulerConfig()
        config = WorkerConfig(
            model_path="", load_format="dummy", dtype="float32", kv_cache_dtype="auto", block_size=16,
            max_model_len=limits.max_model_len, max_num_batched_tokens=platform.default_max_num_batched_tokens(),
            max_num_seqs=limits.max_num_seqs, platform=platform.name,
        )
        buckets = platform.step_buckets(config)
        compiled = platform.compilations()
    except Exception as exc:  # a vendor package failing here must not hide the rest
        return [f"  compiled steps: unavailable ({type(exc).__name__}: {exc})"]
    if buckets is None and compiled is None:
        return ["  compiled steps: no (steps run eagerly at their own shapes)"]
    limits_text = (
        f"max_num_seqs {config.max_num_seqs}, max_model_len {config.max_model_len}, "
        f"{config.max_num_batched_tokens} tokens a step"
    )
    shapes = "no static shapes" if buckets is None else f"{buckets.describe()} ({limits_text}), all compiled at warm-up"
    counted = "not counted" if compiled is None else (
        f"{compiled} in this process so far; per step on /metrics "
        "(octavo:compilations, octavo:compilations_after_warmup), a warning for each after warm-up"
    )
    return [f"  compiled steps: {shapes}", f"  compilations: {counted}"]


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def run(args: argparse.Namespace) -> int:
    print(describe(args.platform, args.dtype))
    if args.model is not None:
        from octavo.quantization.memory import measure_weight_memory

        memory = measure_weight_memory(args.model, args.quantization, args.dtype)
        print(f"model {args.model}: {memory.describe(args.quantization)}")
    return 0
