"""The ``layer_norm`` op's reference against what it stands for: torch's
``LayerNorm`` (StarCoder 2) and Hugging Face's Cohere norm, whose q/k form
has a weight per head; and Cohere's per-head q/k norm split over
tensor-parallel ranks (each rank the weights of its own heads)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from octavo.ops.reference import layer_norm
from octavo.ops.specs import OP_SPECS


def within_tolerance(ours: torch.Tensor, theirs: torch.Tensor) -> bool:
    tolerance = OP_SPECS["layer_norm"].tolerance[ours.dtype]
    return torch.allclose(ours.float(), theirs.float(), atol=tolerance.atol, rtol=tolerance.rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_is_torch_layer_norm(dtype):
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(96, eps=1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.3)
        norm.bias.normal_(0.0, 0.3)
    x = (torch.randn(7, 96) * 3 + 1.5).to(dtype)
    ours = layer_norm(x, norm.weight.detach(), norm.bias.detach(), 1e-5)
    assert ours.dtype == dtype and within_tolerance(ours, norm(x).detach())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_is_cohere_norm_per_head(dtype):
    from transformers.models.cohere.modeling_cohere import CohereLayerNorm

    torch.manual_seed(0)
    heads, head_dim = 4, 16
    hf = CohereLayerNorm((heads, head_dim), eps=1e-5).to(dtype)
    with torch.no_grad():
        hf.weight.normal_(1.0, 0.3)
    qkv = torch.randn(5, (heads + 2) * head_dim).to(dtype)
    q = qkv[:, : heads * head_dim].view(5, heads, head_dim)  # a strided view of the qkv row, as the layer passes
    ours = layer_norm(q, hf.weight.detach(), None, 1e-5)
    assert within_tolerance(ours, hf(q).detach())


@pytest.mark.parametrize(
    "total_heads,replicas,rank,expected_heads", [(4, 1, 1, [2, 3]), (1, 2, 1, [0]), (2, 1, 0, [0])]
)
def test_head_norm_loads_its_ranks_heads(monkeypatch, total_heads, replicas, rank, expected_heads):
    from octavo.models.layers import layer_norm as module

    monkeypatch.setattr(module, "get_tp_group", lambda: SimpleNamespace(world_size=2, rank=rank))
    norm = module.HeadLayerNorm(total_heads, 8, 1e-5, torch.float32, num_replicas=replicas)
    checkpoint = torch.arange(total_heads * 8, dtype=torch.float32).view(total_heads, 8)
    norm.weight.weight_loader(norm.weight, checkpoint)
    assert torch.equal(norm.weight.data, checkpoint[expected_heads])
