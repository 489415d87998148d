"""The scheduler's options, its statistics, and the check that refuses a
request no schedule could ever run (``check_admissible``, at admission)."""

from __future__ import annotations

from dataclasses import dataclass, field

from octavo.core.kv_cache_manager import PrefixCacheStats
from octavo.core.request import Request
from octavo.core.scheduler_output import CompilationCounts
from octavo.core.speculative_config import SpeculativeConfig
from octavo.errors import RequestTooLargeError


@dataclass
class SchedulerConfig:
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 128
    max_model_len: int = 2048
    enable_chunked_prefill: bool = True
    # How many batches the executor runs at once (pipeline stages); 1 = none.
    max_concurrent_batches: int = 1
    # With several in flight, share the schedulable requests evenly between
    # them (pipeline stages balance); False: each batch as large as a lone
    # one would be, ``max_num_seqs`` a batch (overlapped pooling steps,
    # which keep no KV cache: the same batches as without).
    even_batches_in_flight: bool = True
    # KV slots reserved past each step's tokens, so that a runner may compute
    # the next decode step before this one returns (decode overlap).
    num_lookahead_tokens: int = 0
    # False for encoder-only models: attention sees only the step's tokens.
    uses_kv_cache: bool = True
    # Schedule step N+1 while step N runs (see the module docstring).
    async_scheduling: bool = False
    # Order of the waiting queue and choice of preemption victims: "fcfs" or "priority".
    policy: str = "fcfs"
    # LoRA adapters the running requests may use at once (the runner's slots); 0: LoRA off.
    max_loras: int = 0
    # Speculative decoding (n-gram drafts); None: off.
    speculative: SpeculativeConfig | None = None
    # vLLM's long_prefill_token_threshold: a prompt computes at most this many
    # tokens a step, so that a long one leaves room for others (0: no cap).
    long_prefill_token_threshold: int = 0


@dataclass
class SpecDecodingStats:
    """Speculative decoding since the engine started (vLLM's counters):
    steps that carried drafts, drafts proposed, drafts accepted, and accepted
    drafts by their position (index 0: the first draft of a step)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def record(self, num_draft_tokens: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        positions = self.accepted_per_position
        if len(positions) < num_draft_tokens:
            positions.extend([0] * (num_draft_tokens - len(positions)))
        for index in range(num_accepted):
            positions[index] += 1


@dataclass
class SchedulerStats:
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    num_free_blocks: int
    num_preemptions: int
    prefix_cache: PrefixCacheStats
    # Filled by the engine from its workers' reports (zeros where nothing compiles).
    compilations: CompilationCounts = field(default_factory=CompilationCounts)
    # With LoRA on: the adapters (by name) of the running and of the waiting requests.
    running_lora_adapters: list[str] = field(default_factory=list)
    waiting_lora_adapters: list[str] = field(default_factory=list)
    # With speculative decoding on: its counters.
    spec_decoding: SpecDecodingStats | None = None


def check_admissible(request: Request, config: SchedulerConfig, num_blocks: int, block_size: int) -> None:
    """Raise ``RequestTooLargeError`` for a request that could never be scheduled."""
    if request.is_pooling:
        check_pooling_length(request.num_prompt_tokens, config)
    max_total_tokens = min(request.num_prompt_tokens + request.max_tokens, config.max_model_len)
    num_blocks_needed = -(-max_total_tokens // block_size)
    if config.uses_kv_cache and num_blocks_needed > num_blocks:
        raise RequestTooLargeError(
            f"request needs up to {max_total_tokens} tokens ({num_blocks_needed} KV blocks) but the "
            f"KV cache holds only {num_blocks} blocks of {block_size} tokens",
            param="max_tokens",
        )
    if not config.enable_chunked_prefill and request.num_prompt_tokens > config.max_num_batched_tokens:
        raise RequestTooLargeError(
            f"prompt of {request.num_prompt_tokens} tokens exceeds max_num_batched_tokens "
            f"({config.max_num_batched_tokens}) and chunked prefill is disabled",
            param="prompt",
        )


def check_pooling_length(num_tokens: int, config: SchedulerConfig) -> None:
    """Raise ``RequestTooLargeError`` for an input to pool that no step could hold
    (one is never split across steps)."""
    if num_tokens > config.max_num_batched_tokens:
        raise RequestTooLargeError(
            f"the input has {num_tokens} tokens but one step computes at most "
            f"{config.max_num_batched_tokens} (max_num_batched_tokens), and inputs to pool are never split",
            param="input",
        )


def check_pooling_lengths(token_ids: list[list[int]], config: SchedulerConfig) -> None:
    """``check_pooling_length`` for a batch of inputs: the longest decides for
    all unless it fails; then the first that fails raises, as one by one."""
    if token_ids and max(map(len, token_ids)) > config.max_num_batched_tokens:
        for ids in token_ids:
            check_pooling_length(len(ids), config)

