"""OLMo 3: OLMo 2's decoder (norms after attention and MLP, RMSNorm over
all q and all k heads, scaled in float32) with sliding-window layers.

What differs is all in the config, which the shared decoder reads per layer
(``models/config.py``): the windowed layers come from ``layer_types`` (three
of every four when absent), and each layer type has its own RoPE
(``rope_parameters["sliding_attention"]`` / ``["full_attention"]``); in
older configs ``rope_scaling`` (YaRN) belongs to the full-attention layers
alone, the sliding ones rotating by the plain ``rope_theta``, as in HF.
"""

from octavo.models.olmo2 import Olmo2ForCausalLM


class Olmo3ForCausalLM(Olmo2ForCausalLM):
    """OLMo 2's layers; the sliding windows and per-type RoPE come from the config."""
