"""Models and attention backends added by a plugin through the same hooks as
the built-in ones."""

from __future__ import annotations

import json
import shutil

from octavo import SamplingParams

MODEL_PLUGIN = '''
OCTAVO_PLUGIN_API_VERSION = "1.0"

@hookimpl
def octavo_models():
    # A vendor's architecture name, served by Octavo's Llama implementation.
    return {"VendorLlamaForCausalLM": "octavo.models.llama:LlamaForCausalLM"}
'''

BACKEND_PLUGIN = '''
OCTAVO_PLUGIN_API_VERSION = "1.0"
from octavo.runtime.attention.torch_paged import TorchPagedAttention

class CountingPaged(TorchPagedAttention):
    name = "counting_paged"
    calls = 0

    def forward(self, *args):
        CountingPaged.calls += 1
        return super().forward(*args)

@hookimpl
def octavo_attention_backends():
    return {"counting_paged": CountingPaged}
'''


def test_a_plugin_adds_a_model_architecture(sandbox, llama_dir, tmp_path, make_llm):
    model_dir = tmp_path / "vendor-llama"
    shutil.copytree(llama_dir, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config["architectures"] = ["VendorLlamaForCausalLM"]
    (model_dir / "config.json").write_text(json.dumps(config))
    sandbox.add("vendor_models", MODEL_PLUGIN)
    llm = make_llm(model_dir)
    reference = make_llm(llama_dir)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    ours = llm.generate([[5, 6, 7, 8]], params)[0].outputs[0].token_ids
    assert ours == reference.generate([[5, 6, 7, 8]], params)[0].outputs[0].token_ids


def test_a_plugin_adds_an_attention_backend_the_user_can_select(sandbox, llama_dir, make_llm, monkeypatch):
    sandbox.add("vendor_backend", BACKEND_PLUGIN)
    monkeypatch.setenv("OCTAVO_ATTENTION_BACKEND", "counting_paged")
    llm = make_llm(llama_dir)
    llm.generate([[5, 6, 7, 8]], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    from vendor_backend import CountingPaged

    assert CountingPaged.calls == 3 * 2  # 3 steps x 2 layers


IMAGE_MODEL_PLUGIN = '''
OCTAVO_PLUGIN_API_VERSION = "1.7"
from octavo.models.llava import LlavaForConditionalGeneration
from octavo.multimodal.layouts import ImageLayout

class VendorVision(LlavaForConditionalGeneration):
    """A vendor's image model: its own layout (here LLaVA's), nothing registered in Octavo."""

    @staticmethod
    def image_layout(multimodal_config, tokenizer):
        VendorVision.layouts_made = getattr(VendorVision, "layouts_made", 0) + 1
        return ImageLayout(multimodal_config["image_token_index"], 16)

@hookimpl
def octavo_models():
    return {"VendorVisionForConditionalGeneration": VendorVision}
'''


def test_a_plugin_model_takes_images_through_the_model_contract(sandbox, llava, tmp_path, make_llm):
    from tests.multimodal.test_llava_images import NEW_TOKENS, _hf_greedy, _prompts

    model_dir = tmp_path / "vendor-vision"
    shutil.copytree(llava[0], model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config["architectures"] = ["VendorVisionForConditionalGeneration"]
    (model_dir / "config.json").write_text(json.dumps(config))
    sandbox.add("vendor_vision", IMAGE_MODEL_PLUGIN)
    llm = make_llm(model_dir, platform="cpu")
    ids, images = _prompts(llava[2])[0]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    output = llm.generate({"prompt_token_ids": ids, "multi_modal_data": {"image": images}}, params)[0]
    assert list(output.outputs[0].token_ids) == _hf_greedy(llava, ids, images)
    from vendor_vision import VendorVision

    assert VendorVision.layouts_made == 1
