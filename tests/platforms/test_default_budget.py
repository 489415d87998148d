"""The step token budget a platform picks when the user sets none."""

from __future__ import annotations

import types

import pytest
import torch

from octavo.platforms.cpu import CpuPlatform
from octavo.platforms.cuda import CudaPlatform


@pytest.mark.parametrize(("total_gib", "budget"), [(141, 8192), (80, 8192), (70, 8192), (48, 2048), (24, 2048)])
def test_cuda_budget_follows_device_memory(monkeypatch, total_gib, budget):
    asked = []

    def properties(index):
        asked.append(index)
        return types.SimpleNamespace(total_memory=total_gib << 30)

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    assert CudaPlatform().default_max_num_batched_tokens() == budget
    assert asked == [0]


def test_cpu_keeps_the_small_budget():
    assert CpuPlatform().default_max_num_batched_tokens() == 2048
