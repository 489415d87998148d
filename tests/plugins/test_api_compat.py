"""A plugin written for plugin API 1.0 keeps loading and running on 1.1:
its platform, its attention backend with the seven-argument
``forward_with_rotary`` of 1.0, its ``optimize_model`` and
``kv_cache_budget(runner, ...)`` reading the 1.0 runner."""

from __future__ import annotations

from octavo import SamplingParams
from octavo.plugins.manager import broken_plugins, reset_plugin_manager

LEGACY_PLUGIN = '''
OCTAVO_PLUGIN_API_VERSION = "1.0"
from octavo.ops.reference import rotary_embedding
from octavo.platforms.cpu import CpuPlatform
from octavo.runtime.attention.torch_paged import TorchPagedAttention


class LegacyFusedPaged(TorchPagedAttention):
    name = "legacy_fused_paged"
    fuses_rotary = True
    calls = 0

    def forward_with_rotary(self, query, key, value, kv_cache, metadata, positions, cos_sin_cache):
        LegacyFusedPaged.calls += 1
        query, key = rotary_embedding(positions, query, key, cos_sin_cache)
        return self.forward(query, key, value, kv_cache, metadata)


class LegacyPlatform(CpuPlatform):
    name = "legacy"
    priority = -1
    attention_backends = ("legacy_fused_paged",)
    optimized = []

    def optimize_model(self, model):
        self.optimized.append(type(model).__name__)

    def kv_cache_budget(self, runner, memory_utilization):
        return 64 * runner.kv_bytes_per_block()


@hookimpl
def octavo_platforms():
    return [LegacyPlatform]


@hookimpl
def octavo_attention_backends():
    return {"legacy_fused_paged": LegacyFusedPaged}
'''


def test_a_1_0_plugin_loads_and_runs(sandbox, llama_dir, make_llm):
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    expected = make_llm(llama_dir).generate([[5, 6, 7, 8]], params)[0].outputs[0].token_ids
    sandbox.add("legacy_plugin", LEGACY_PLUGIN)
    reset_plugin_manager()
    llm = make_llm(llama_dir, platform="legacy")
    from legacy_plugin import LegacyFusedPaged, LegacyPlatform

    assert llm.generate([[5, 6, 7, 8]], params)[0].outputs[0].token_ids == expected
    assert broken_plugins() == []
    assert LegacyFusedPaged.calls == 5 * 2  # 5 steps x 2 layers, through its 1.0 method
    assert LegacyPlatform.optimized == ["LlamaForCausalLM"]
    assert llm.engine.scheduler.kv.num_blocks == 64
