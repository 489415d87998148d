"""Checking draft tokens against the model: which a request keeps.

A request with ``k`` drafts has ``k + 1`` logits rows: row ``i`` is the
model's distribution for the token at draft ``i``'s place, the last row the
one after all drafts (the bonus). Drafts are kept in order while they are
accepted; the first rejected one is replaced, and if all are kept the bonus
row adds one token. So each step yields between 1 and ``k + 1`` tokens.

- Greedy: draft ``i`` is accepted when it is the argmax of row ``i``, and a
  rejected draft is replaced by that argmax: the tokens are exactly the
  ones decoding one token a step would give.
- Random (temperature, top-k, top-p, min-p, no seed): the n-gram drafts are
  certain guesses (a one-hot draft distribution), so speculative sampling's
  rule becomes: accept draft ``d`` with probability ``p(d)``; on rejection
  draw from ``p`` with ``d`` removed (renormalised). Each kept token is then
  distributed exactly as ``p``, as without drafts.

Requests verified here carry no seed (``core/speculative_config.may_speculate``);
each row's distribution is the temperature-scaled, truncated softmax of its
logits after the sampler's edits (logit biases, allowed tokens, bad words,
min_tokens, penalties: each row sees the request's tokens followed by the
drafts before its place) and the row's grammar mask, where it has them. Logprobs, where
asked for, are those of the raw logits (as without drafts) at each kept
token's row. ``verify_drafts``
queues the work on the device; ``Verification.kept`` reads the results.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo.core.scheduler_output import TokenLogprobs
from octavo.runtime.sampled_batch import SampledBatch, fill_logprobs, report_values
from octavo.runtime.sampler import (
    AllowedTokens, Sampler, SamplingRow, apply_logit_edits, apply_min_tokens, apply_penalties,
    apply_token_bitmask_, random_device, sampling_probs,
)


@dataclass
class Verification:
    """A batch's verification queued on the device; ``kept()`` reads it."""

    drafts: list[list[int]]
    random_requests: list[int]
    greedy_ids: torch.Tensor  # every row's argmax
    accepted: torch.Tensor | None  # the random requests' rows: draft accepted
    replacements: torch.Tensor | None  # ... and the token in its place
    # Where some request asks for logprobs: each row's token if it is kept
    # (the draft if accepted, else the replacement), with its logprobs.
    logprobs: SampledBatch | None = None

    def kept(self) -> list[list[int]]:
        """The tokens each request keeps (the one host sync)."""
        greedy = self.greedy_ids.cpu().tolist()
        accepted = self.accepted.cpu().tolist() if self.accepted is not None else []
        replacements = self.replacements.cpu().tolist() if self.replacements is not None else []
        random_set = set(self.random_requests)
        results, start, random_start = [], 0, 0
        for j, drafts in enumerate(self.drafts):
            count = len(drafts) + 1
            if j in random_set:
                span = slice(random_start, random_start + count)
                results.append(_keep(drafts, accepted[span], replacements[span]))
                random_start += count
            else:
                targets = greedy[start : start + count]
                results.append(_keep(drafts, [t == d for t, d in zip(targets, drafts)], targets))
            start += count
        return results

    def kept_logprobs(self, kept: list[list[int]]) -> list[list[TokenLogprobs] | None]:
        """Each request's logprobs of its kept tokens (None where it asked for none)."""
        if self.logprobs is None:
            return [None] * len(kept)
        _, rows = self.logprobs.to_host()
        results, start = [], 0
        for drafts, tokens in zip(self.drafts, kept):
            entries = rows[start : start + len(tokens)]
            results.append(entries if entries and entries[0] is not None else None)
            start += len(drafts) + 1
        return results


def verify_drafts(
    sampler: Sampler, logits: torch.Tensor, rows: list[SamplingRow], drafts: list[list[int]],
    allowed: AllowedTokens | None = None,
) -> Verification:
    """Queue the verification of each request's drafts: ``logits`` holds
    request ``j``'s ``len(drafts[j]) + 1`` rows in order, ``rows[j]`` its
    sampling inputs, ``allowed`` the grammar masks of constrained rows.
    Nothing is read on the host."""
    random_requests = [j for j, row in enumerate(rows) if not row.params.is_greedy]
    counts = [len(d) + 1 for d in drafts]
    # Logprobs come from the raw logits; the choice from the edited and masked ones.
    masked = _edited(sampler, logits, rows, drafts)
    if allowed is not None:
        masked = apply_token_bitmask_(masked.clone() if masked is logits else masked, allowed)
    verification = Verification(drafts, random_requests, masked.argmax(dim=-1), None, None)
    chosen = verification.greedy_ids
    if random_requests:
        verification.accepted, verification.replacements, kept_random = _random_rows(
            sampler, masked, rows, drafts, counts, random_requests
        )
        firsts = [sum(counts[:j]) for j in random_requests]
        random_rows = [first + i for first, j in zip(firsts, random_requests) for i in range(counts[j])]
        chosen = chosen.index_copy(0, sampler.upload(random_rows, torch.long, logits.device), kept_random)
    num_top = [row.params.logprobs for row, count in zip(rows, counts) for _ in range(count)]
    if any(n is not None for n in num_top):
        verification.logprobs = _logprobs(logits, chosen, num_top, sampler.logprobs_mode)
    return verification


