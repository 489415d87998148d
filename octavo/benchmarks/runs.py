"""Timing Octavo itself: a batch of token-id prompts through the engine loop."""

from __future__ import annotations

import gc
import random
import time

import torch

from octavo.benchmarks.step_trace import StepTrace
from octavo.core.gc_heap import freeze_startup_heap
from octavo.core.sampling_params import RequestOutputKind, SamplingParams
from octavo.engine_args import EngineArgs, build_engine


def random_prompts(num_prompts: int, input_len: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab_size - 10) for _ in range(input_len)] for _ in range(num_prompts)]


class OctavoRunner:
    def __init__(self, args: EngineArgs) -> None:
        args.skip_tokenizer_init = True
        self.engine = build_engine(args)
        # As LLM and serve do: without it the timed run pays full collections of the startup
        # heap (~0.2 s each on the GPU machine, six in round 51's 512 x 256/256 run: 12% of it).
        freeze_startup_heap()

    @property
    def vocab_size(self) -> int:
        return self.engine.limits.vocab_size

    def run(self, prompts: list[list[int]], max_tokens: int, progress=None, trace: StepTrace | None = None) -> float:
        """Seconds to finish every prompt (greedy, exactly ``max_tokens`` each).

        With ``trace``, each engine step's host time and batch go into it
        (needs an engine with a ``step_observer``: not data-parallel).
        """
        params = SamplingParams(
            temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        if trace is not None:
            self.engine.step_observer = trace.observe
        try:
            started = time.perf_counter()
            for index, prompt in enumerate(prompts):
                self.engine.add_request(f"bench-{index}-{started}", {"prompt_token_ids": prompt}, params)
            last_return = time.perf_counter()
            if trace is not None:
                trace.setup_seconds = last_return - started
            while self.engine.has_unfinished_requests():
                finished = sum(1 for output in self.engine.step() if output.finished)
                if trace is not None:
                    now = time.perf_counter()
                    trace.end_step(now - last_return)
                    last_return = now
                if progress is not None and finished:
                    progress.update(finished)
            return time.perf_counter() - started
        finally:
            if trace is not None:
                self.engine.step_observer = None

    def close(self) -> None:
        self.engine.shutdown()
        self.engine = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
