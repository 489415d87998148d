"""How many KV-cache blocks a byte budget buys, and how many the engine allocates.

The two differ on purpose: the engine allocates no more blocks than
``max_num_seqs`` full-length sequences can use (memory it could never fill
stays free), but what the budget *holds* is the figure that compares KV
dtypes honestly. An fp8 cache halves the bytes per block, so the same budget
holds twice the blocks of a bf16 one even when both allocations hit the same
``max_num_seqs * max_model_len`` cap (``benchmarks/quant_e2e.py kv`` reports
``sequences_fit`` for that reason).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KVCachePlan:
    budget_bytes: int
    bytes_per_block: int
    block_size: int  # tokens per block
    budget_blocks: int  # blocks the budget holds
    num_blocks: int  # blocks allocated: budget_blocks capped at what max_num_seqs sequences use

    @property
    def budget_tokens(self) -> int:
        return self.budget_blocks * self.block_size

    def sequences_fit(self, num_tokens: int) -> int:
        """Sequences of ``num_tokens`` tokens the budget holds at once (whole blocks each)."""
        return self.budget_blocks // -(-num_tokens // self.block_size)

    def log(self, max_model_len: int) -> None:
        """Say at start-up what the cache holds, and warn when one sequence of
        ``max_model_len`` tokens would not fit (such requests are refused)."""
        num_tokens = self.num_blocks * self.block_size
        logger.info(
            "KV cache: %d blocks of %d tokens (%d tokens, %.1f MiB): %.2f sequences of max_model_len %d fit "
            "(the budget holds %d blocks)",
            self.num_blocks, self.block_size, num_tokens, self.num_blocks * self.bytes_per_block / 2**20,
            num_tokens / max_model_len, max_model_len, self.budget_blocks,
        )
        if num_tokens < max_model_len:
            logger.warning(
                "the KV cache holds %d tokens, fewer than max_model_len (%d): longer requests will be refused; "
                "lower max_model_len or give the cache more memory", num_tokens, max_model_len,
            )


def plan_kv_cache(
    budget_bytes: int, bytes_per_block: int, block_size: int, max_num_seqs: int, max_model_len: int
) -> KVCachePlan:
    budget_blocks = max(int(budget_bytes // bytes_per_block), 0)
    useful = max_num_seqs * -(-max_model_len // block_size)
    return KVCachePlan(
        budget_bytes=int(budget_bytes), bytes_per_block=bytes_per_block, block_size=block_size,
        budget_blocks=budget_blocks, num_blocks=min(budget_blocks, useful),
    )
