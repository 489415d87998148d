"""Engine options (vLLM's names) and the one place that assembles an engine.

``build_engine`` is the only code that sees the whole configuration: it
resolves the model (downloading a Hub id once, before any replica starts)
and its task (generate, or a pooling task: embed, classify), selects the
platform, builds the executor (which loads the model) while the tokenizer
loads on a thread beside it, sizes the KV cache, and hands each component
only what it needs (a worker's options: ``worker_options.py``). Each phase
logs its time (``runtime/startup.py``). With ``data_parallel_size > 1`` it
returns a ``DataParallelEngine`` instead: that many replicas of the engine,
each in its own process, behind the same interface.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from octavo.core.engine import EngineLimits, LLMEngine, ModelInfo
from octavo.core.kv_cache_manager import KVCacheManager
from octavo.core.pooling_params import PoolerConfig
from octavo.core.request_queue import check_policy
from octavo.core.scheduler import Scheduler, SchedulerConfig
from octavo.core.speculative_config import is_mtp_method
from octavo.core.structured_output.compiler import StructuredOutputLimits
from octavo.core.tokenizer import eos_token_ids
from octavo.engine_tokenizer import load_model_tokenizer, load_tokenizer_in_background
from octavo.errors import InvalidArgumentError, ModelLoadError
from octavo.models.config import ModelArchConfig, load_arch_config, load_generation_config
from octavo.models.generation_defaults import describe, sampling_defaults
from octavo.models.hub import HubOptions, resolve_model, resolve_tokenizer
from octavo.multimodal.limits import images_per_prompt, takes_images
from octavo.multimodal.processor import image_prompts_for
from octavo.ops.resolution import check_layer_op_overrides
from octavo.plugins.selection import select_platform
from octavo.quantization.registry import checkpoint_method_name
from octavo.runtime.config import WorkerConfig
from octavo.runtime.startup import log_ready, timed_phase
from octavo.speculative_options import (
    check_speculative_args, check_speculative_engine, lookahead_tokens, with_checkpoint_method,
)
from octavo.worker_options import worker_config_for

logger = logging.getLogger(__name__)


@dataclass
class EngineArgs:
    model: str | None = None
    tokenizer: str | None = None
    # Hub downloads (octavo/models/hub.py): the branch, tag or commit; the
    # cache to download into; the GGUF file to take from a repo.
    revision: str | None = None
    download_dir: str | None = None
    gguf_file: str | None = None
    # Sampling defaults: "auto" (the model's generation_config.json), "vllm"
    # (none), or a directory holding a generation_config.json.
    generation_config: str = "auto"
    # vLLM's --override-generation-config: sampling defaults over the config's (JSON object).
    override_generation_config: dict | None = None
    dtype: str = "auto"
    max_model_len: int | None = None
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    # "fcfs" or "priority" (requests' priority field, lower first; core/request_queue.py).
    scheduling_policy: str = "fcfs"
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.9
    num_kv_blocks: int | None = None
    kv_cache_dtype: str = "auto"
    load_format: str = "auto"
    quantization: str | None = None
    seed: int = 0
    platform: str | None = None
    enforce_eager: bool = False
    # Steps of up to this many tokens replay CUDA graphs captured by token
    # count (short prefills); 0: only decode steps are captured.
    max_prefill_graph_tokens: int = 2048
    # Launch each greedy decode step before the previous one's tokens reach
    # the host; None: on where the platform captures graphs (one device).
    overlap_decode: bool | None = None
    # Schedule and prepare each step while the device runs the one before,
    # for every kind of step and sampling parameter (one device, uni executor);
    # replaces overlap_decode.
    async_scheduling: bool = False
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    # MoE layers: whole experts per tensor-parallel rank (tokens' results
    # summed across ranks) instead of a slice of every expert.
    enable_expert_parallel: bool = False
    distributed_executor_backend: str | None = None
    data_parallel_size: int = 1
    # Run the engine in a process of its own (a one-replica DataParallelEngine),
    # so that its steps and the caller's Python (an HTTP server's event loop,
    # tokenization, streaming) do not share one interpreter lock.
    engine_process: bool = False
    # Which replica this engine is (set by DataParallelEngine for its replicas):
    # its workers use the devices from data_parallel_rank * tp * pp on.
    data_parallel_rank: int = 0
    chat_template: str | None = None
    max_logprobs: int = 20
    # What logprobs report (vLLM's): raw_logprobs, raw_logits, processed_logprobs, processed_logits.
    logprobs_mode: str = "raw_logprobs"
    # A prompt computes at most this many tokens a step (vLLM's; 0: no cap; needs chunked prefill).
    long_prefill_token_threshold: int = 0
    # Images a prompt may show, vLLM's {"image": N} (None: 8 for a model that takes images).
    limit_mm_per_prompt: dict[str, int] | None = None
    # file:// images are read from under this directory only (None: refused).
    allowed_local_media_path: str | None = None
    # Limits on structured-output constraints (compile time, compiled size).
    structured_outputs_compile_timeout: float = 10.0
    structured_outputs_max_grammar_bytes: int = 64 << 20
    skip_tokenizer_init: bool = False
    # auto (the checkpoint's own), generate, embed or classify.
    task: str = "auto"
    # LoRA adapters (vLLM's flags): on with enable_lora; max_loras adapters in
    # one batch, ranks up to max_lora_rank; max_cpu_loras loaded adapters
    # kept in host memory per worker (None: max_loras).
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    # vLLM's speculative_config: {"method": "ngram", "num_speculative_tokens": k,
    # "prompt_lookup_max": n, "prompt_lookup_min": m} (core/speculative_config.py).
    speculative_config: dict | None = None
    # vLLM's hf_overrides: config.json values replaced before the model is
    # built, e.g. {"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
    # "original_max_position_embeddings": 32768}, "max_position_embeddings": 131072}.
    hf_overrides: dict | None = None

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}

    def validate(self) -> None:
        positive = ("block_size", "max_num_seqs", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
        for name in positive:
            if getattr(self, name) < 1:
                raise InvalidArgumentError(f"{name} must be at least 1, got {getattr(self, name)}", param=name)
        if self.max_prefill_graph_tokens < 0:
            raise InvalidArgumentError(
                f"max_prefill_graph_tokens must be 0 or more, got {self.max_prefill_graph_tokens}",
                param="max_prefill_graph_tokens",
            )
        for name in ("max_model_len", "max_num_batched_tokens", "num_kv_blocks", "kv_cache_memory_bytes"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InvalidArgumentError(f"{name} must be positive, got {value}", param=name)
        check_policy(self.scheduling_policy)
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise InvalidArgumentError("gpu_memory_utilization must be in (0, 1]", param="gpu_memory_utilization")
        if not self.structured_outputs_compile_timeout > 0 or self.structured_outputs_max_grammar_bytes < 1:
            raise InvalidArgumentError(
                "the structured-output compile timeout and grammar size limit must be positive",
                param="structured_outputs_compile_timeout",
            )

        from octavo.runtime.sampled_batch import LOGPROBS_MODES

        if self.logprobs_mode not in LOGPROBS_MODES:
            raise InvalidArgumentError(
                f"logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}, got {self.logprobs_mode!r}", param="logprobs_mode"
            )
        if self.long_prefill_token_threshold < 0 or (self.long_prefill_token_threshold and not self.enable_chunked_prefill):
            raise InvalidArgumentError(
                "long_prefill_token_threshold must be 0 (off) or positive, and needs chunked prefill",
                param="long_prefill_token_threshold",
            )
        self._validate_lora()
        check_speculative_args(self)
        if self.hf_overrides is not None and not isinstance(self.hf_overrides, dict):
            raise InvalidArgumentError("hf_overrides must be a JSON object of config.json keys", param="hf_overrides")
        from octavo.models.pooling_config import TASKS

        if self.task not in TASKS:
            raise InvalidArgumentError(f"task must be one of {', '.join(TASKS)}, got {self.task!r}", param="task")
        if self.load_format not in ("auto", "safetensors", "dummy", "gguf"):
            raise InvalidArgumentError(
                f"load_format must be auto, safetensors, dummy or gguf, got {self.load_format!r}", param="load_format"
            )


    def _validate_lora(self) -> None:
        if not self.enable_lora:
            return
        for name in ("max_loras", "max_lora_rank"):
            if getattr(self, name) < 1:
                raise InvalidArgumentError(f"{name} must be at least 1, got {getattr(self, name)}", param=name)
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise InvalidArgumentError(
                f"max_cpu_loras ({self.max_cpu_loras}) must be at least max_loras ({self.max_loras})", param="max_cpu_loras"
            )
        if self.pipeline_parallel_size > 1:
            raise InvalidArgumentError(
                "LoRA adapters run with pipeline_parallel_size 1 (tensor and data parallelism are supported)",
                param="enable_lora",
            )


def _hub_options(args: EngineArgs) -> HubOptions:
    return HubOptions(revision=args.revision, download_dir=args.download_dir, gguf_file=args.gguf_file)


def resolve_model_files(args: EngineArgs) -> EngineArgs:
    """``args`` with the model and tokenizer as local paths (Hub ids downloaded)."""
    if args.model is None:
        return args
    with timed_phase("resolve model"):
        model = resolve_model(args.model, _hub_options(args), weights=args.load_format != "dummy")
        tokenizer = args.tokenizer
        if tokenizer is not None:
            tokenizer = str(resolve_tokenizer(tokenizer, dataclasses.replace(_hub_options(args), gguf_file=None)))
        speculative = args.speculative_config
        if isinstance(speculative, dict) and speculative.get("model") is None and is_mtp_method(speculative.get("method")):
            speculative = {**speculative, "model": str(model)}  # MTP layers live in the target's checkpoint
        elif isinstance(speculative, dict) and isinstance(speculative.get("model"), str):
            # The draft checkpoint too, once, before any worker or replica starts.
            draft_options = dataclasses.replace(_hub_options(args), gguf_file=None, revision=None)
            draft = resolve_model(speculative["model"], draft_options, weights=args.load_format != "dummy")
            speculative = with_checkpoint_method({**speculative, "model": str(draft)})
    return dataclasses.replace(args, model=str(model), tokenizer=tokenizer, gguf_file=None, speculative_config=speculative)


def resolve_pooler(args: EngineArgs, arch: ModelArchConfig, model_path: Path, load_format: str) -> PoolerConfig | None:
    """The model's pooling setup for its task, or None when it generates."""
    from octavo.models.pooling_config import build_pooler_config, resolve_task
    from octavo.models.registry import resolve_model_class

    model_dir = None if load_format == "gguf" else model_path
    task = resolve_task(args.task, resolve_model_class(arch.architecture), model_dir)
    if task == "generate":
        return None
    if model_dir is None:
        raise InvalidArgumentError(f"--task {task} needs a safetensors checkpoint, not a GGUF file", param="task")
    if args.tensor_parallel_size * args.pipeline_parallel_size > 1:
        raise InvalidArgumentError(
            f"a model serving {task!r} runs on one device per replica for now (tensor_parallel_size and "
            "pipeline_parallel_size must be 1; use data_parallel_size for more devices)",
            param="tensor_parallel_size",
        )
    if args.async_scheduling:
        # A pooling step finishes its requests: there is no next step to overlap.
        raise InvalidArgumentError(f"async_scheduling is for generation, not a model serving {task!r}", param="async_scheduling")
    if args.speculative_config is not None:
        raise InvalidArgumentError(
            f"speculative decoding is for generation, not a model serving {task!r}", param="speculative_config"
        )
    return build_pooler_config(task, arch, model_dir, resolve_model_class(arch.architecture, task))


