"""Parallel layouts that cannot work are refused before any worker starts,
with a message that says why and what would work; a worker's own typed
error while loading reaches the caller as that type."""

from __future__ import annotations

import multiprocessing
import shutil

import pytest

from octavo import LLM
from octavo.entrypoints.cli.common import add_engine_args, engine_args_from
from octavo.errors import InvalidArgumentError, ModelLoadError
from tests.checkpoints import build_checkpoint
from tests.distributed.common import engine_options


@pytest.fixture(scope="module")
def three_kv_heads_dir(tmp_path_factory, tokenizer_dir):
    # 6 query heads of 16 and 3 KV heads: TP=2 cannot split the KV heads.
    out = tmp_path_factory.mktemp("kv3") / "llama"
    return build_checkpoint(
        out, "llama", tokenizer_dir, hidden_size=96, num_attention_heads=6, num_key_value_heads=3, intermediate_size=192
    )


def test_odd_kv_heads_are_refused_with_a_clear_message(three_kv_heads_dir):
    children = multiprocessing.active_children()
    with pytest.raises(InvalidArgumentError) as info:
        LLM(str(three_kv_heads_dir), **engine_options(tensor_parallel_size=2))
    message = str(info.value)
    assert "tensor_parallel_size=2 cannot split the 3 KV heads of LlamaForCausalLM" in message
    assert "sizes that work: 1, 3, 6" in message
    assert info.value.param == "tensor_parallel_size"
    assert multiprocessing.active_children() == children  # refused before spawning


@pytest.mark.parametrize(
    "options,fragment",
    [
        ({"pipeline_parallel_size": 3}, "pipeline_parallel_size=3 exceeds the 2 layers"),
        ({"tensor_parallel_size": 3}, "tensor_parallel_size=3 does not divide the 4 attention heads"),
        ({"tensor_parallel_size": 2, "distributed_executor_backend": "uni"}, "'uni' runs one device"),
        ({"distributed_executor_backend": "mpi"}, "unknown distributed_executor_backend 'mpi'"),
        ({"data_parallel_size": 0}, "data_parallel_size must be at least 1"),
    ],
)
def test_bad_layouts_are_refused(llama_dir, options, fragment):
    with pytest.raises(InvalidArgumentError, match=fragment):
        LLM(str(llama_dir), **engine_options(**options))


def test_worker_load_error_keeps_its_type(llama_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(llama_dir, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    children = multiprocessing.active_children()
    # One worker process (mp backend at TP=1): the error is raised there.
    with pytest.raises(ModelLoadError, match="could not read model.safetensors"):
        LLM(str(broken), **engine_options(distributed_executor_backend="mp"))
    assert multiprocessing.active_children() == children


def test_cli_flags_reach_engine_args():
    import argparse

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = engine_args_from(
        parser.parse_args(["-tp", "2", "-pp", "2", "-dp", "3", "--distributed-executor-backend", "ray"])
    )
    assert (args.tensor_parallel_size, args.pipeline_parallel_size, args.data_parallel_size) == (2, 2, 3)
    assert args.distributed_executor_backend == "ray"