def _edited(sampler: Sampler, logits: torch.Tensor, rows: list[SamplingRow], drafts: list[list[int]]) -> torch.Tensor:
    """The logits after each row's edits, as the sampler makes them (logit
    biases and allowed tokens, bad words, min_tokens, penalties), each row
    seeing the request's tokens followed by the drafts before its place
    (``logits`` itself where no request edits)."""
    if not any(row.params.edits_logits or row.num_output_tokens < row.params.min_tokens for row in rows):
        return logits
    expanded = []
    for row, request_drafts in zip(rows, drafts):
        expanded.append(row)
        for index in range(1, len(request_drafts) + 1):
            expanded.append(_row_after(row, request_drafts[:index]))
    upload = sampler.upload
    edited = apply_logit_edits(logits.to(torch.float32).clone(), expanded, upload)
    return apply_penalties(apply_min_tokens(edited, expanded, upload), expanded, upload)


def _row_after(row: SamplingRow, drafts: list[int]) -> SamplingRow:
    """``row`` as it would stand once ``drafts`` were its output's next
    tokens (only a row whose edits depend on the tokens before needs them)."""
    params = row.params
    if not (params.needs_penalties or params.bad_words_token_ids or row.num_output_tokens < params.min_tokens):
        return row
    after = SamplingRow(params, row.token_ids + drafts, row.num_prompt_tokens, row.eos_token_ids)
    after.edit_tensors = row.edit_tensors  # the biases and allowed tokens, uploaded once
    return after


def _logprobs(logits: torch.Tensor, chosen: torch.Tensor, num_top: list[int | None], mode: str) -> SampledBatch:
    """Each row's chosen token's logprob and rank, and the top ones, from the
    raw logits (what the sampler reports without drafts, in a raw ``logprobs_mode``)."""
    batch = SampledBatch(chosen, num_top)
    fill_logprobs(batch, report_values(logits.to(torch.float32), mode))
    return batch


def _keep(drafts: list[int], accepted: list[bool], replacements: list[int]) -> list[int]:
    """Drafts while accepted, then the first replacement (or the bonus token)."""
    kept = []
    for index, draft in enumerate(drafts):
        if not accepted[index]:
            return kept + [replacements[index]]
        kept.append(draft)
    return kept + [replacements[len(drafts)]]


def _random_rows(
    sampler: Sampler, logits: torch.Tensor, rows: list[SamplingRow], drafts: list[list[int]], counts: list[int],
    random_requests: list[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """For the random requests' rows, in order: whether each draft is accepted
    (the bonus row: False), the token to put in its place (the bonus row: a
    plain draw), and the row's token if kept (the draft or its replacement)."""
    device, upload = logits.device, sampler.upload
    firsts = [sum(counts[:j]) for j in range(len(counts))]
    row_index = [firsts[j] + i for j in random_requests for i in range(counts[j])]
    params = [rows[j].params for j in random_requests for _ in range(counts[j])]
    # Each draft row's draft; the bonus rows point at token 0 with no effect (masked below).
    draft_ids = [t for j in random_requests for t in (*drafts[j], 0)]
    is_draft = [i < len(drafts[j]) for j in random_requests for i in range(counts[j])]
    sub = logits.index_select(0, upload(row_index, torch.long, device)).to(torch.float32)
    probs = sampling_probs(sub, params, upload)
    draft_index = upload(draft_ids, torch.long, device)[:, None]
    draft_mask = upload(is_draft, torch.bool, device)
    generator, source = sampler.generator(device), random_device(device)
    uniform = torch.rand(probs.shape[0], generator=generator, device=source).to(device)
    accepted = (uniform < probs.gather(1, draft_index)[:, 0]) & draft_mask
    # A rejected draft is drawn again from p without it; the bonus row from p itself.
    residual = torch.where(draft_mask[:, None], probs.scatter(1, draft_index, 0.0), probs)
    race = torch.empty(probs.shape, device=source).exponential_(generator=generator).to(device)
    replacements = (residual / race).argmax(dim=-1)
    return accepted, replacements, torch.where(accepted, draft_index[:, 0], replacements)
