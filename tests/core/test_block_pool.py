"""Block pool and prefix cache: exact block ids and eviction order."""

from __future__ import annotations

import pytest

from octavo.core.block_pool import BlockPool
from octavo.core.kv_cache_manager import KVCacheManager
from octavo.core.prefix_hash import hash_block
from octavo.core.request import Request
from octavo.core.sampling_params import SamplingParams
from octavo.core.types import BlockHash, RequestId


def make_request(request_id: str, token_ids: list[int], block_size: int = 4, salt: bytes = b"") -> Request:
    return Request(
        request_id=RequestId(request_id),
        prompt_token_ids=token_ids,
        sampling_params=SamplingParams(max_tokens=4),
        block_size=block_size,
        cache_key=salt,
    )


def test_new_blocks_come_from_the_head_in_id_order():
    pool = BlockPool(6)
    assert [b.block_id for b in pool.get_new_blocks(2)] == [0, 1]
    assert [b.block_id for b in pool.get_new_blocks(3)] == [2, 3, 4]
    assert pool.free_block_ids() == [5]
    with pytest.raises(ValueError):
        pool.get_new_blocks(2)


def test_freed_blocks_go_to_the_tail_in_the_order_given():
    pool = BlockPool(5)
    blocks = pool.get_new_blocks(3)  # 0, 1, 2
    pool.free_blocks(reversed(blocks))
    assert pool.free_block_ids() == [3, 4, 2, 1, 0]


def test_cached_block_keeps_its_hash_until_reallocated():
    pool = BlockPool(2)
    (block,) = pool.get_new_blocks(1)
    block_hash = BlockHash(b"h" * 32)
    pool.cache_block(block, block_hash)
    pool.free_blocks([block])
    assert pool.get_cached_block(block_hash) is block
    # Block 1 is at the head; then block 0 (cached) is handed out and evicted.
    assert [b.block_id for b in pool.get_new_blocks(1)] == [1]
    assert [b.block_id for b in pool.get_new_blocks(1)] == [0]
    assert pool.get_cached_block(block_hash) is None
    assert block.block_hash is None


def test_touch_takes_an_idle_cached_block_out_of_the_free_queue():
    pool = BlockPool(3)
    (block,) = pool.get_new_blocks(1)
    pool.cache_block(block, BlockHash(b"x" * 32))
    pool.free_blocks([block])
    assert pool.free_block_ids() == [1, 2, 0]
    pool.touch([block])
    assert block.ref_count == 1 and pool.free_block_ids() == [1, 2]
    pool.touch([block])  # a second sharer
    pool.free_blocks([block])
    assert block.ref_count == 1 and pool.num_free_blocks == 2
    pool.free_blocks([block])
    assert pool.free_block_ids() == [1, 2, 0]


def test_double_free_is_an_error():
    pool = BlockPool(2)
    (block,) = pool.get_new_blocks(1)
    pool.free_blocks([block])
    with pytest.raises(AssertionError):
        pool.free_blocks([block])


def test_hashes_chain_and_include_extra_keys():
    first = hash_block(None, [1, 2, 3, 4])
    assert hash_block(None, [1, 2, 3, 4]) == first
    assert hash_block(first, [5, 6, 7, 8]) != hash_block(None, [5, 6, 7, 8])
    assert hash_block(None, [1, 2, 3, 4], b"tenant-a") != first
    assert len(first) == 32  # SHA-256


def test_request_hashes_only_full_blocks():
    request = make_request("a", list(range(10)))
    assert len(request.block_hashes) == 2
    request.append_output_token(10)
    request.append_output_token(11)
    assert len(request.block_hashes) == 3
    assert request.block_hashes[1] == hash_block(request.block_hashes[0], [4, 5, 6, 7])


def run_to_completion(kv: KVCacheManager, request: Request) -> None:
    assert kv.allocate_slots(request, request.num_tokens) is not None
    request.num_computed_tokens = request.num_tokens
    kv.cache_blocks(request, request.num_computed_tokens)


def test_prefix_hit_reuses_exact_blocks_and_counts_tokens():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    first = make_request("a", list(range(10)))  # blocks 0, 1 full, 2 partial
    run_to_completion(kv, first)
    assert kv.block_ids(first.request_id) == [0, 1, 2]
    kv.free(first)
    # Freed last-first: the partial block 2 is evicted before the prefix.
    assert kv.pool.free_block_ids() == [3, 4, 5, 6, 7, 2, 1, 0]

    second = make_request("b", list(range(8)) + [99, 98, 97])
    hits, num_hit_tokens = kv.get_computed_blocks(second)
    assert [b.block_id for b in hits] == [0, 1] and num_hit_tokens == 8
    new_blocks = kv.allocate_slots(second, second.num_tokens - num_hit_tokens, hits)
    assert [b.block_id for b in new_blocks] == [3]
    assert kv.block_ids(second.request_id) == [0, 1, 3]
    assert kv.prefix_cache_stats.num_hits == 8
    assert kv.prefix_cache_stats.num_queries == 11


def test_prefix_hit_leaves_at_least_one_token_to_compute():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    first = make_request("a", list(range(8)))
    run_to_completion(kv, first)
    kv.free(first)
    again = make_request("b", list(range(8)))
    hits, num_hit_tokens = kv.get_computed_blocks(again)
    assert num_hit_tokens == 4 and [b.block_id for b in hits] == [0]


def test_salt_separates_tenants():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    first = make_request("a", list(range(9)), salt=b"tenant-a")
    run_to_completion(kv, first)
    kv.free(first)
    other = make_request("b", list(range(9)), salt=b"tenant-b")
    assert kv.get_computed_blocks(other) == ([], 0)


def test_lru_eviction_prefers_least_recently_freed():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    old = make_request("old", [1] * 4 + [2])
    run_to_completion(kv, old)  # blocks 0 (full, cached), 1
    kv.free(old)
    new = make_request("new", [3] * 4 + [4])
    run_to_completion(kv, new)  # blocks 2 (cached), 3
    kv.free(new)
    assert kv.pool.free_block_ids() == [1, 0, 3, 2]
    # A request needing 3 blocks evicts 1, 0 (old's prefix) and 3, keeping new's.
    big = make_request("big", [7] * 9)
    run_to_completion(kv, big)
    assert kv.block_ids(big.request_id) == [1, 0, 3]
    assert kv.pool.get_cached_block(new.block_hashes[0]) is not None
    assert kv.pool.get_cached_block(old.block_hashes[0]) is None


def test_allocation_failure_changes_nothing():
    kv = KVCacheManager(num_blocks=2, block_size=4)
    request = make_request("a", list(range(12)))
    assert kv.allocate_slots(request, 12) is None
    assert kv.num_free_blocks == 2 and kv.block_ids(request.request_id) == []
