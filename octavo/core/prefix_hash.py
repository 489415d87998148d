"""Chained hashes of full KV-cache blocks (the prefix-cache key).

The hash of block ``i`` covers the hash of block ``i - 1``, the block's token
ids and the request's extra keys (cache salt, LoRA id, the identifiers of the
images whose placeholder tokens the block holds), so equal hashes mean
equal prefixes. SHA-256 is the default so that one tenant cannot craft a
prompt whose block collides with another tenant's on purpose. Only full
blocks are ever hashed.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Sequence

from octavo.core.types import BlockHash

# The parent of the first block: a fixed value, so that the first block's
# hash is still a function of its tokens alone (plus extra keys).
_ROOT_HASH = BlockHash(hashlib.sha256(b"octavo-prefix-cache-root").digest())


def hash_block(
    parent_hash: BlockHash | None,
    token_ids: Sequence[int],
    extra_keys: bytes = b"",
) -> BlockHash:
    """Hash one full block, chained on its parent's hash."""
    digest = hashlib.sha256()
    digest.update(parent_hash if parent_hash is not None else _ROOT_HASH)
    digest.update(len(extra_keys).to_bytes(4, "little"))
    digest.update(extra_keys)
    digest.update(array("q", token_ids).tobytes())
    return BlockHash(digest.digest())


def extend_block_hashes(
    block_hashes: list[BlockHash],
    token_ids: Sequence[int],
    block_size: int,
    extra_keys: bytes = b"",
    block_keys: Callable[[int, int], bytes] | None = None,
) -> None:
    """Append the hashes of blocks that became full since the last call.
    ``block_keys(start, end)``: more key material for the block of positions
    ``[start, end)`` (the images whose placeholders it holds)."""
    num_full_blocks = len(token_ids) // block_size
    for block_index in range(len(block_hashes), num_full_blocks):
        parent = block_hashes[-1] if block_hashes else None
        start = block_index * block_size
        keys = extra_keys if block_keys is None else extra_keys + block_keys(start, start + block_size)
        block_hashes.append(hash_block(parent, token_ids[start : start + block_size], keys))
