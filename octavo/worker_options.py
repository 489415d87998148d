"""The options a worker needs (``WorkerConfig``), resolved from the engine's
arguments against the model (its dtype, its longest context) and the
platform (the dtypes it supports, its default step size, whether it runs
graphs): what ``build_single_engine`` hands the executor."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from octavo.core.pooling_params import PoolerConfig
from octavo.errors import InvalidArgumentError
from octavo.models.config import ModelArchConfig
from octavo.runtime.config import WorkerConfig, dtype_from_name, dtype_name

if TYPE_CHECKING:
    from octavo.engine_args import EngineArgs


def resolve_dtype(requested: str, arch: ModelArchConfig, supported) -> str:
    if requested != "auto":
        try:
            return dtype_name(dtype_from_name(requested))
        except KeyError:
            raise InvalidArgumentError(
                f"unknown dtype {requested!r} (auto, float32, bfloat16, float16)", param="dtype"
            ) from None
    checkpoint = (arch.torch_dtype or "float32").removeprefix("torch.")
    if checkpoint in ("bfloat16", "float16") and dtype_from_name(checkpoint) in supported:
        return checkpoint
    return "float32"


def resolve_max_model_len(requested: int | None, arch: ModelArchConfig, pooler: PoolerConfig | None = None) -> int:
    limit, source = arch.max_position_embeddings, "max_position_embeddings"
    if pooler is not None and pooler.max_model_len is not None:
        limit, source = pooler.max_model_len, "longest input"
    if requested is None:
        return limit
    if requested > limit:
        raise InvalidArgumentError(
            f"max_model_len={requested} exceeds the model's {source} ({limit})", param="max_model_len"
        )
    return requested


def worker_config_for(
    args: EngineArgs, platform, arch: ModelArchConfig, model_path: Path, load_format: str, pooler: PoolerConfig | None
) -> WorkerConfig:
    """The options a worker needs, resolved against the model and the platform."""
    max_model_len = resolve_max_model_len(args.max_model_len, arch, pooler)
    max_num_batched_tokens = args.max_num_batched_tokens or platform.default_max_num_batched_tokens()
    if not args.enable_chunked_prefill or pooler is not None:
        # Prompts that are never split must fit in one step.
        max_num_batched_tokens = max(max_num_batched_tokens, max_model_len)
    single_device = args.tensor_parallel_size * args.pipeline_parallel_size == 1
    overlap_decode = args.overlap_decode
    if args.async_scheduling:
        overlap_decode = False  # async scheduling overlaps every step, decode included
    elif overlap_decode is None:
        overlap_decode = platform.supports_graphs and not args.enforce_eager and single_device
    if pooler is not None:
        overlap_decode = False  # nothing decodes
    if args.speculative_config is not None:
        overlap_decode = False  # a drafting step's tokens are known only once it is verified
    return WorkerConfig(
        model_path=str(model_path),
        load_format="dummy" if args.load_format == "dummy" else load_format,
        dtype=resolve_dtype(args.dtype, arch, platform.supported_dtypes),
        kv_cache_dtype=args.kv_cache_dtype,
        block_size=args.block_size,
        max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        platform=platform.name,
        quantization=args.quantization,
        seed=args.seed,
        enforce_eager=args.enforce_eager,
        max_prefill_graph_tokens=args.max_prefill_graph_tokens,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        gpu_memory_utilization=args.gpu_memory_utilization,
        num_kv_blocks=args.num_kv_blocks,
        tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=args.pipeline_parallel_size,
        enable_expert_parallel=args.enable_expert_parallel,
        overlap_decode=bool(overlap_decode) and args.pipeline_parallel_size == 1,
        async_scheduling=args.async_scheduling,
        device_index_offset=args.data_parallel_rank * args.tensor_parallel_size * args.pipeline_parallel_size,
        task=pooler.task if pooler is not None else "generate",
        max_loras=args.max_loras if args.enable_lora else 0,
        max_lora_rank=args.max_lora_rank,
        max_cpu_loras=args.max_cpu_loras or args.max_loras,
        hf_overrides=args.hf_overrides,
        logprobs_mode=args.logprobs_mode,
        **_draft_model_options(args),
    )


def _draft_model_options(args: EngineArgs) -> dict:
    """The worker's draft-model options (none without a draft model)."""
    from octavo.core.speculative_config import SpeculativeConfig

    speculative = SpeculativeConfig.from_dict(args.speculative_config)
    if speculative is None or not speculative.uses_draft_model:
        return {}
    return dict(
        speculative_model=speculative.model, num_speculative_tokens=speculative.num_speculative_tokens,
        speculative_method=speculative.method,
        speculative_disable_by_batch_size=speculative.disable_by_batch_size,
    )
