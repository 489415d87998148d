"""Engine options shared by the CLI commands (vLLM's flag names)."""

from __future__ import annotations

import argparse

from octavo.engine_args import EngineArgs


def json_object(text: str) -> dict:
    """An argparse type: a JSON object."""
    import json

    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_readable_int(text: str) -> int:
    """An argparse type: an integer, or vLLM's short forms: ``32k`` (x 1000,
    decimals allowed: ``25.6k``) and ``32K`` (x 1024, whole numbers only)."""
    text = text.strip()
    suffix = text[-1:] if text[-1:].isalpha() else ""
    number = text[: len(text) - len(suffix)]
    try:
        if suffix in _DECIMAL:
            value = float(number) * _DECIMAL[suffix]
            if value != int(value):
                raise ValueError
            return int(value)
        if suffix in _BINARY:
            return int(number) * _BINARY[suffix]
        if not suffix:
            return int(number)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a whole number (digits, or a number with k/m/g for thousands or K/M/G for 1024s)"
    )


class RefuseRemoteCode(argparse.Action):
    """vLLM's --trust-remote-code: refused with the reason, not argparse's "unrecognized argument"."""

    refuses = (
        "not supported: Octavo never runs code from a checkpoint; it loads the "
        "architectures it implements itself (octavo env --model DIR says whether one loads)"
    )

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parser.error(f"--trust-remote-code is {self.refuses}")


class AcceptOnly(argparse.Action):
    """A vLLM flag whose other values Octavo does not have: those are refused with the reason."""

    def __init__(self, option_strings, dest, accepted=(), reason="", **kwargs) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.accepted, self.reason = tuple(accepted), reason

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if values not in self.accepted:
            parser.error(f"{option_string} {values}: {self.reason} ({', '.join(self.accepted)} are accepted)")
        setattr(namespace, self.dest, values)


def add_vllm_engine_flags(parser: argparse.ArgumentParser) -> None:
    """vLLM's engine flags whose meaning Octavo has too (and --trust-remote-code, refused with the reason)."""
    parser.add_argument(
        "--override-generation-config", type=json_object, default=None,
        help='sampling defaults over the generation config\'s, as JSON (e.g. \'{"temperature": 0.6}\')',
    )
    parser.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--tokenizer-mode", action=AcceptOnly, default="auto", accepted=("auto", "hf"),
        reason="Octavo reads Hugging Face tokenizers (tokenizer.json); mistral_common's and slow tokenizers are not supported",
        help="auto or hf (the Hugging Face tokenizer)",
    )
    parser.add_argument(
        "--config-format", action=AcceptOnly, default="auto", accepted=("auto", "hf"),
        reason="Octavo reads config.json; Mistral's params.json format is not supported",
        help="auto or hf (config.json)",
    )
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--trust-remote-code", action=RefuseRemoteCode, nargs=0,
        help="refused: Octavo never runs a checkpoint's code (its models are its own)",
    )


