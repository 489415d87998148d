"""``ExampleLlamaForCausalLM``: a model architecture registered by a plugin.

The model contract (docs/plugins.md): a class built from a
``ModelInitContext``, with ``forward(input_ids, positions, ctx,
intermediate=None)``, ``compute_logits(hidden)`` and
``load_weights(weights)``. This one is Octavo's Llama under a vendor's
architecture name; ``hf_architecture`` names the transformers class it
reproduces, which the conformance kit compares it with
(``octavo plugins check NAME --only plugin_models``).
"""

from __future__ import annotations

from octavo.models.llama import LlamaForCausalLM


class ExampleLlamaForCausalLM(LlamaForCausalLM):
    hf_architecture = "LlamaForCausalLM"
