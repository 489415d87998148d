"""Sampling a step in which some requests carry draft tokens.

The batch's logits hold one row per plain request and ``1 + len(drafts)``
rows per drafting request (``PreparedBatch.spec_drafts``), in the order of
``sample_request_ids``. Plain requests are sampled as in any step (grammar
masks, logprobs and all); drafting requests are verified
(``spec_verify.py``), under a grammar with a mask for each of their rows.
Both are queued on the device before the platform's ``end_step`` and read
after it.
"""

from __future__ import annotations

import torch

from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput
from octavo.runtime.input_batch import PreparedBatch
from octavo.runtime.spec_verify import verify_drafts
from octavo.runtime.step_sampling import write_samples


def sample_with_drafts(
    runner, logits: torch.Tensor, batch: PreparedBatch, output: ModelRunnerOutput, scheduler_output: SchedulerOutput
) -> None:
    """Fill ``output`` with each sampled request's tokens (several for a drafting one)."""
    drafts = batch.spec_drafts
    plain_ids, plain_rows, draft_ids, draft_rows = [], [], [], []
    firsts = {}  # each drafting request's first row in the drafting rows (its grammar masks start there)
    row = 0
    for request_id in batch.sample_request_ids:
        if request_id in drafts:
            count = len(drafts[request_id]) + 1
            firsts[request_id] = len(draft_rows)
            draft_ids.append(request_id)
            draft_rows.extend(range(row, row + count))
            row += count
        else:
            plain_ids.append(request_id)
            plain_rows.append(row)
            row += 1
    upload, device = runner.sampler.upload, logits.device
    sampled = None
    if plain_ids:
        plain_logits = logits.index_select(0, upload(plain_rows, torch.long, device))
        allowed = runner.grammar_allowed(batch, scheduler_output, plain_ids)
        sampled = runner.sampler.sample(plain_logits, runner.sampling_rows(plain_ids), allowed)
    draft_logits = logits.index_select(0, upload(draft_rows, torch.long, device))
    allowed = runner.grammar_masks.upload(scheduler_output.grammar_bitmask, firsts)
    verification = verify_drafts(
        runner.sampler, draft_logits, runner.sampling_rows(draft_ids), [drafts[r] for r in draft_ids], allowed
    )
    runner.end_step()
    kept = verification.kept()
    for request_id, tokens, logprobs in zip(draft_ids, kept, verification.kept_logprobs(kept)):
        output.sampled_token_ids[request_id] = tokens
        if logprobs is not None:
            output.logprobs[request_id] = logprobs
    if sampled is not None:
        write_samples(output, plain_ids, sampled)
