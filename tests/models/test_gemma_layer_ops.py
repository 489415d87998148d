"""Which layer ops a Gemma 2 decode step calls, and how often: each op is
one launch on a GPU, so these counts are the launches per layer that the
fused sandwich norms and GeGLU GEMV save. Counted through a plugin that
registers a recording reference for every op the layers call (the linear
ops up to 1 token, as the GEMV is)."""

from __future__ import annotations

from collections import Counter

from tests.plugins.fake_plugins import sandbox  # noqa: F401

COUNTED = (
    "rms_norm_f32_scale", "fused_add_rms_norm_f32_scale", "post_norm_add_rms_norm_f32_scale",
    "rotary_embedding", "gelu_tanh_and_mul", "linear", "linear_gelu_tanh_and_mul",
)
RECORDER = '''
OCTAVO_PLUGIN_API_VERSION = "1.1"
from octavo.ops import OpImpl, OP_SPECS

calls = []

def recording(op):
    def call(*args):
        out_features = args[1].shape[0] if op == "linear" else None  # tells the LM head apart
        calls.append((op, args[0].shape[0], out_features))
        return OP_SPECS[op].reference(*args)
    return call

@hookimpl
def octavo_layer_ops():
    gemv = ("linear", "linear_gelu_tanh_and_mul")
    return [
        OpImpl(op, "recording", recording(op), platforms=("cpu",), max_tokens=1 if op in gemv else None)
        for op in {counted!r}
    ]
'''


def test_gemma2_decode_step_calls_seven_ops_a_layer(family_dir, make_llm, sandbox):
    from octavo import SamplingParams
    from octavo.models.config import load_arch_config

    path = family_dir("gemma2")
    config = load_arch_config(path)
    sandbox.add("recorder", RECORDER.format(counted=COUNTED))
    llm = make_llm(path)
    from recorder import calls

    llm.generate([{"prompt_token_ids": [5, 9, 23, 7]}], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    # One-token calls, less the LM head (the prefill's last row, and the decode step's).
    decode = Counter(op for op, tokens, out in calls if tokens == 1 and out != config.vocab_size)
    layers = config.num_hidden_layers
    # A layer: qkv, rotary, o, norm-add-norm, gate-up + GeGLU, down, norm-add-norm;
    # the first layer's input norm is the step's only plain norm (the final
    # norm is fused into the last layer's).
    assert decode == Counter({
        "rms_norm_f32_scale": 1, "linear": 3 * layers, "rotary_embedding": layers,
        "post_norm_add_rms_norm_f32_scale": 2 * layers, "linear_gelu_tanh_and_mul": layers,
    })
