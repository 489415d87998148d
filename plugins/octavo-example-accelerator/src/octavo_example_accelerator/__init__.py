"""An example out-of-tree Octavo plugin (platform ``example``, quantization ``example_int8``)."""
