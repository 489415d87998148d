"""Sampling one token per row of logits, batch-independently.

Pipeline: raw logprobs (what ``logprobs`` reports by default) -> allowed-token lists,
logit biases and bad words -> min_tokens masking ->
repetition / presence / frequency penalties -> grammar masks (structured
outputs: tokens the grammar forbids get -inf, on the device, all constrained
rows at once) -> greedy argmax, or temperature, top-k, top-p, min-p and a
draw. Draws use the "exponential race"
(``argmax(p / q)`` with ``q ~ Exp(1)``), which is exactly sampling from ``p``;
a seeded row draws its ``q`` from a generator seeded by (seed, output index),
so its tokens do not depend on what else is in the batch or on preemption.

What ``logprobs`` reports is vLLM's ``logprobs_mode``: ``raw_logprobs``
(the model's, before any edit), ``raw_logits``, ``processed_logprobs`` or
``processed_logits`` (after the edits, penalties and grammar masks, and for
random rows the temperature and top-k / top-p / min-p: the distribution the
token was drawn from). A token a step excluded has logit ``-inf``, reported
as -9999.0 (vLLM's stand-in: JSON has no infinity).

(``sampled_batch.py`` holds the samples and these values.)

``Sampler.sample`` leaves everything on the device and never waits for it:
host values (penalty ids, per-row knobs) go up through ``HostUpload``
(pinned memory, asynchronous copies where the platform pins), and which
steps run is decided from the host-side parameters, never from a device
value. ``SampledBatch.to_host`` is the one sync. The synchronous path
(``__call__``) is ``sample`` followed by ``to_host``, so the asynchronous
engine (``runtime/async_steps.py``) samples exactly the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from octavo.core.bad_words import banned_last_tokens
from octavo.core.sampling_params import SamplingParams
from octavo.core.scheduler_output import TokenLogprobs
from octavo.runtime.sampled_batch import SampledBatch, fill_logprobs, report_values


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
    # Greedy, no logprobs, no logit edits: one argmax once ``min_tokens`` is
    # reached. Params never change, so this is decided once per row.
    greedy_without_extras: bool = field(init=False)
    # The row's allowed ids, bias ids and bias values on the device, uploaded
    # at its first step (``apply_logit_edits``); the params never change.
    edit_tensors: tuple | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        params = self.params
        self.greedy_without_extras = params.is_greedy and params.logprobs is None and not params.edits_logits

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


class HostUpload:
    """Small host lists -> device tensors without a host sync: a pageable
    copy to a device waits for the stream, a pinned asynchronous one does not."""

    def __init__(self, pin_memory: bool = False) -> None:
        self.pin_memory = pin_memory

    def __call__(self, values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        if device.type == "cpu":
            return torch.tensor(values, dtype=dtype)
        host = torch.tensor(values, dtype=dtype, pin_memory=self.pin_memory)
        return host.to(device, non_blocking=self.pin_memory)


_HAS_GENERATORS: dict[str, bool] = {}


def random_device(device: torch.device) -> torch.device:
    """Where random numbers for ``device`` are drawn: the device itself if
    torch has generators for it, else the CPU (the draws are then copied; XLA)."""
    supported = _HAS_GENERATORS.get(device.type)
    if supported is None:
        try:
            torch.Generator(device=device)
            supported = True
        except RuntimeError:
            supported = False
        _HAS_GENERATORS[device.type] = supported
    return device if supported else torch.device("cpu")


def _seed_for(seed: int, output_index: int) -> int:
    # A cheap 64-bit mix so that consecutive steps get unrelated streams.
    value = (seed * 0x9E3779B97F4A7C15 + output_index * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    return value >> 1


def apply_penalties(logits: torch.Tensor, rows: list[SamplingRow], upload: HostUpload | None = None) -> torch.Tensor:
    upload = upload or HostUpload()
    vocab_size, device = logits.shape[-1], logits.device
    for i, row in enumerate(rows):
        params = row.params
        if not params.needs_penalties:
            continue
        output_ids = upload([t for t in row.output_token_ids if t < vocab_size], torch.long, device)
        counts = torch.zeros(vocab_size, device=device, dtype=logits.dtype)
        if output_ids.numel():
            counts.scatter_add_(0, output_ids, torch.ones_like(output_ids, dtype=logits.dtype))
        if params.repetition_penalty != 1.0:
            seen = counts > 0
            prompt_ids = upload([t for t in row.prompt_token_ids if t < vocab_size], torch.long, device)
            # index_fill_ takes the value as a kernel argument; ``seen[ids] = True`` copies it to the device (a sync).
            seen.index_fill_(0, prompt_ids, True)
            penalty = params.repetition_penalty
            row_logits = logits[i]
            logits[i] = torch.where(seen, torch.where(row_logits > 0, row_logits / penalty, row_logits * penalty), row_logits)
        if params.frequency_penalty:
            logits[i] -= params.frequency_penalty * counts
        if params.presence_penalty:
            logits[i] -= params.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def _edit_tensors(row: SamplingRow, upload: HostUpload, device: torch.device) -> tuple:
    if row.edit_tensors is None:
        params = row.params
        allowed = upload(params.allowed_token_ids, torch.long, device) if params.allowed_token_ids else None
        bias = params.logit_bias or {}
        row.edit_tensors = (allowed, upload(list(bias), torch.long, device),
                            upload(list(bias.values()), torch.float32, device)) if bias else (allowed, None, None)
    return row.edit_tensors


def apply_logit_edits(logits: torch.Tensor, rows: list[SamplingRow], upload: HostUpload | None = None) -> torch.Tensor:
    """Allowed-token lists (every other token -inf), logit biases (added) and the
    tokens that would complete a bad word (-inf), in place.
    Token ids were checked against the vocabulary when the request was added."""
    upload = upload or HostUpload()
    for i, row in enumerate(rows):
        params = row.params
        if not params.has_logit_edits:
            continue
        allowed, bias_ids, bias_values = _edit_tensors(row, upload, logits.device)
        if allowed is not None:
            kept = logits[i].index_select(0, allowed)
            logits[i].fill_(float("-inf")).index_copy_(0, allowed, kept)
        if bias_ids is not None:
            logits[i].index_add_(0, bias_ids, bias_values.to(logits.dtype))
        if params.bad_words_token_ids is not None:
            banned = banned_last_tokens(params.bad_words_token_ids, row.output_token_ids)
            if banned:
                logits[i].index_fill_(0, upload(banned, torch.long, logits.device), float("-inf"))
    return logits


def apply_min_tokens(logits: torch.Tensor, rows: list[SamplingRow], upload: HostUpload | None = None) -> torch.Tensor:
    upload = upload or HostUpload()
    for i, row in enumerate(rows):
        params = row.params
        if row.num_output_tokens < params.min_tokens:
            banned = set(params.stop_token_ids)
            if not params.ignore_eos:
                banned |= row.eos_token_ids
            banned_ids = sorted(t for t in banned if t < logits.shape[-1])
            if banned_ids:
                logits[i].index_fill_(0, upload(banned_ids, torch.long, logits.device), float("-inf"))
    return logits


@dataclass
class Truncation:
    """Per-row top-k, top-p, min-p (0 / 1 / 0 disable), with host-side flags
    saying which apply at all (so no device value is read to decide)."""

    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    any_top_k: bool = True
    any_top_p: bool = True
    any_min_p: bool = True


def truncate_distribution(logits: torch.Tensor, truncation: Truncation) -> torch.Tensor:
    """Mask logits outside top-k, top-p and min-p."""
    vocab_size = logits.shape[-1]
    top_k, top_p, min_p = truncation.top_k, truncation.top_p, truncation.min_p
    if truncation.any_top_k:
        k = torch.where(top_k > 0, top_k, vocab_size).clamp(max=vocab_size)
        kth = torch.sort(logits, dim=-1, descending=True).values.gather(1, (k - 1).long()[:, None])
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if truncation.any_top_p:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # Drop the low tail whose total mass is <= 1 - top_p; always keep the top token.
        drop = cumulative <= (1 - top_p)[:, None]
        drop[:, -1] = False
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(1, order, drop), float("-inf"))
    if truncation.any_min_p:
        probs = logits.softmax(dim=-1)
        threshold = probs.max(dim=-1, keepdim=True).values * min_p[:, None]
        logits = logits.masked_fill(probs < threshold, float("-inf"))
    return logits


def sampling_probs(logits: torch.Tensor, params: list[SamplingParams], upload: HostUpload) -> torch.Tensor:
    """Each row's distribution to draw from: its logits over its
    temperature, truncated by its top-k, top-p and min-p, softmaxed."""
    return processed_logits(logits, params, upload).softmax(dim=-1)


def processed_logits(logits: torch.Tensor, params: list[SamplingParams], upload: HostUpload) -> torch.Tensor:
    """Each row's logits over its temperature, truncated by its top-k, top-p and min-p."""
    device = logits.device
    scaled = logits / upload([p.temperature for p in params], torch.float32, device)[:, None]
    # top_k >= the vocabulary keeps everything; clamping keeps huge values inside int64 tensors.
    top_k = [min(p.top_k, logits.shape[-1]) for p in params]
    truncation = Truncation(
        upload(top_k, torch.long, device),
        upload([p.top_p for p in params], torch.float32, device),
        upload([p.min_p for p in params], torch.float32, device),
        any_top_k=any(k > 0 for k in top_k),
        any_top_p=any(p.top_p < 1.0 for p in params),
        any_min_p=any(p.min_p > 0 for p in params),
    )
    return truncate_distribution(scaled, truncation)


