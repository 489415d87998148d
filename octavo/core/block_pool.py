"""The pool of KV-cache blocks, with the prefix cache's hash index.

Invariants:

* A block with ``ref_count == 0`` is in the free queue; a block with
  ``ref_count > 0`` is not.
* The free queue is in LRU order: blocks are taken from its head, freed
  blocks go to its tail. A freed block keeps its hash, so that a later request
  with the same prefix can take it back out of the queue (O(1)) instead of
  recomputing it; it loses the hash only when it is handed out as a new block.
* ``cached_blocks`` maps a hash to the one block that holds it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from octavo.core.types import BlockHash, BlockId


@dataclass(eq=False)
class KVCacheBlock:
    block_id: BlockId
    ref_count: int = 0
    block_hash: BlockHash | None = None

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_count}, cached={self.block_hash is not None})"


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        # Zero blocks: a model that keeps no KV cache (an encoder).
        if num_blocks < 0:
            raise ValueError(f"the number of KV-cache blocks must not be negative, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(BlockId(i)) for i in range(num_blocks)]
        # OrderedDict gives O(1) removal from the middle (cache hits) and
        # O(1) pops from the head (allocation).
        self._free_queue: OrderedDict[BlockId, KVCacheBlock] = OrderedDict(
            (block.block_id, block) for block in self.blocks
        )
        self.cached_blocks: dict[BlockHash, KVCacheBlock] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_queue)

    def free_block_ids(self) -> list[BlockId]:
        """The free queue from head (next to be handed out) to tail."""
        return list(self._free_queue)

    def usage(self) -> float:
        if not self.num_blocks:
            return 0.0
        return 1.0 - self.num_free_blocks / self.num_blocks

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Hand out blocks from the head of the free queue, evicting their hashes."""
        if num_blocks > self.num_free_blocks:
            raise ValueError(f"asked for {num_blocks} blocks with {self.num_free_blocks} free")
        new_blocks = []
        for _ in range(num_blocks):
            _, block = self._free_queue.popitem(last=False)
            self._evict_hash(block)
            block.ref_count = 1
            new_blocks.append(block)
        return new_blocks

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        return self.cached_blocks.get(block_hash)

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on cache-hit blocks (out of the free queue if idle)."""
        for block in blocks:
            if block.ref_count == 0:
                del self._free_queue[block.block_id]
            block.ref_count += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference on each block; idle ones go to the queue's tail.

        Callers pass a request's blocks last-first, so that the tail of a
        sequence is evicted before its (more shareable) head.
        """
        for block in ordered_blocks:
            block.ref_count -= 1
            if block.ref_count < 0:
                raise AssertionError(f"block {block.block_id} freed more often than taken")
            if block.ref_count == 0:
                self._free_queue[block.block_id] = block

    def cache_block(self, block: KVCacheBlock, block_hash: BlockHash) -> None:
        """Record that ``block`` holds the full block with ``block_hash``."""
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self.cached_blocks:
            # Another block computed the same content first; keep that one as
            # the canonical copy and leave this block unhashed.
            return
        block.block_hash = block_hash
        self.cached_blocks[block_hash] = block

    def reset_prefix_cache(self) -> bool:
        """Forget every hash; only allowed while no block is in use."""
        if self.num_free_blocks != self.num_blocks:
            return False
        for block in self.blocks:
            block.block_hash = None
        self.cached_blocks.clear()
        return True

    def _evict_hash(self, block: KVCacheBlock) -> None:
        if block.block_hash is not None:
            if self.cached_blocks.get(block.block_hash) is block:
                del self.cached_blocks[block.block_hash]
            block.block_hash = None
