"""Sampling one token per row of logits, batch-independently.

Pipeline: raw logprobs (what ``logprobs`` reports) -> min_tokens masking ->
repetition / presence / frequency penalties -> grammar masks (structured
outputs: tokens the grammar forbids get -inf, on the device, all constrained
rows at once) -> greedy argmax, or temperature, top-k, top-p, min-p and a
draw. Draws use the "exponential race"
(``argmax(p / q)`` with ``q ~ Exp(1)``), which is exactly sampling from ``p``;
a seeded row draws its ``q`` from a generator seeded by (seed, output index),
so its tokens do not depend on what else is in the batch or on preemption.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo.core.sampling_params import SamplingParams
from octavo.core.scheduler_output import TokenLogprobs


@dataclass
class AllowedTokens:
    """Grammar masks on the device: ``words[i]`` masks logits row ``rows[i]``
    (``rows`` None: row ``i``, every row masked).

    ``words`` is int32 ``[k, ceil(vocab / 32)]``; bit ``j`` of word ``w``
    allows token ``32 * w + j`` (xgrammar's layout)."""

    words: torch.Tensor
    rows: torch.Tensor | None


_BYTE_BITS: dict[torch.device, torch.Tensor] = {}


def _byte_bits(device: torch.device) -> torch.Tensor:
    """[256, 8] bool: the bits of each byte value, lowest first."""
    if device not in _BYTE_BITS:
        values = torch.arange(256, device=device)
        _BYTE_BITS[device] = ((values.unsqueeze(1) >> torch.arange(8, device=device)) & 1).bool()
    return _BYTE_BITS[device]


def apply_token_bitmask_(logits: torch.Tensor, allowed: AllowedTokens) -> torch.Tensor:
    """Set the logits of forbidden tokens to -inf, in place, for every masked row at once."""
    num_rows, vocab_size = allowed.words.shape[0], logits.shape[-1]
    # The words' bytes (little-endian, as on every device we run on) looked up
    # bit by bit: one byte of work per token instead of a 32-bit shift.
    bits = _byte_bits(logits.device)[allowed.words.view(torch.uint8).long()].view(num_rows, -1)
    if bits.shape[1] < vocab_size:  # tokens past the mask's width are never allowed
        bits = torch.nn.functional.pad(bits, (0, vocab_size - bits.shape[1]))
    banned = ~bits[:, :vocab_size]
    if allowed.rows is None:
        logits[:num_rows].masked_fill_(banned, float("-inf"))
        return logits
    masked = logits.index_select(0, allowed.rows).masked_fill_(banned, float("-inf"))
    logits.index_copy_(0, allowed.rows, masked)
    return logits


@dataclass
class SamplingRow:
    """One request's sampling inputs; ``token_ids`` is shared with the runner's
    state (prompt then output), so building a row copies nothing."""

    params: SamplingParams
    token_ids: list[int]
    num_prompt_tokens: int
    eos_token_ids: frozenset[int]

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


def _seed_for(seed: int, output_index: int) -> int:
    # A cheap 64-bit mix so that consecutive steps get unrelated streams.
    value = (seed * 0x9E3779B97F4A7C15 + output_index * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    return value >> 1


def apply_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    vocab_size = logits.shape[-1]
    for i, row in enumerate(rows):
        params = row.params
        if not params.needs_penalties:
            continue
        output_ids = torch.tensor([t for t in row.output_token_ids if t < vocab_size], dtype=torch.long, device=logits.device)
        counts = torch.zeros(vocab_size, device=logits.device, dtype=logits.dtype)
        if output_ids.numel():
            counts.scatter_add_(0, output_ids, torch.ones_like(output_ids, dtype=logits.dtype))
        if params.repetition_penalty != 1.0:
            seen = counts > 0
            prompt_ids = torch.tensor([t for t in row.prompt_token_ids if t < vocab_size], dtype=torch.long, device=logits.device)
            seen[prompt_ids] = True
            penalty = params.repetition_penalty
            row_logits = logits[i]
            logits[i] = torch.where(seen, torch.where(row_logits > 0, row_logits / penalty, row_logits * penalty), row_logits)
        if params.frequency_penalty:
            logits[i] -= params.frequency_penalty * counts
        if params.presence_penalty:
            logits[i] -= params.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def apply_min_tokens(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    for i, row in enumerate(rows):
        params = row.params
        if row.num_output_tokens < params.min_tokens:
            banned = set(params.stop_token_ids)
            if not params.ignore_eos:
                banned |= row.eos_token_ids
            banned_ids = [t for t in banned if t < logits.shape[-1]]
            if banned_ids:
                logits[i, banned_ids] = float("-inf")
    return logits


def truncate_distribution(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask logits outside top-k, top-p and min-p (per-row values; 0 / 1 / 0 disable)."""
    vocab_size = logits.shape[-1]
    if bool((top_k > 0).any()):
        k = torch.where(top_k > 0, top_k, vocab_size).clamp(max=vocab_size)
        kth = torch.sort(logits, dim=-1, descending=True).values.gather(1, (k - 1).long()[:, None])
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if bool((top_p < 1.0).any()):
        sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # Drop the low tail whose total mass is <= 1 - top_p; always keep the top token.
        drop = cumulative <= (1 - top_p)[:, None]
        drop[:, -1] = False
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(1, order, drop), float("-inf"))
    if bool((min_p > 0).any()):
        probs = logits.softmax(dim=-1)
        threshold = probs.max(dim=-1, keepdim=True).values * min_p[:, None]
        logits = logits.masked_fill(probs < threshold, float("-inf"))
    return logits


class Sampler:
    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def _generator(self, device: torch.device) -> torch.Generator:
        if device not in self._generators:
            self._generators[device] = torch.Generator(device=device).manual_seed(self.seed)
        return self._generators[device]

    def __call__(
        self, logits: torch.Tensor, rows: list[SamplingRow], allowed: AllowedTokens | None = None
    ) -> tuple[list[int], list[TokenLogprobs | None]]:
        if all(_is_plain_greedy(row) for row in rows):
            # The common serving case: one argmax, one device-to-host copy.
            if allowed is not None:
                logits = apply_token_bitmask_(logits, allowed)
            return logits.argmax(dim=-1).tolist(), [None] * len(rows)
        logits = logits.to(torch.float32)
        want_logprobs = any(row.params.logprobs is not None for row in rows)
        raw_logprobs = torch.log_softmax(logits, dim=-1) if want_logprobs else None
        logits = apply_min_tokens(logits.clone(), rows)
        logits = apply_penalties(logits, rows)
        if allowed is not None:
            logits = apply_token_bitmask_(logits, allowed)
        sampled = self._sample(logits, rows)
        token_ids = sampled.tolist()
        logprobs: list[TokenLogprobs | None] = [None] * len(rows)
        if raw_logprobs is not None:
            for i, row in enumerate(rows):
                if row.params.logprobs is not None:
                    logprobs[i] = gather_logprobs(raw_logprobs[i], token_ids[i], row.params.logprobs)
        return token_ids, logprobs

    def _sample(self, logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        greedy = logits.argmax(dim=-1)
        random_rows = [i for i, row in enumerate(rows) if not row.params.is_greedy]
        if not random_rows:
            return greedy
        device = logits.device
        index = torch.tensor(random_rows, device=device)
        params = [rows[i].params for i in random_rows]
        sub = logits[index] / torch.tensor([p.temperature for p in params], device=device)[:, None]
        sub = truncate_distribution(
            sub,
            # top_k >= the vocabulary keeps everything; clamping keeps huge values inside int64 tensors.
            torch.tensor([min(p.top_k, logits.shape[-1]) for p in params], device=device),
            torch.tensor([p.top_p for p in params], device=device),
            torch.tensor([p.min_p for p in params], device=device),
        )
        probs = sub.softmax(dim=-1)
        race = torch.empty_like(probs).exponential_(generator=self._generator(device))
        for j, i in enumerate(random_rows):
            seed = rows[i].params.seed
            if seed is not None:
                row_generator = torch.Generator(device=device).manual_seed(_seed_for(seed, rows[i].num_output_tokens))
                race[j] = torch.empty(probs.shape[-1], device=device).exponential_(generator=row_generator)
        choice = (probs / race).argmax(dim=-1)
        return greedy.index_copy(0, index, choice)


def _is_plain_greedy(row: SamplingRow) -> bool:
    params = row.params
    return (
        params.is_greedy
        and params.logprobs is None
        and not params.needs_penalties
        and row.num_output_tokens >= params.min_tokens
    )


def gather_logprobs(logprobs: torch.Tensor, token_id: int, num_top: int) -> TokenLogprobs:
    """The chosen token's logprob and rank, then the ``num_top`` most likely."""
    chosen = logprobs[token_id]
    rank = int((logprobs > chosen).sum().item()) + 1
    token_ids, values, ranks = [token_id], [float(chosen)], [rank]
    if num_top > 0:
        top = torch.topk(logprobs, num_top)
        token_ids += top.indices.tolist()
        values += top.values.tolist()
        ranks += list(range(1, num_top + 1))
    return TokenLogprobs(token_ids=token_ids, logprobs=values, ranks=ranks)