def _model_dir(args: EngineArgs) -> tuple[Path, str]:
    if args.model is None:
        from octavo.default_model import default_model_path

        return default_model_path(), "safetensors"
    path = resolve_model(args.model, _hub_options(args), weights=args.load_format != "dummy")
    load_format = args.load_format
    if load_format == "auto":
        load_format = "gguf" if path.is_file() and path.suffix == ".gguf" else "safetensors"
    if load_format != "gguf" and not path.is_dir():
        raise ModelLoadError(f"{path} is not a checkpoint directory")
    return path, load_format


def build_engine(args: EngineArgs):
    """An ``LLMEngine``, or a ``DataParallelEngine`` for ``data_parallel_size > 1``
    or ``engine_process`` (one replica, in its own process)."""
    args.validate()
    args = resolve_model_files(args)
    if args.data_parallel_size > 1 or args.engine_process:
        from octavo.distributed.data_parallel import DataParallelEngine

        engine = DataParallelEngine(args)
    else:
        engine = build_single_engine(args)
    engine.image_prompts = image_prompts_for(args, engine.limits.max_images_per_prompt, engine.tokenizer)
    if engine.image_prompts is not None:
        logger.info("images: up to %d a prompt (--limit-mm-per-prompt)", engine.limits.max_images_per_prompt)
    if engine.info.sampling_defaults:
        logger.info(
            "sampling defaults from the model's generation config: %s (requests that set a value keep theirs; "
            "--generation-config vllm ignores them)", describe(engine.info.sampling_defaults),
        )
    log_ready("engine")
    return engine


