"""Quantized weights split for tensor parallelism, checked one rank at a time.

Each rank's layers are built in this one process with its tensor-parallel
group faked (rank r of 2; no collective is run): the loaders must give rank
r exactly its slice -- q/k/v and gate/up rows of each shard for column-
parallel layers, input columns (and groups, and ggml blocks) for row-parallel
ones. Effective weights (the layer applied to the identity) are compared
with the matching slice of the whole layer's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from octavo.distributed.parallel_state import GroupInfo, reset_groups, set_groups
from octavo.models.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from tests.quantization import packers
from tests.quantization.gguf_writer import quantize

HIDDEN, INTER, HEADS, KV_HEADS, HEAD = 128, 256, 4, 2, 32
TP = 2


def _gptq(w):
    return packers.pack_gptq(w, 32, sym=False, v2=True)


def _awq(w):
    return packers.pack_awq(w, 32)


def _fp8(w):
    packed = packers.fp8_pack(per_tensor=True)("m", w)
    dq = packed.pop("_dequantized")
    return packers.Int4Packed(packed, dq, None)


def _gguf(w):
    raw = quantize(w, "Q8_0")
    import gguf

    dq = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0)
    return packers.Int4Packed({"qweight": torch.from_numpy(raw)}, dq.astype(np.float32), None)


FORMATS = {
    "gptq": ({"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "checkpoint_format": "gptq_v2"}, _gptq),
    "awq": ({"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm"}, _awq),
    "fp8": ({"quant_method": "fp8", "activation_scheme": "dynamic"}, _fp8),
    "gguf": (None, _gguf),
}


def _config(name):
    from octavo.quantization.registry import build_quant_config

    if name == "gguf":
        from octavo.quantization.gguf import GGUFConfig

        names = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "down_proj")
        return GGUFConfig({f"l.{n}": "Q8_0" for n in names})
    return build_quant_config(None, FORMATS[name][0], None)


def _effective(layer, in_features):
    out = layer.quant_method.apply(layer, torch.eye(in_features))
    return out.t()


def _load(layer, packed_shards):
    params = dict(layer.named_parameters())
    for shard_id, packed in packed_shards:
        for suffix, value in packed.tensors.items():
            tensor = value if isinstance(value, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(value))
            param = params[suffix]
            if shard_id is None:
                param.weight_loader(param, tensor)
            else:
                param.weight_loader(param, tensor, shard_id)
    layer.quant_method.process_weights_after_loading(layer)


@pytest.fixture(autouse=True)
def _reset_groups():
    yield
    reset_groups()


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_each_rank_gets_its_slice(fmt):
    rng = np.random.default_rng(0)
    weights = {
        "q": rng.normal(0, 0.1, (HEADS * HEAD, HIDDEN)).astype(np.float32),
        "k": rng.normal(0, 0.1, (KV_HEADS * HEAD, HIDDEN)).astype(np.float32),
        "v": rng.normal(0, 0.1, (KV_HEADS * HEAD, HIDDEN)).astype(np.float32),
        0: rng.normal(0, 0.1, (INTER, HIDDEN)).astype(np.float32),
        1: rng.normal(0, 0.1, (INTER, HIDDEN)).astype(np.float32),
        "down": rng.normal(0, 0.1, (HIDDEN, INTER)).astype(np.float32),
    }
    pack = FORMATS[fmt][1]
    packed = {key: pack(w) for key, w in weights.items()}
    meaning = {key: torch.from_numpy(p.dequantized) for key, p in packed.items()}
    for rank in range(TP):
        set_groups(GroupInfo(rank=rank, world_size=TP), GroupInfo())
        config = _config(fmt)
        qkv = QKVParallelLinear(HIDDEN, HEAD, HEADS, KV_HEADS, quant_config=config, prefix="l.qkv_proj")
        gate_up = MergedColumnParallelLinear(HIDDEN, [INTER, INTER], quant_config=config, prefix="l.gate_up_proj")
        down = RowParallelLinear(INTER, HIDDEN, quant_config=config, prefix="l.down_proj")
        _load(qkv, [(s, packed[s]) for s in ("q", "k", "v")])
        _load(gate_up, [(s, packed[s]) for s in (0, 1)])
        _load(down, [(None, packed["down"])])

        def rows(key, size):
            return meaning[key][rank * size : (rank + 1) * size]

        q_rows, kv_rows, inter_rows = HEADS * HEAD // TP, KV_HEADS * HEAD // TP, INTER // TP
        expected_qkv = torch.cat([rows("q", q_rows), rows("k", kv_rows), rows("v", kv_rows)])
        torch.testing.assert_close(_effective(qkv, HIDDEN), expected_qkv, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(_effective(gate_up, HIDDEN), torch.cat([rows(0, inter_rows), rows(1, inter_rows)]), rtol=1e-5, atol=1e-6)
        expected_down = meaning["down"][:, rank * inter_rows : (rank + 1) * inter_rows]
        torch.testing.assert_close(_effective(down, inter_rows), expected_down, rtol=1e-5, atol=1e-6)
