"""A scripted executor: the engine and detokenizer without a model."""

from __future__ import annotations

from octavo.core.engine import EngineLimits, LLMEngine
from octavo.core.kv_cache_manager import KVCacheManager
from octavo.core.scheduler import Scheduler, SchedulerConfig
from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput, TokenLogprobs
from octavo.runtime.request_state import RequestStates


class ScriptedExecutor:
    """Samples, for every request, the next token of one fixed script; where
    logprobs are asked for, the i-th output token's logprob is ``-(i + 1)``."""

    def __init__(self, script: list[int]) -> None:
        self.script = script
        self.states = RequestStates()

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        self.states.apply(scheduler_output)
        output = ModelRunnerOutput()
        for request_id, num_tokens in scheduler_output.num_scheduled_tokens.items():
            state = self.states[request_id]
            if state.num_computed_tokens + num_tokens == len(state.token_ids):
                index = len(state.output_token_ids)
                token_id = self.script[index % len(self.script)]
                output.sampled_token_ids[request_id] = [token_id]
                if state.sampling_params.logprobs is not None:
                    output.logprobs[request_id] = [TokenLogprobs([token_id], [-(index + 1.0)], [1])]
        return output

    def determine_num_kv_blocks(self) -> int:
        return 64

    def initialize_kv_cache(self, num_blocks: int) -> None:
        pass

    def check_health(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


def scripted_engine(tokenizer, script: list[int], vocab_size: int = 32000, eos: frozenset[int] = frozenset()) -> LLMEngine:
    scheduler = Scheduler(
        SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=256),
        KVCacheManager(64, 16),
    )
    limits = EngineLimits(max_model_len=256, vocab_size=vocab_size, block_size=16, eos_token_ids=eos)
    return LLMEngine(ScriptedExecutor(script), scheduler, tokenizer, limits)
