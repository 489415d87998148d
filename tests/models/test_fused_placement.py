"""Fused CPU parameters view the mapped safetensors file where it holds their
shards back to back in order (a Llama's gate_proj then up_proj), and copy
otherwise; the reader's tensors are views of one mapping and equal
safetensors' own."""

from __future__ import annotations

import hashlib

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from octavo.models.layers.linear import MergedColumnParallelLinear, QKVParallelLinear
from octavo.models.loader import iterate_safetensors
from octavo.models.safetensors_map import _view


def _save(tmp_path, tensors: dict[str, torch.Tensor]):
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    return path


def _in_file(param: torch.Tensor, mapped: dict[str, torch.Tensor]) -> bool:
    storage = next(iter(mapped.values())).untyped_storage()
    return param.untyped_storage().data_ptr() == storage.data_ptr()


def test_the_reader_gives_views_of_one_mapping_equal_to_safetensors(tmp_path):
    tensors = {
        "a.f32": torch.randn(3, 5), "b.bf16": torch.randn(7).to(torch.bfloat16), "c.i64": torch.arange(5),
        "d.bool": torch.tensor([True, False, True]), "e.f16": torch.randn(2, 2).half(),
        "f.fp8": torch.randn(4).to(torch.float8_e4m3fn), "g.empty": torch.empty(0, 3),
        "h.u8": torch.arange(3, dtype=torch.uint8),
    }
    path = _save(tmp_path, tensors)
    mapped = dict(iterate_safetensors([path]))
    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():
            expected = f.get_tensor(name)
            assert mapped[name].dtype == expected.dtype and mapped[name].shape == expected.shape
            assert torch.equal(mapped[name].view(torch.uint8), expected.view(torch.uint8)), name
    assert len({t.untyped_storage().data_ptr() for t in mapped.values()}) == 1
    storage = next(iter(mapped.values())).untyped_storage()
    assert _view(storage, 0, {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}) is None  # a dtype it does not know


def _gate_up(tmp_path, names: list[str]):
    gate, up = torch.randn(6, 4), torch.randn(6, 4)
    source = {"mlp.gate_proj.weight": gate, "mlp.up_proj.weight": up, "mlp.down_proj.weight": torch.randn(4, 6)}
    path = _save(tmp_path, source)
    mapped = dict(iterate_safetensors([path]))
    layer = MergedColumnParallelLinear(4, [6, 6], prefix="mlp.gate_up_proj")
    for name in names:
        layer.weight.weight_loader(layer.weight, mapped[name], 0 if "gate" in name else 1)
    return layer.weight, torch.cat([gate, up]), mapped, path


def test_gate_then_up_back_to_back_are_viewed_in_the_file(tmp_path):
    weight, expected, mapped, _ = _gate_up(tmp_path, ["mlp.gate_proj.weight", "mlp.up_proj.weight"])
    assert isinstance(weight, nn.Parameter) and _in_file(weight, mapped)
    assert weight.data_ptr() == mapped["mlp.gate_proj.weight"].data_ptr()
    torch.testing.assert_close(weight.data, expected, rtol=0, atol=0)


def test_up_first_is_copied(tmp_path):
    weight, expected, mapped, _ = _gate_up(tmp_path, ["mlp.up_proj.weight", "mlp.gate_proj.weight"])
    assert not _in_file(weight, mapped)
    torch.testing.assert_close(weight.data, expected, rtol=0, atol=0)


def test_a_shard_elsewhere_moves_the_parameter_out_keeping_the_rows_in_place(tmp_path):
    gate, up, other = torch.randn(6, 4), torch.randn(6, 4), torch.randn(6, 4)
    # Sorted names put "b" between the gate ("a") and the up projection ("c").
    path = _save(tmp_path, {"a.gate": gate, "b.other": other, "c.up": up})
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    mapped = dict(iterate_safetensors([path]))
    layer = MergedColumnParallelLinear(4, [6, 6], prefix="mlp.gate_up_proj")
    layer.weight.weight_loader(layer.weight, mapped["a.gate"], 0)
    assert _in_file(layer.weight, mapped)  # for now: the file might hold up next
    layer.weight.weight_loader(layer.weight, mapped["c.up"], 1)
    assert not _in_file(layer.weight, mapped)
    torch.testing.assert_close(layer.weight.data, torch.cat([gate, up]), rtol=0, atol=0)
    layer.weight.data.add_(1.0)
    torch.testing.assert_close(mapped["b.other"], other, rtol=0, atol=0)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


def test_qkv_in_checkpoint_order_is_copied(tmp_path):
    q, k, v = torch.randn(8, 4), torch.randn(4, 4), torch.randn(4, 4)
    path = _save(tmp_path, {"k_proj": k, "o_proj": torch.randn(4, 8), "q_proj": q, "v_proj": v})
    mapped = dict(iterate_safetensors([path]))
    layer = QKVParallelLinear(4, 2, 4, 2, prefix="qkv_proj")
    for name in ("k_proj", "q_proj", "v_proj"):  # the file's (sorted) order
        layer.weight.weight_loader(layer.weight, mapped[name], name[0])
    assert not _in_file(layer.weight, mapped)
    torch.testing.assert_close(layer.weight.data, torch.cat([q, k, v]), rtol=0, atol=0)


@pytest.mark.parametrize("adoptable", [True, False])
def test_plain_tensors_and_other_dtypes_are_copied(tmp_path, adoptable):
    gate, up = torch.randn(6, 4), torch.randn(6, 4)
    path = _save(tmp_path, {"a.gate": gate.double(), "b.up": up.double()})
    mapped = dict(iterate_safetensors([path]))
    layer = MergedColumnParallelLinear(4, [6, 6], prefix="mlp.gate_up_proj")
    for shard, name in enumerate(("a.gate", "b.up")):
        loaded = mapped[name] if adoptable else mapped[name].clone()
        layer.weight.weight_loader(layer.weight, loaded.float() if not adoptable else loaded, shard)
    assert not _in_file(layer.weight, mapped)
    torch.testing.assert_close(layer.weight.data, torch.cat([gate, up]).double().float(), rtol=0, atol=0)
