"""Quantization methods: an interface in ``base``, formats as plugins."""
