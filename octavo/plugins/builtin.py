"""The built-in plugin: Octavo's own platforms, models, quantization methods,
attention backends and layer-op kernels, registered through the same entry
point group as a vendor's (``octavo.plugins``), with no privileged path."""

from __future__ import annotations

from octavo.plugins import API_VERSION, hookimpl

OCTAVO_PLUGIN_API_VERSION = API_VERSION


@hookimpl
def octavo_platforms():
    from octavo.platforms.builtin import builtin_platforms

    return builtin_platforms()


@hookimpl
def octavo_models():
    return {
        "LlamaForCausalLM": "octavo.models.llama:LlamaForCausalLM",
        "MistralForCausalLM": "octavo.models.mistral:MistralForCausalLM",
        "Qwen2ForCausalLM": "octavo.models.qwen2:Qwen2ForCausalLM",
        "Qwen3ForCausalLM": "octavo.models.qwen3:Qwen3ForCausalLM",
        "MixtralForCausalLM": "octavo.models.mixtral:MixtralForCausalLM",
        "Qwen2MoeForCausalLM": "octavo.models.qwen_moe:Qwen2MoeForCausalLM",
        "Qwen3MoeForCausalLM": "octavo.models.qwen_moe:Qwen3MoeForCausalLM",
        "OlmoeForCausalLM": "octavo.models.olmoe:OlmoeForCausalLM",
        "Gemma2ForCausalLM": "octavo.models.gemma2:Gemma2ForCausalLM",
        "Gemma3ForCausalLM": "octavo.models.gemma3:Gemma3ForCausalLM",
        # Vision-language checkpoints served for text (models/text_only.py).
        "Gemma3ForConditionalGeneration": "octavo.models.text_only:Gemma3ForConditionalGeneration",
        "Qwen2VLForConditionalGeneration": "octavo.models.text_only:Qwen2VLForConditionalGeneration",
        "Qwen2_5_VLForConditionalGeneration": "octavo.models.text_only:Qwen2_5_VLForConditionalGeneration",
        "Qwen3VLForConditionalGeneration": "octavo.models.text_only:Qwen3VLForConditionalGeneration",
        "Qwen3VLMoeForConditionalGeneration": "octavo.models.text_only:Qwen3VLMoeForConditionalGeneration",
        # Vision-language checkpoints that take images.
        "LlavaForConditionalGeneration": "octavo.models.llava:LlavaForConditionalGeneration",
        "Mistral3ForConditionalGeneration": "octavo.models.mistral3:Mistral3ForConditionalGeneration",
        "Phi3ForCausalLM": "octavo.models.phi3:Phi3ForCausalLM",
        "GlmForCausalLM": "octavo.models.glm:GlmForCausalLM",
        "Glm4ForCausalLM": "octavo.models.glm:Glm4ForCausalLM",
        "Glm4MoeForCausalLM": "octavo.models.glm:Glm4MoeForCausalLM",
        "Dots1ForCausalLM": "octavo.models.dots1:Dots1ForCausalLM",
        "Exaone4ForCausalLM": "octavo.models.exaone4:Exaone4ForCausalLM",
        "Olmo2ForCausalLM": "octavo.models.olmo2:Olmo2ForCausalLM",
        "Olmo3ForCausalLM": "octavo.models.olmo3:Olmo3ForCausalLM",
        "SeedOssForCausalLM": "octavo.models.seed_oss:SeedOssForCausalLM",
        "SmolLM3ForCausalLM": "octavo.models.smollm3:SmolLM3ForCausalLM",
        "Ernie4_5ForCausalLM": "octavo.models.ernie4_5:Ernie4_5ForCausalLM",
        "Ernie4_5_MoeForCausalLM": "octavo.models.ernie4_5:Ernie4_5_MoeForCausalLM",
        "GptOssForCausalLM": "octavo.models.gpt_oss:GptOssForCausalLM",
        "GraniteForCausalLM": "octavo.models.granite:GraniteForCausalLM",
        "GraniteMoeForCausalLM": "octavo.models.granitemoe:GraniteMoeForCausalLM",
        "GraniteMoeSharedForCausalLM": "octavo.models.granitemoe:GraniteMoeSharedForCausalLM",
        "Starcoder2ForCausalLM": "octavo.models.starcoder2:Starcoder2ForCausalLM",
        "CohereForCausalLM": "octavo.models.cohere:CohereForCausalLM",
        "Cohere2ForCausalLM": "octavo.models.cohere:Cohere2ForCausalLM",
        "DeepseekV2ForCausalLM": "octavo.models.deepseek:DeepseekV2ForCausalLM",
        "DeepseekV3ForCausalLM": "octavo.models.deepseek:DeepseekV3ForCausalLM",
        # Pooling models (embeddings, classification, reranking).
        "BertModel": "octavo.models.bert:BertModel",
        "BertForSequenceClassification": "octavo.models.bert:BertForSequenceClassification",
        "XLMRobertaModel": "octavo.models.xlm_roberta:XLMRobertaModel",
        "XLMRobertaForSequenceClassification": "octavo.models.xlm_roberta:XLMRobertaForSequenceClassification",
        "RobertaModel": "octavo.models.xlm_roberta:XLMRobertaModel",
        "RobertaForSequenceClassification": "octavo.models.xlm_roberta:XLMRobertaForSequenceClassification",
        "LlamaForSequenceClassification": "octavo.models.decoder_pooling:LlamaForSequenceClassification",
        "Qwen2ForSequenceClassification": "octavo.models.decoder_pooling:Qwen2ForSequenceClassification",
        "Qwen3ForSequenceClassification": "octavo.models.decoder_pooling:Qwen3ForSequenceClassification",
    }


@hookimpl
def octavo_quantization_methods():
    from octavo.quantization.builtin import builtin_quantization_methods

    return builtin_quantization_methods()


@hookimpl
def octavo_attention_backends():
    from octavo.platforms.builtin import platform_attention_backends
    from octavo.runtime.attention.builtin import builtin_attention_backends

    return {**builtin_attention_backends(), **platform_attention_backends()}


@hookimpl
def octavo_layer_ops():
    from octavo.kernels.builtin import builtin_layer_ops

    return builtin_layer_ops()
