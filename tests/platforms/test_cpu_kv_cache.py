"""The CPU platform's default KV cache: sized from max_num_seqs x max_model_len
(not a fixed 4 GiB), capped at half the free memory, and committed lazily."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from octavo.platforms.cpu import CpuPlatform, requested_kv_cache_bytes


def _config(max_num_seqs: int, max_model_len: int, block_size: int = 16):
    return SimpleNamespace(max_num_seqs=max_num_seqs, max_model_len=max_model_len, block_size=block_size)


def test_default_budget_is_what_max_num_seqs_full_sequences_need(monkeypatch):
    monkeypatch.delenv("OCTAVO_CPU_KVCACHE_SPACE", raising=False)
    runner = SimpleNamespace(config=_config(max_num_seqs=3, max_model_len=100), kv_bytes_per_block=lambda: 4096)
    # 3 sequences x ceil(100 / 16) = 7 blocks each, 4 KiB a block.
    assert CpuPlatform().kv_cache_budget(runner, 0.9) == 3 * 7 * 4096
    monkeypatch.setenv("OCTAVO_CPU_KVCACHE_SPACE", "0.5")
    assert CpuPlatform().kv_cache_budget(runner, 0.9) == 1 << 29


def test_default_budget_is_capped_at_half_the_free_memory():
    config = _config(max_num_seqs=256, max_model_len=4096)
    assert requested_kv_cache_bytes(config, bytes_per_block=1 << 20, free_bytes=8 << 30) == 4 << 30
    assert requested_kv_cache_bytes(config, bytes_per_block=1 << 10, free_bytes=8 << 30) == 256 * 256 << 10


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmRSS:"))
    return int(line.split()[1]) << 10


def test_kv_cache_memory_is_committed_only_as_it_is_written():
    before = _rss_bytes()
    cache = CpuPlatform().allocate_kv_cache((2, 4096, 16, 8, 64), torch.float32, torch.device("cpu"))  # 256 MiB
    assert cache.shape == (2, 4096, 16, 8, 64) and cache.dtype == torch.float32
    assert _rss_bytes() - before < 64 << 20
    assert not cache[:, ::511].any()
    cache[0, 7] = 1.0
    assert cache.sum() == 16 * 8 * 64


def test_a_first_write_commits_a_small_page_not_a_huge_one():
    # With transparent huge pages each layer's first write faulted in (and
    # zeroed) 2 MiB: 0.1-0.2 s of a first token on a 2-core VM.
    cache = CpuPlatform().allocate_kv_cache((2, 4096, 16, 8, 64), torch.float32, torch.device("cpu"))
    before = _rss_bytes()
    cache[0, 0, 0, 0, 0] = 1.0
    cache[1, 4095, 15, 7, 63] = 2.0
    assert _rss_bytes() - before < 1 << 20
    assert cache[0, 0, 0, 0, 0] == 1.0 and cache[1, 4095, 15, 7, 63] == 2.0 and cache.sum() == 3.0
