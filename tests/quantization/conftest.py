"""Fixtures for the quantization tests: small checkpoints built once.

``quant_llama_dir``: a Llama with hidden 128 / intermediate 256 (every
linear input is a multiple of the int4 group sizes 32, 64 and 128).
``gguf_checkpoint_dirs``: one checkpoint per architecture with hidden 256 /
intermediate 512, because K-quant blocks hold 256 values per row.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.checkpoints import ARCHITECTURES, build_checkpoint

QUANT_SHAPE = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
GGUF_SHAPES = {
    "llama": dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "mistral": dict(num_key_value_heads=1),
    "qwen2": dict(),
    # transformers reads no head_dim from qwen3 GGUF metadata and uses Qwen3's 128.
    "qwen3": dict(head_dim=128),
}


@pytest.fixture(scope="session")
def quant_llama_dir(tmp_path_factory, tokenizer_dir) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("quant") / "llama", "llama", tokenizer_dir, **QUANT_SHAPE)


@pytest.fixture(scope="session")
def gguf_checkpoint_dirs(tmp_path_factory, tokenizer_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf-src")
    shape = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)
    return {
        arch: build_checkpoint(root / arch, arch, tokenizer_dir, seed=1, **{**shape, **GGUF_SHAPES[arch]})
        for arch in ARCHITECTURES
    }
