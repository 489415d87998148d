"""Shared fixtures of the model tests: pooling checkpoints (one per
architecture, built on first use), and one torch thread for the family
tests (their matmuls are tiny, and on a shared 2-core machine a second
intra-op thread only contends: they ran many times slower with two)."""

from __future__ import annotations

import pytest
import torch

from tests.models.pooling_checkpoints import POOLING_ARCHS, build_pooling_checkpoint, build_wordpiece_tokenizer


@pytest.fixture(scope="session")
def wordpiece_dir(tmp_path_factory):
    return build_wordpiece_tokenizer(tmp_path_factory.mktemp("wordpiece"))


@pytest.fixture(scope="session")
def pooling_dirs(tmp_path_factory, wordpiece_dir, tokenizer_dir):
    """``pooling_dirs(name)`` -> the checkpoint directory of ``POOLING_ARCHS[name]``."""
    root = tmp_path_factory.mktemp("pooling")
    built = {}

    def get(name: str):
        if name not in built:
            tokenizer = wordpiece_dir if POOLING_ARCHS[name][4] else tokenizer_dir
            built[name] = build_pooling_checkpoint(root / name, name, tokenizer)
        return built[name]

    return get


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