def build_single_engine(args: EngineArgs, engine_cls: type[LLMEngine] = LLMEngine) -> LLMEngine:
    """One engine (one replica), whatever ``data_parallel_size`` says; an
    engine process asks for an ``EngineCore`` (its front processes outputs)."""
    args.validate()
    model_path, load_format = _model_dir(args)
    if load_format == "gguf":
        from octavo.models.gguf_loader import gguf_arch_config

        if args.hf_overrides:
            raise InvalidArgumentError("hf_overrides change a config.json; a GGUF file has none", param="hf_overrides")
        arch, generation_config = gguf_arch_config(model_path), {}
    else:
        arch, generation_config = load_arch_config(model_path, args.hf_overrides), load_generation_config(model_path)
    config_dir = model_path if load_format != "gguf" else None
    defaults = sampling_defaults(args.generation_config, config_dir, args.override_generation_config)
    selection = select_platform(args.platform)
    platform = selection.platform
    logger.info("platform %s: %s", platform.name, selection.reason)
    _check_parallel_layout(args, arch)
    pooler = resolve_pooler(args, arch, model_path, load_format)
    uses_kv_cache = pooler is None or not pooler.is_encoder
    worker_config = worker_config_for(args, platform, arch, model_path, load_format, pooler)
    platform.check_config(worker_config)
    speculative = check_speculative_engine(args, arch, platform, worker_config)
    check_layer_op_overrides(platform.name)
    executor, num_blocks, tokenizer = _start_workers(args, worker_config, model_path, load_format, uses_kv_cache)
    scheduler = Scheduler(
        SchedulerConfig(
            max_num_batched_tokens=worker_config.max_num_batched_tokens,
            max_num_seqs=args.max_num_seqs,
            max_model_len=worker_config.max_model_len,
            enable_chunked_prefill=args.enable_chunked_prefill,
            num_lookahead_tokens=lookahead_tokens(worker_config),
            uses_kv_cache=uses_kv_cache,
            policy=args.scheduling_policy,
            max_loras=worker_config.max_loras,
            speculative=speculative,
            long_prefill_token_threshold=args.long_prefill_token_threshold,
        ),
        KVCacheManager(num_blocks, args.block_size, args.enable_prefix_caching),
    )
    limits = EngineLimits(
        max_model_len=worker_config.max_model_len,
        vocab_size=arch.vocab_size,
        block_size=args.block_size,
        eos_token_ids=eos_token_ids(tokenizer, arch.raw, generation_config),
        max_logprobs=args.max_logprobs,
        structured_outputs=StructuredOutputLimits(
            compile_timeout_s=args.structured_outputs_compile_timeout,
            max_grammar_bytes=args.structured_outputs_max_grammar_bytes,
        ),
        pooler=pooler,
        max_loras=worker_config.max_loras,
        max_lora_rank=worker_config.max_lora_rank if worker_config.max_loras else 0,
        lora_targets=executor.lora_targets() if worker_config.max_loras else {},
        max_images_per_prompt=images_per_prompt(args.limit_mm_per_prompt, takes_images(arch)),
    )
    info = ModelInfo(
        str(model_path),
        arch.architecture,
        worker_config.dtype,
        platform.name,
        kv_cache_dtype=args.kv_cache_dtype,
        quantization=args.quantization or checkpoint_method_name(arch.quantization_config),
        attention_backends=_attention_backend_names(executor),
        tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=args.pipeline_parallel_size,
        enable_prefix_caching=args.enable_prefix_caching,
        sampling_defaults=defaults,
    )
    return engine_cls(executor, scheduler, tokenizer, limits, info)


