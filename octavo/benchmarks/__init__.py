"""Benchmarks behind ``octavo bench``: latency and throughput, side by side
with Hugging Face transformers and the physical floor."""
