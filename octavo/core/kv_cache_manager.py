"""Per-request block tables on top of the block pool.

Block tables are append-only: a running request only ever gains blocks, and
loses all of them at once when it finishes or is preempted. The prefix cache
lookup returns the longest run of cached full blocks at the head of a
request, never the whole request: at least one token must be computed so
that the model produces logits to sample from.
"""

from __future__ import annotations

from dataclasses import dataclass

from octavo.core.block_pool import BlockPool, KVCacheBlock
from octavo.core.request import Request
from octavo.core.types import BlockId, RequestId


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class PrefixCacheStats:
    """Token counters: ``hits / queries`` is the prefix-cache hit rate."""

    num_queries: int = 0
    num_hits: int = 0
    num_requests: int = 0

    @property
    def hit_rate(self) -> float:
        return self.num_hits / self.num_queries if self.num_queries else 0.0


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks, enable_caching=enable_prefix_caching)
        self.req_to_blocks: dict[RequestId, list[KVCacheBlock]] = {}
        # How many of a request's blocks are already in the hash index.
        self._num_cached_blocks: dict[RequestId, int] = {}
        self.prefix_cache_stats = PrefixCacheStats()

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    def usage(self) -> float:
        return self.pool.usage()

    def num_blocks_for(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The cached blocks at the head of ``request`` and the tokens they cover."""
        if not self.enable_prefix_caching or request.is_pooling or request.sampling_params.prompt_logprobs is not None:
            # Prompt logprobs need logits for every prompt position, and a
            # pooled vector may need every position's hidden state.
            return [], 0
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hit_blocks: list[KVCacheBlock] = []
        for block_hash in request.block_hashes[:max_hit_blocks]:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            hit_blocks.append(block)
        num_hit_tokens = len(hit_blocks) * self.block_size
        self.prefix_cache_stats.num_requests += 1
        self.prefix_cache_stats.num_queries += request.num_tokens
        self.prefix_cache_stats.num_hits += num_hit_tokens
        return hit_blocks, num_hit_tokens

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: list[KVCacheBlock] | None = None,
    ) -> list[KVCacheBlock] | None:
        """Make room for ``num_new_tokens`` more tokens of ``request``.

        ``new_computed_blocks`` are prefix-cache hits being attached to a
        request that is starting (or resuming). Returns the newly allocated
        blocks, or ``None`` (and changes nothing) when there are not enough.
        """
        blocks = self.req_to_blocks.get(request.request_id, [])
        if not new_computed_blocks and request.num_computed_tokens + num_new_tokens <= len(blocks) * self.block_size:
            return []  # the common decode step: the last block still has room
        computed = new_computed_blocks or []
        num_computed_tokens = request.num_computed_tokens + len(computed) * self.block_size
        num_required = self.num_blocks_for(num_computed_tokens + num_new_tokens)
        num_new_blocks = num_required - len(blocks) - len(computed)
        # Cache hits that sit idle in the free queue are taken out of it.
        num_idle_hits = sum(1 for block in computed if block.ref_count == 0)
        if num_new_blocks + num_idle_hits > self.pool.num_free_blocks:
            return None
        self.pool.touch(computed)
        new_blocks = self.pool.get_new_blocks(max(num_new_blocks, 0))
        table = self.req_to_blocks.setdefault(request.request_id, [])
        table.extend(computed)
        table.extend(new_blocks)
        if computed:
            self._num_cached_blocks[request.request_id] = len(computed)
        return new_blocks

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Enter the request's newly computed full blocks into the prefix cache."""
        if not self.enable_prefix_caching:
            return
        start = self._num_cached_blocks.get(request.request_id, 0)
        if num_computed_tokens // self.block_size <= start:
            return  # no block became full since the last call
        blocks = self.req_to_blocks.get(request.request_id, [])
        num_full = min(num_computed_tokens // self.block_size, len(request.block_hashes), len(blocks))
        for index in range(start, num_full):
            self.pool.cache_block(blocks[index], request.block_hashes[index])
        self._num_cached_blocks[request.request_id] = max(start, num_full)

    def free(self, request: Request) -> None:
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self._num_cached_blocks.pop(request.request_id, None)
        self.pool.free_blocks(reversed(blocks))

    def block_ids(self, request_id: RequestId, start: int = 0) -> list[BlockId]:
        """The request's block ids from index ``start`` on."""
        return [block.block_id for block in self.req_to_blocks.get(request_id, [])[start:]]

    def num_request_blocks(self, request_id: RequestId) -> int:
        return len(self.req_to_blocks.get(request_id, ()))

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()
