"""SmolLM3: the Llama decoder with no rotary embedding at all in some layers
(NoPE). HF's ``no_rope_layers`` flags each layer with 1 where it *does*
apply RoPE; without it every ``no_rope_layer_interval``-th layer (4th, 8th,
...) has none (``config.nope_layers``, read in ``models/config.py``). Sliding
windows apply only with ``use_sliding_window``, to the layers ``layer_types``
names (by default the NoPE ones)."""

from octavo.errors import UnsupportedModelError
from octavo.models.llama import DecoderOptions, LlamaForCausalLM


class SmolLM3ForCausalLM(LlamaForCausalLM):
    @classmethod
    def decoder_options(cls, config, dtype) -> DecoderOptions:
        raw = config.raw
        # HF's masks follow ``layer_types`` but its flash path follows
        # ``use_sliding_window``: a config where the two disagree has no one meaning.
        if "sliding_attention" in (raw.get("layer_types") or ()) and not raw.get("use_sliding_window"):
            raise UnsupportedModelError(
                "config.json: layer_types has sliding_attention layers but use_sliding_window is off"
            )
        return super().decoder_options(config, dtype)
