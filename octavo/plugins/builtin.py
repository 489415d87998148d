"""The built-in plugin: Octavo's own platforms, models and quantization
methods, registered through the same entry point group as a vendor's."""

from __future__ import annotations

from octavo.plugins import API_VERSION, hookimpl

OCTAVO_PLUGIN_API_VERSION = API_VERSION


@hookimpl
def octavo_platforms():
    from octavo.platforms.cpu import CpuPlatform

    return [CpuPlatform]


@hookimpl
def octavo_models():
    return {
        "LlamaForCausalLM": "octavo.models.llama:LlamaForCausalLM",
        "MistralForCausalLM": "octavo.models.mistral:MistralForCausalLM",
        "Qwen2ForCausalLM": "octavo.models.qwen2:Qwen2ForCausalLM",
        "Qwen3ForCausalLM": "octavo.models.qwen3:Qwen3ForCausalLM",
    }


@hookimpl
def octavo_attention_backends():
    from octavo.runtime.attention.torch_paged import TorchPagedAttention

    return {TorchPagedAttention.name: TorchPagedAttention}
