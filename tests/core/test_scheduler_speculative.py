"""The scheduler with n-gram drafts: which requests get how many drafts,
and what a verified step does to their progress and the counters."""

from __future__ import annotations

from octavo.core.kv_cache_manager import KVCacheManager
from octavo.core.request import Request
from octavo.core.sampling_params import SamplingParams
from octavo.core.scheduler import Scheduler, SchedulerConfig
from octavo.core.scheduler_output import ModelRunnerOutput
from octavo.core.speculative_config import SpeculativeConfig
from octavo.core.types import RequestId

NGRAM = SpeculativeConfig.from_dict({"num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2})


def make_scheduler(num_blocks=64, **config) -> Scheduler:
    config.setdefault("max_model_len", 128)
    return Scheduler(SchedulerConfig(speculative=NGRAM, **config), KVCacheManager(num_blocks, 4, enable_prefix_caching=False))


def add(scheduler, request_id: str, prompt: list[int], max_tokens: int = 10, **params) -> Request:
    request = Request(
        request_id=RequestId(request_id), prompt_token_ids=prompt,
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True, **params),
        max_tokens=max_tokens, block_size=4,
    )
    scheduler.add_request(request)
    return request


def prefill(scheduler, token_id: int) -> None:
    output = scheduler.schedule()
    scheduler.update_from_output(output, ModelRunnerOutput(sampled_token_ids={r: [token_id] for r in output.num_scheduled_tokens}))


def test_drafts_are_scheduled_and_rejected_ones_taken_back():
    scheduler = make_scheduler()
    request = add(scheduler, "a", [1, 2, 3, 1, 2])
    prefill(scheduler, 3)  # tokens 1 2 3 1 2 3: "2 3" was followed by 1 2 3
    output = scheduler.schedule()
    assert output.spec_token_ids == {"a": [1, 2, 3]}
    assert output.num_scheduled_tokens == {"a": 4}
    # The runner kept two drafts and replaced the third with 9.
    scheduler.update_from_output(output, ModelRunnerOutput(sampled_token_ids={"a": [1, 2, 9]}))
    assert request.output_token_ids == [3, 1, 2, 9]
    assert request.num_computed_tokens == 8  # 6 + the next token + two kept drafts; 9 is not computed yet
    stats = scheduler.get_stats().spec_decoding
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (1, 3, 2)
    assert stats.accepted_per_position == [1, 1, 0]


def test_drafts_stop_before_max_tokens_and_the_budget():
    scheduler = make_scheduler(max_num_batched_tokens=3)
    add(scheduler, "a", [1, 2, 1], max_tokens=3)
    prefill(scheduler, 2)  # tokens 1 2 1 2: one output, two to go
    output = scheduler.schedule()
    assert output.spec_token_ids == {"a": [1]}  # the next token plus one draft reach max_tokens
    scheduler = make_scheduler(max_num_batched_tokens=3)
    add(scheduler, "b", [1, 2, 1])
    prefill(scheduler, 2)
    assert scheduler.schedule().spec_token_ids == {"b": [1, 2]}  # three tokens in the budget


def test_seeded_requests_do_not_draft_and_blocks_that_do_not_fit():
    scheduler = make_scheduler()
    for index, params in enumerate([dict(bad_words_token_ids=[[9]]), dict(temperature=1.0, seed=3), dict(repetition_penalty=1.2),
                                    dict(min_tokens=5), dict(temperature=1.0), dict(temperature=0.0, logprobs=2),
                                    dict(temperature=0.0, logit_bias={3: 1.0})]):
        add(scheduler, f"r{index}", [1, 2, 1], **params)
    prefill(scheduler, 2)
    # Every request but the seeded one drafts (logit edits apply at each drafted place).
    assert list(scheduler.schedule().spec_token_ids) == ["r0", "r2", "r3", "r4", "r5", "r6"]
    # One free block: the first request's drafts take it, the second's do not
    # fit and are dropped (it decodes one token); nobody is preempted for drafts.
    scheduler = make_scheduler(num_blocks=5)
    add(scheduler, "a", [1, 2, 3, 1, 2, 3, 1], max_tokens=4)
    add(scheduler, "b", [1, 2, 3, 1, 2, 3, 1], max_tokens=4)
    prefill(scheduler, 2)  # eight tokens each, two blocks each
    output = scheduler.schedule()
    assert output.spec_token_ids == {"a": [3, 1]} and output.num_scheduled_tokens == {"a": 3, "b": 1}
    assert scheduler.num_preemptions == 0
