"""Shared fixtures of the model tests: pooling checkpoints (one per
architecture, built on first use). ``one_thread`` lives in tests/conftest.py."""

from __future__ import annotations

import pytest

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
