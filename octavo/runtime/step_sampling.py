"""The runner's sampling of a step: one sampling row per request, grammar
masks by logits row, the sampled tokens and logprobs into the step's
output (drafting steps through ``spec_steps.py``), and prompt logprobs.

A mixin of ``ModelRunner``: it reads the runner's request states,
sampler, grammar-mask uploader, model and EOS ids.
"""

from __future__ import annotations

import torch

from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput, TokenLogprobs
from octavo.runtime.input_batch import PreparedBatch
from octavo.runtime.sampled_batch import SampledBatch
from octavo.runtime.sampler import AllowedTokens, SamplingRow, gather_logprobs


class StepSampling:
    def sampling_rows(self, request_ids: list[str]) -> list[SamplingRow]:
        # Each state keeps its row: the row shares the state's token list and
        # nothing else in it changes, so it is built once, not every step.
        states, rows = self.states, []
        for request_id in request_ids:
            state = states[request_id]
            row = state.sampling_row
            if row is None:
                row = state.sampling_row = SamplingRow(
                    state.sampling_params, state.token_ids, state.num_prompt_tokens, self.eos_token_ids
                )
            rows.append(row)
        return rows

    def grammar_allowed(
        self, batch: PreparedBatch, scheduler_output: SchedulerOutput, request_ids: list[str] | None = None
    ) -> AllowedTokens | None:
        """The step's grammar masks on the device, by logits row (None when no
        row is constrained); ``request_ids``: the requests of the rows, if not
        the batch's sampled requests."""
        if scheduler_output.grammar_bitmask is None:
            return None
        ids = batch.sample_request_ids if request_ids is None else request_ids
        logits_rows = {request_id: row for row, request_id in enumerate(ids)}
        return self.grammar_masks.upload(scheduler_output.grammar_bitmask, logits_rows)

    def _sample(
        self, logits: torch.Tensor, batch: PreparedBatch, output: ModelRunnerOutput, scheduler_output: SchedulerOutput
    ) -> None:
        if batch.spec_drafts:
            from octavo.runtime.spec_steps import sample_with_drafts

            sample_with_drafts(self, logits, batch, output, scheduler_output)
            return
        rows = self.sampling_rows(batch.sample_request_ids)
        sampled = self.sampler.sample(logits, rows, self.grammar_allowed(batch, scheduler_output))
        self.end_step()
        write_samples(output, batch.sample_request_ids, sampled)

    def prompt_logprobs(self, hidden: torch.Tensor, batch: PreparedBatch, output: ModelRunnerOutput) -> None:
        for span in batch.prompt_logprob_spans:
            if not span.target_token_ids:
                continue
            num_top = self.states[span.request_id].sampling_params.prompt_logprobs
            rows = hidden[span.hidden_start : span.hidden_start + len(span.target_token_ids)]
            logprobs = torch.log_softmax(self.model.compute_logits(rows).to(torch.float32), dim=-1)
            entries: list[TokenLogprobs] = [
                gather_logprobs(logprobs[j], token_id, num_top) for j, token_id in enumerate(span.target_token_ids)
            ]
            output.prompt_logprobs[span.request_id] = entries


def write_samples(output: ModelRunnerOutput, request_ids: list[str], sampled: SampledBatch) -> None:
    """One sampled token per request into ``output``, with its logprobs where
    the request asked for them (the batch's one host read)."""
    token_ids, logprobs = sampled.to_host()
    sampled_token_ids = output.sampled_token_ids
    for request_id, token_id in zip(request_ids, token_ids):
        sampled_token_ids[request_id] = [token_id]
    if sampled.chosen_logprobs is not None:  # else no row asked for logprobs
        for request_id, token_logprobs in zip(request_ids, logprobs):
            if token_logprobs is not None:
                output.logprobs[request_id] = [token_logprobs]