def _start_workers(
    args: EngineArgs, worker_config: WorkerConfig, model_path: Path, load_format: str, uses_kv_cache: bool
) -> tuple[Any, int, Any | None]:
    """The executor with its model loaded and KV cache allocated, the number of
    KV blocks, and the tokenizer (loaded meanwhile on a thread); a failure
    releases the workers already started."""
    from octavo.runtime.executor import create_executor

    tokenizer_future = None if args.skip_tokenizer_init else load_tokenizer_in_background(
        args.tokenizer, args.chat_template, model_path, load_format
    )
    executor = None
    try:
        with timed_phase("start workers and load the model"):
            executor = create_executor(worker_config, args.distributed_executor_backend)
        num_blocks = executor.determine_num_kv_blocks()
        if num_blocks < 1 and uses_kv_cache:
            raise InvalidArgumentError("no memory is left for the KV cache", param="gpu_memory_utilization")
        executor.initialize_kv_cache(num_blocks)
        with timed_phase("wait for the tokenizer"):
            tokenizer = tokenizer_future.result() if tokenizer_future is not None else None
    except BaseException:
        if executor is not None:
            executor.shutdown()
        raise
    return executor, num_blocks, tokenizer


def _attention_backend_names(executor) -> tuple[str, ...]:
    """What the workers chose (an executor from a plugin may not say: empty)."""
    names = getattr(executor, "attention_backend_names", None)
    return tuple(names()) if names is not None else ()


def _check_parallel_layout(args: EngineArgs, arch: ModelArchConfig) -> None:
    """Refuse a TP/PP layout or backend that cannot work, before any worker starts."""
    from octavo.distributed.checks import check_parallel_config
    from octavo.runtime.executor import resolve_backend

    check_parallel_config(arch, args.tensor_parallel_size, args.pipeline_parallel_size, args.enable_expert_parallel)
    backend = resolve_backend(args.distributed_executor_backend, args.tensor_parallel_size * args.pipeline_parallel_size)
    if args.async_scheduling and backend != "uni":
        raise InvalidArgumentError(
            f"async_scheduling runs with one device in the engine's process (the uni executor), not {backend!r}",
            param="async_scheduling",
        )


def load_engine_tokenizer(args: EngineArgs):
    """The tokenizer ``build_engine`` loads for ``args`` (None with skip_tokenizer_init)."""
    if args.skip_tokenizer_init:
        return None
    model_path, load_format = _model_dir(args)
    return load_model_tokenizer(args.tokenizer, args.chat_template, model_path, load_format)
