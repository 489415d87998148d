"""The plugin module named by the entry point: the hooks, and the API version.

Hooks return classes; the modules that define them import only torch and
Octavo's public interfaces, so loading the plugin stays cheap.
"""

from octavo.plugins import hookimpl

OCTAVO_PLUGIN_API_VERSION = "1.0"


@hookimpl
def octavo_platforms():
    from octavo_example_accelerator.platform import ExamplePlatform

    return [ExamplePlatform]


@hookimpl
def octavo_attention_backends():
    from octavo_example_accelerator.attention import ExamplePagedAttention

    return {ExamplePagedAttention.name: ExamplePagedAttention}


@hookimpl
def octavo_quantization_methods():
    from octavo_example_accelerator.quantization import ExampleInt8Config

    return {ExampleInt8Config.name: ExampleInt8Config}
