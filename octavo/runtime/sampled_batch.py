"""A step's samples on the device (``SampledBatch``), and what ``logprobs``
report of them (vLLM's ``logprobs_mode``, ``runtime/sampler.py`` says which
values each mode reads)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo.core.scheduler_output import TokenLogprobs

LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")
# Reported for -inf (a token a step excluded): vLLM's value, since JSON has no infinity.
EXCLUDED_LOGPROB = -9999.0


def report_values(logits: torch.Tensor, mode: str) -> torch.Tensor:
    """What ``logprobs`` reports for rows of (raw or processed) logits."""
    values = logits if mode.endswith("_logits") else torch.log_softmax(logits, dim=-1)
    return values.clamp(min=EXCLUDED_LOGPROB)


@dataclass
class SampledBatch:
    """A batch's samples, still on the device (``to_host`` waits for them)."""

    token_ids: torch.Tensor  # [num_rows] int64
    # Logprob rows only when some row asked: the chosen token's logprob and
    # rank, and the ``max_top`` most likely (values, ids), per row.
    num_top: list[int | None]
    chosen_logprobs: torch.Tensor | None = None
    chosen_ranks: torch.Tensor | None = None
    top_logprobs: torch.Tensor | None = None
    top_token_ids: torch.Tensor | None = None

    def tensors(self) -> list[torch.Tensor]:
        extra = [self.chosen_logprobs, self.chosen_ranks, self.top_logprobs, self.top_token_ids]
        return [self.token_ids, *(t for t in extra if t is not None)]

    def to_host(self, host: list[torch.Tensor] | None = None) -> tuple[list[int], list[TokenLogprobs | None]]:
        """Token ids and logprobs as Python values; ``host``: copies of
        ``tensors()`` already made (asynchronously) into host memory."""
        if host is None:
            host = [t.cpu() for t in self.tensors()]
        token_ids = host[0].tolist()
        logprobs: list[TokenLogprobs | None] = [None] * len(token_ids)
        if self.chosen_logprobs is None:
            return token_ids, logprobs
        chosen, ranks, top_values, top_ids = (h.tolist() for h in host[1:])
        for i, num_top in enumerate(self.num_top):
            if num_top is None:
                continue
            logprobs[i] = TokenLogprobs(
                token_ids=[token_ids[i], *top_ids[i][:num_top]],
                logprobs=[chosen[i], *top_values[i][:num_top]],
                ranks=[ranks[i], *range(1, num_top + 1)],
            )
        return token_ids, logprobs


def fill_logprobs(sampled: SampledBatch, values: torch.Tensor) -> None:
    """Each row's chosen token's value and rank, and the top ones, from ``values`` (``report_values``)."""
    chosen = values.gather(1, sampled.token_ids[:, None])
    sampled.chosen_logprobs = chosen[:, 0]
    sampled.chosen_ranks = (values > chosen).sum(dim=-1) + 1
    top = torch.topk(values, max(n or 0 for n in sampled.num_top), dim=-1)
    sampled.top_logprobs, sampled.top_token_ids = top.values, top.indices
