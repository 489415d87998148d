"""Triton kernels and their plain-torch references."""