def add_engine_args(parser: argparse.ArgumentParser, model_positional: bool = False) -> None:
    model_help = (
        "a Hub id (org/name, or org/name:Q4_K_M for one GGUF file of the repo), a checkpoint directory or a "
        ".gguf file (default: the built-in demo model)"
    )
    if model_positional:
        parser.add_argument("model", nargs="?", default=None, help=model_help)
    else:
        parser.add_argument("--model", "-m", default=None, help=model_help)
    parser.add_argument("--tokenizer", default=None, help="a Hub id or directory (default: the model's)")
    parser.add_argument("--revision", default=None, help="the Hub branch, tag or commit to download (default: main)")
    parser.add_argument("--download-dir", default=None, help="the Hub cache to download into (default: HF_HUB_CACHE)")
    parser.add_argument("--gguf-file", default=None, help="the GGUF file to load from a Hub repo or directory")
    parser.add_argument(
        "--generation-config", default="auto",
        help="sampling defaults: auto (the model's generation_config.json), vllm (none), or a directory",
    )
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    parser.add_argument("--max-model-len", type=human_readable_int, default=None, help="e.g. 8192, 32k or 32K")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=human_readable_int, default=None)
    add_vllm_engine_flags(parser)
    parser.add_argument(
        "--scheduling-policy", choices=["fcfs", "priority"], default="fcfs",
        help="fcfs, or priority: requests' priority field orders the queue (lower first) and preempts",
    )
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--num-kv-blocks", type=int, default=None, help="fix the KV cache size in blocks")
    parser.add_argument(
        "--kv-cache-memory-bytes", type=human_readable_int, default=None,
        help="the KV cache's size in bytes per device (e.g. 8G), instead of --gpu-memory-utilization's share",
    )
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--load-format", default="auto", help="auto, safetensors, dummy, gguf")
    parser.add_argument("--quantization", "-q", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--platform", default=None, help="override platform selection (also OCTAVO_PLATFORM)")
    parser.add_argument("--enforce-eager", action="store_true", help="never capture graphs")
    parser.add_argument(
        "--max-prefill-graph-tokens", type=int, default=2048,
        help="capture steps of up to this many tokens in graphs too (0: decode steps only)",
    )
    parser.add_argument(
        "--async-scheduling", action=argparse.BooleanOptionalAction, default=False,
        help="schedule and prepare each step while the device runs the one before (one device)",
    )
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    parser.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    parser.add_argument(
        "--enable-expert-parallel", action="store_true",
        help="MoE models: whole experts per tensor-parallel rank instead of a slice of every expert",
    )
    parser.add_argument(
        "--distributed-executor-backend",
        default=None,
        help="uni, mp (default when tp*pp > 1), ray or external_launcher (under torchrun)",
    )
    parser.add_argument(
        "--data-parallel-size", "-dp", type=int, default=1, help="engine replicas, each in its own process"
    )
    parser.add_argument(
        "--engine-process", action=argparse.BooleanOptionalAction, default=False,
        help="run the engine in its own process, apart from the server's (or caller's) Python",
    )
    parser.add_argument("--chat-template", default=None, help="a Jinja chat template file")
    parser.add_argument(
        "--structured-outputs-compile-timeout", type=float, default=10.0,
        help="seconds a structured-output constraint may take to compile before the request is refused",
    )
    parser.add_argument(
        "--structured-outputs-max-grammar-bytes", type=int, default=64 << 20,
        help="largest compiled grammar (bytes) a structured-output constraint may become",
    )
    parser.add_argument("--enable-lora", action="store_true", help="serve LoRA adapters (PEFT directories) on the base model")
    parser.add_argument("--max-loras", type=int, default=1, help="with --enable-lora: adapters in one batch")
    parser.add_argument("--max-lora-rank", type=int, default=16, help="with --enable-lora: the largest adapter rank")
    parser.add_argument(
        "--max-cpu-loras", type=int, default=None, help="with --enable-lora: loaded adapters kept in host memory (default: --max-loras)"
    )
    parser.add_argument(
        "--hf-overrides", type=json_object, default=None,
        help='config.json values to replace (JSON), e.g. \'{"rope_scaling": {"rope_type": "yarn", "factor": 4.0, '
        '"original_max_position_embeddings": 32768}}\'',
    )
    parser.add_argument(
        "--speculative-config", type=json_object, default=None,
        help='speculative decoding (JSON), e.g. \'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}\'',
    )
    parser.add_argument(
        "--limit-mm-per-prompt", type=json_object, default=None,
        help='images a prompt may show, as JSON (e.g. \'{"image": 4}\'; default 8 for a model that takes images)',
    )
    parser.add_argument(
        "--allowed-local-media-path", default=None,
        help="a directory whose files requests may name as file:// images (default: file:// refused)",
    )
    parser.add_argument(
        "--long-prefill-token-threshold", type=human_readable_int, default=0,
        help="a prompt computes at most this many tokens a step, leaving room for others (0: no cap)",
    )
    parser.add_argument(
        "--logprobs-mode", default="raw_logprobs",
        choices=["raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"],
        help="what logprobs report: the model's (raw) or those of the distribution each token was drawn from "
        "(processed: after penalties, biases, temperature, top-k/top-p/min-p)",
    )
    parser.add_argument(
        "--task", default="auto", choices=["auto", "generate", "embed", "classify"],
        help="what the model serves (default: the checkpoint's own: embeddings for BertModel or a "
        "sentence-transformers checkpoint, classification for *ForSequenceClassification, else generation)",
    )


def engine_args_from(args: argparse.Namespace) -> EngineArgs:
    names = EngineArgs.field_names()
    return EngineArgs(**{k: v for k, v in vars(args).items() if k in names})


def print_startup_summary(engine) -> None:
    """One line on stderr: the model, the KV cache it got, the images a prompt may show, its sampling
    defaults, the start time."""
    import sys

    from octavo.entrypoints.engine_stats import engine_capacity
    from octavo.models.generation_defaults import describe, engine_sampling_defaults
    from octavo.runtime.startup import seconds_since_process_start

    info, capacity = engine.info, engine_capacity(engine)
    parts = [f"{info.architecture} ({info.dtype}, {info.platform})"]
    parts.append(f"KV cache: {capacity.num_kv_blocks * engine.limits.block_size} tokens")
    if getattr(engine, "image_prompts", None) is not None:
        parts.append(f"images: up to {engine.limits.max_images_per_prompt} a prompt")
    defaults = engine_sampling_defaults(engine)
    if defaults:
        parts.append(f"sampling defaults from the model: {describe(defaults)}")
    since_start = seconds_since_process_start()
    if since_start is not None:
        parts.append(f"ready {since_start:.1f}s after start")
    print("; ".join(parts), file=sys.stderr)