class Sampler:
    def __init__(self, seed: int = 0, pin_memory: bool = False, logprobs_mode: str = "raw_logprobs") -> None:
        self.seed = seed
        self.logprobs_mode = logprobs_mode
        self.upload = HostUpload(pin_memory)
        self._generators: dict[torch.device, torch.Generator] = {}

    def generator(self, device: torch.device) -> torch.Generator:
        """The unseeded rows' random stream for ``device`` (seeded by the engine's seed)."""
        if device not in self._generators:
            self._generators[device] = torch.Generator(device=random_device(device)).manual_seed(self.seed)
        return self._generators[device]

    def __call__(
        self, logits: torch.Tensor, rows: list[SamplingRow], allowed: AllowedTokens | None = None
    ) -> tuple[list[int], list[TokenLogprobs | None]]:
        return self.sample(logits, rows, allowed).to_host()

    def sample(self, logits: torch.Tensor, rows: list[SamplingRow], allowed: AllowedTokens | None = None) -> SampledBatch:
        """Sample every row, leaving the results on the device (no host sync);
        ``allowed`` holds the grammar masks of constrained rows."""
        num_top = [row.params.logprobs for row in rows]
        if all(_is_plain_greedy(row) for row in rows):
            # The common serving case: one argmax.
            if allowed is not None:
                logits = apply_token_bitmask_(logits, allowed)
            return SampledBatch(logits.argmax(dim=-1), num_top)
        logits = logits.to(torch.float32)
        want_logprobs = any(n is not None for n in num_top)
        raw = want_logprobs and self.logprobs_mode.startswith("raw")
        reported = report_values(logits, self.logprobs_mode) if raw else None
        logits = apply_logit_edits(logits.clone(), rows, self.upload)
        logits = apply_min_tokens(logits, rows, self.upload)
        logits = apply_penalties(logits, rows, self.upload)
        if allowed is not None:
            logits = apply_token_bitmask_(logits, allowed)
        token_ids, processed = self._sample(logits, rows)
        sampled = SampledBatch(token_ids, num_top)
        if want_logprobs and not raw:
            reported = report_values(processed, self.logprobs_mode)
        if reported is not None:
            fill_logprobs(sampled, reported)
        return sampled

    def _sample(self, logits: torch.Tensor, rows: list[SamplingRow]) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's token, and the logits it was chosen from (a random row's
        over its temperature and truncated)."""
        greedy = logits.argmax(dim=-1)
        random_rows = [i for i, row in enumerate(rows) if not row.params.is_greedy]
        if not random_rows:
            return greedy, logits
        device, upload = logits.device, self.upload
        index = upload(random_rows, torch.long, device)
        params = [rows[i].params for i in random_rows]
        truncated = processed_logits(logits[index], params, upload)
        probs = truncated.softmax(dim=-1)
        source = random_device(device)
        race = torch.empty(probs.shape, device=source).exponential_(generator=self.generator(device))
        for j, i in enumerate(random_rows):
            seed = rows[i].params.seed
            if seed is not None:
                row_generator = torch.Generator(device=source).manual_seed(_seed_for(seed, rows[i].num_output_tokens))
                race[j] = torch.empty(probs.shape[-1], device=source).exponential_(generator=row_generator)
        race = race.to(device)
        choice = (probs / race).argmax(dim=-1)
        return greedy.index_copy(0, index, choice), logits.index_copy(0, index, truncated)


def _is_plain_greedy(row: SamplingRow) -> bool:
    min_tokens = row.params.min_tokens
    return row.greedy_without_extras and (min_tokens == 0 or row.num_output_tokens >= min_tokens)


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
