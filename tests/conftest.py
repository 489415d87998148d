"""Shared fixtures: one tokenizer and one small checkpoint per architecture,
built once per session; an engine factory; and a check that every engine a
test made ends with all its KV blocks free."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.checkpoints import ARCHITECTURES, FAMILIES, build_chat_checkpoint, build_checkpoint, build_tokenizer

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# No heap freeze per engine (its full collection, ~0.5 s each, over hundreds of engines);
# tests/core/test_gc_heap.py and the pooling step test turn it back on.
os.environ.setdefault("OCTAVO_GC_FREEZE", "0")
# The shared folder sits next to the checkout (/work/main -> /work/shared); a
# worktree one level deeper (/work/wt/NAME) finds it one more level up.
SHARED_LLAMA2_TOKENIZER = next(
    (
        path
        for parent in Path(__file__).resolve().parents[2:4]
        if (path := parent / "shared" / "tokenizers" / "llama2").exists()
    ),
    Path(__file__).resolve().parents[2] / "shared" / "tokenizers" / "llama2",
)


@pytest.fixture
def one_thread():
    """One torch thread: the model tests' matmuls are tiny, and on a shared
    2-core machine a second intra-op thread only contends (many times slower)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="session")
def checkpoint_dirs(tmp_path_factory, tokenizer_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    return {arch: build_checkpoint(root / arch, arch, tokenizer_dir) for arch in ARCHITECTURES}


@pytest.fixture(scope="session")
def family_dir(tmp_path_factory, tokenizer_dir):
    """``family_dir(name)`` -> a small checkpoint of one of ``FAMILIES``, built on first use."""
    root = tmp_path_factory.mktemp("families")
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        assert name in FAMILIES, name
        if name not in built:
            built[name] = build_checkpoint(root / name, name, tokenizer_dir)
        return built[name]

    return get


@pytest.fixture(scope="session")
def llava(tmp_path_factory, tokenizer_dir):
    """A small LLaVA that takes real images: (checkpoint dir, its transformers model, the image token id)."""
    from tests.multimodal.llava_checkpoint import build_llava_checkpoint

    return build_llava_checkpoint(tmp_path_factory.mktemp("llava-images") / "ckpt", tokenizer_dir)


@pytest.fixture(scope="session")
def llama_dir(checkpoint_dirs) -> Path:
    return checkpoint_dirs["llama"]


@pytest.fixture(scope="session")
def llama2_tokenizer_dir() -> Path:
    if not (SHARED_LLAMA2_TOKENIZER / "tokenizer.json").exists():
        pytest.skip(f"the Llama 2 tokenizer is not at {SHARED_LLAMA2_TOKENIZER}")
    return SHARED_LLAMA2_TOKENIZER


@pytest.fixture(scope="session")
def chat_model_dir(tmp_path_factory, llama2_tokenizer_dir) -> Path:
    """A tiny random Llama with the real Llama 2 tokenizer and a tool-calling chat template."""
    return build_chat_checkpoint(tmp_path_factory.mktemp("chat-model"), llama2_tokenizer_dir)


@pytest.fixture
def make_llm():
    """``make_llm(path, **options)`` -> LLM in float32; asserts all blocks free at teardown."""
    from octavo import LLM

    made = []

    def factory(model: Path | str, **options):
        options.setdefault("dtype", "float32")
        options.setdefault("max_model_len", 256)
        options.setdefault("max_num_seqs", 16)
        llm = LLM(str(model), **options)
        made.append(llm)
        return llm

    yield factory
    for llm in made:
        kv = llm.engine.scheduler.kv
        llm.engine.shutdown()
        assert kv.num_free_blocks == kv.num_blocks, f"{kv.num_blocks - kv.num_free_blocks} KV blocks leaked"
