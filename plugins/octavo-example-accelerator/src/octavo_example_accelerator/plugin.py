"""The plugin module named by the entry point: the hooks, and the API version.

Hooks return classes (or OpImpl entries); the modules that define them
import only torch and Octavo's public interfaces, so loading the plugin
stays cheap. ``octavo_layer_ops`` is new in plugin API 1.1, hence the
version declared here.
"""

from octavo.plugins import hookimpl

OCTAVO_PLUGIN_API_VERSION = "1.1"


@hookimpl
def octavo_platforms():
    from octavo_example_accelerator.openvino_platform import ExampleOpenVinoPlatform
    from octavo_example_accelerator.platform import ExamplePlatform

    return [ExamplePlatform, ExampleOpenVinoPlatform]


@hookimpl
def octavo_attention_backends():
    from octavo_example_accelerator.attention import ExamplePagedAttention

    return {ExamplePagedAttention.name: ExamplePagedAttention}


@hookimpl
def octavo_quantization_methods():
    from octavo_example_accelerator.quantization import ExampleInt8Config

    return {ExampleInt8Config.name: ExampleInt8Config}


@hookimpl
def octavo_layer_ops():
    from octavo_example_accelerator.ops import example_layer_ops

    return example_layer_ops()


@hookimpl
def octavo_models():
    # A string: the model module is imported only when such a model loads.
    return {"ExampleLlamaForCausalLM": "octavo_example_accelerator.model:ExampleLlamaForCausalLM"}
