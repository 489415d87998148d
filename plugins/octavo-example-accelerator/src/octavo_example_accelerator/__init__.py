"""An example out-of-tree Octavo plugin (platform ``example`` with its own layer-op kernels, quantization ``example_int8``, model ``ExampleLlamaForCausalLM``)."""
