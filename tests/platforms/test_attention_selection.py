"""Attention backends are looked up by name through the plugin hook, in the
platform's order of preference, with torch_paged as the logged fallback and
OCTAVO_ATTENTION_BACKEND as an override."""

from __future__ import annotations

import logging

import pytest
import torch

from octavo.core.attention import AttentionSpec
from octavo.errors import InvalidArgumentError, PlatformError
from octavo.platforms.attention_selection import choose_attention_backend
from octavo.platforms.cpu import CpuPlatform
from octavo.platforms.cuda import CudaPlatform
from octavo.platforms.tpu import TpuPlatform
from octavo.runtime.attention.static_paged import StaticPagedAttention
from octavo.runtime.attention.torch_paged import TorchPagedAttention

SPEC = AttentionSpec(8, 2, 64, 0.125, torch.float32, torch.float32, 16)
GOOD = 'OCTAVO_PLUGIN_API_VERSION = "1.0"\n'

# A fast backend a kernel plugin might register; it refuses head sizes over 128.
FAST_BACKEND = GOOD + """
from octavo.runtime.attention.torch_paged import TorchPagedAttention

class TritonPaged(TorchPagedAttention):
    name = "triton_paged"

    @classmethod
    def supports(cls, spec):
        return "head_size > 128" if spec.head_size > 128 else None

@hookimpl
def octavo_attention_backends():
    return {"triton_paged": TritonPaged}
"""


def test_builtin_platforms_resolve_their_backends(fresh_plugins):
    assert type(CpuPlatform().attention_backend(SPEC)) is TorchPagedAttention
    from octavo.runtime.attention.triton_sdpa_prefill import TritonSdpaPrefillAttention

    assert type(CudaPlatform().attention_backend(SPEC)) is TritonSdpaPrefillAttention
    assert type(TpuPlatform().attention_backend(SPEC)) is StaticPagedAttention


def test_a_registered_backend_first_in_the_list_is_used(sandbox, monkeypatch):
    sandbox.add("kernels", FAST_BACKEND)
    monkeypatch.setattr(CudaPlatform, "attention_backends", ("triton_paged", "torch_paged"))
    choice = choose_attention_backend(CudaPlatform(), SPEC)
    assert choice.backend_class.name == "triton_paged"
    assert choice.reason == "preferred by cuda" and choice.skipped == []


def test_refusal_falls_back_to_torch_paged_with_a_logged_reason(sandbox, monkeypatch, caplog):
    sandbox.add("kernels", FAST_BACKEND)
    monkeypatch.setattr(CudaPlatform, "attention_backends", ("triton_paged", "torch_paged"))
    big_heads = AttentionSpec(8, 2, 256, 0.0625, torch.float32, torch.float32, 16)
    with caplog.at_level(logging.WARNING):
        backend = CudaPlatform().attention_backend(big_heads)
    assert type(backend) is TorchPagedAttention
    assert "cuda: not using attention backend triton_paged (head_size > 128)" in caplog.messages


def test_a_missing_preferred_backend_falls_back(fresh_plugins, monkeypatch, caplog):
    monkeypatch.setattr(CudaPlatform, "attention_backends", ("flash_attn",))
    with caplog.at_level(logging.WARNING):
        choice = choose_attention_backend(CudaPlatform(), SPEC)
    assert choice.backend_class is TorchPagedAttention
    assert choice.reason == "fallback on cuda" and choice.skipped == ["flash_attn (not installed)"]


def test_override_by_environment(fresh_plugins, monkeypatch):
    monkeypatch.setenv("OCTAVO_ATTENTION_BACKEND", "static_paged")
    choice = choose_attention_backend(CpuPlatform(), SPEC)
    assert choice.backend_class is StaticPagedAttention
    assert choice.reason == "requested by OCTAVO_ATTENTION_BACKEND"


def test_override_scoped_to_a_platform(fresh_plugins, monkeypatch):
    monkeypatch.setenv("OCTAVO_ATTENTION_BACKEND", "cuda:triton_paged,cpu:static_paged")
    assert choose_attention_backend(CpuPlatform(), SPEC).backend_class is StaticPagedAttention
    monkeypatch.setenv("OCTAVO_ATTENTION_BACKEND", "cuda:triton_paged")  # not for this platform: its preference
    assert choose_attention_backend(CpuPlatform(), SPEC).backend_class is TorchPagedAttention
    monkeypatch.setenv("OCTAVO_ATTENTION_BACKEND", "static_paged,cpu:torch_paged")  # scoped wins over unscoped
    assert choose_attention_backend(CpuPlatform(), SPEC).backend_class is TorchPagedAttention
    monkeypatch.setenv("OCTAVO_ATTENTION_BACKEND", "static_paged,torch_paged")
    with pytest.raises(InvalidArgumentError, match="several values without a platform prefix"):
        choose_attention_backend(CpuPlatform(), SPEC)


def test_override_with_an_unknown_backend_fails(fresh_plugins, monkeypatch):
    monkeypatch.setenv("OCTAVO_ATTENTION_BACKEND", "flash")
    with pytest.raises(PlatformError) as excinfo:
        CpuPlatform().attention_backend(SPEC)
    assert excinfo.value.message == (
        "OCTAVO_ATTENTION_BACKEND='flash': no such attention backend (installed: static_paged, torch_paged, triton_paged, "
        "triton_sdpa_prefill)"
    )


def test_override_that_refuses_the_model_fails(sandbox, monkeypatch):
    sandbox.add("kernels", FAST_BACKEND)
    monkeypatch.setenv("OCTAVO_ATTENTION_BACKEND", "triton_paged")
    big_heads = AttentionSpec(8, 2, 256, 0.0625, torch.float32, torch.float32, 16)
    with pytest.raises(PlatformError, match=r"OCTAVO_ATTENTION_BACKEND='triton_paged' cannot run this model: head_size > 128"):
        CpuPlatform().attention_backend(big_heads)


def test_no_backend_at_all_lists_every_reason(fresh_plugins):
    bad = AttentionSpec(6, 4, 64, 0.125, torch.float32, torch.float32, 16)
    with pytest.raises(PlatformError) as excinfo:
        TpuPlatform().attention_backend(bad)
    reason = "num_heads (6) is not a multiple of num_kv_heads (4)"
    assert excinfo.value.message == (
        f"no attention backend on tpu can run this model (static_paged ({reason}); torch_paged ({reason}))"
    )
