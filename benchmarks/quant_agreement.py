#!/usr/bin/env python
"""Greedy agreement of each quantization method with the unquantized demo
model, on the CPU in float32 (issue 17's accuracy figure on a trained model):

    python benchmarks/quant_agreement.py        # ~70 s of CPU

The packaged demo model (``octavo/assets/demo-model``, trained, unlike the
tests' random checkpoints) generates 32 greedy tokens for each of 8 fixed
prompts, unquantized and with each method; printed per method: sequences
identical to the unquantized ones, token positions that agree, and where
each sequence first parts. The figures are quoted in docs/quantization.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from octavo import LLM, SamplingParams  # noqa: E402
from octavo.default_model import DEMO_MODEL_DIR  # noqa: E402

PROMPTS = [
    "Once upon a time", "The fox walked to the river", "One day the bird", "Every morning the little",
    "What does the fox drink?", "The girl found a", "In the quiet forest", "The cat and the dog",
]
NEW_TOKENS = 32
METHODS = {
    "fp8": dict(quantization="fp8"), "int8": dict(quantization="int8"),
    "int8_weight_only": dict(quantization="int8_weight_only"), "int4": dict(quantization="int4"),
    "fp8 KV cache": dict(kv_cache_dtype="fp8"),
}


def greedy(**options) -> list[list[int]]:
    llm = LLM(str(DEMO_MODEL_DIR), dtype="float32", max_model_len=128, max_num_seqs=len(PROMPTS), **options)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    return [output.outputs[0].token_ids for output in llm.generate(PROMPTS, params)]


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))


def main() -> None:
    reference = greedy()
    total = len(PROMPTS) * NEW_TOKENS
    for name, options in METHODS.items():
        ours = greedy(**options)
        identical = sum(a == b for a, b in zip(ours, reference))
        agree = sum(x == y for a, b in zip(ours, reference) for x, y in zip(a, b))
        parts = [first_difference(a, b) for a, b in zip(ours, reference)]
        print(f"{name:<18} identical {identical}/{len(PROMPTS)}  positions {agree}/{total}  first difference {parts}", flush=True)


if __name__ == "__main__":
    main()
