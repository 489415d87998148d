"""GGUF files: written from small random HF models with the ``gguf`` package's
writer, loaded by Octavo and by Hugging Face transformers
(``from_pretrained(dir, gguf_file=...)``), float32 on the CPU.

Each architecture gets a different mix of tensor types, so that all fifteen
supported types (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K,
Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS) appear, as well as fused layers whose
shards differ in type (q/k Q4_K + v Q6_K, q/k IQ4_NL + v Q5_1, and a float
shard next to a quantized one). Evidence: greedy tokens and text equal
to transformers', tokenizer included (text in, text out); every linear
layer's effective weight equal to the file's dequantized tensor; linear
weight memory of a Q4_K file 0.28 x bf16.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from octavo import SamplingParams
from octavo.quantization.naming import checkpoint_names
from tests.checkpoints import ARCHITECTURES
from tests.quantization import helpers
from tests.quantization.gguf_writer import GGUFVariant, gguf_tensor_name, quantize, write_gguf

TYPE_MIX = {
    "llama": {
        "token_embd.weight": "Q8_0", "attn_q.weight": "Q4_K", "attn_k.weight": "Q4_K", "attn_v.weight": "Q6_K",
        "attn_output.weight": "Q5_K", "ffn_gate.weight": "F16", "ffn_up.weight": "Q4_0", "ffn_down.weight": "Q8_0",
        "output.weight": "BF16",
    },
    "mistral": {
        "token_embd.weight": "F16", "attn_q.weight": "IQ4_NL", "attn_k.weight": "IQ4_NL", "attn_v.weight": "Q5_1",
        "attn_output.weight": "Q2_K", "ffn_gate.weight": "Q3_K", "ffn_up.weight": "IQ4_XS", "ffn_down.weight": "Q4_0",
    },
    "qwen2": {
        "token_embd.weight": "Q6_K", "attn_q.weight": "Q8_0", "attn_k.weight": "Q8_0", "attn_v.weight": "Q8_0",
        "attn_output.weight": "Q5_0", "ffn_gate.weight": "Q4_1", "ffn_up.weight": "Q5_K", "ffn_down.weight": "Q6_K",
    },
    "qwen3": {  # like llama.cpp's Q4_K_M
        "token_embd.weight": "Q4_K", "attn_q.weight": "Q4_K", "attn_k.weight": "Q4_K", "attn_v.weight": "Q6_K",
        "attn_output.weight": "Q4_K", "ffn_gate.weight": "Q4_K", "ffn_up.weight": "Q4_K", "ffn_down.weight": "Q6_K",
        "output.weight": "Q6_K",
    },
}
PROMPTS = ["Once upon a time", "The fox carried the bird", "Octavo is an engine that", "green grass 123"]
NUM_NEW_TOKENS = 16


@pytest.fixture(scope="module")
def gguf_files(gguf_checkpoint_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    files = {}
    for arch in ARCHITECTURES:
        (root / arch).mkdir()
        files[arch] = write_gguf(gguf_checkpoint_dirs[arch], root / arch / "model.gguf", arch, TYPE_MIX[arch])
    return files


@pytest.fixture(scope="module")
def hf_reference(gguf_files):
    """transformers' model and tokenizer read from each file; greedy ids per prompt."""
    pytest.importorskip("accelerate", reason="transformers needs accelerate to load GGUF files")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache = {}

    def get(arch):
        if arch not in cache:
            path = gguf_files[arch]
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
            outputs = []
            for text in PROMPTS:
                ids = torch.tensor([tokenizer(text)["input_ids"]])
                with torch.no_grad():
                    out = model.generate(
                        ids, attention_mask=torch.ones_like(ids), max_new_tokens=NUM_NEW_TOKENS,
                        min_new_tokens=NUM_NEW_TOKENS, do_sample=False, pad_token_id=0,
                    )
                outputs.append((ids[0].tolist(), out[0, ids.shape[1] :].tolist()))
            cache[arch] = (tokenizer, outputs)
        return cache[arch]

    return get


def assert_same_text(text: str, expected: str) -> None:
    """Equal, except that streaming detokenization holds back the bytes of
    an unfinished UTF-8 character at the very end (decoded whole: U+FFFD)."""
    assert text == expected or (expected.endswith("\ufffd") and text == expected.rstrip("\ufffd")), (text, expected)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_tokens_and_text_match_hf(arch, gguf_files, hf_reference, make_llm):
    tokenizer, expected = hf_reference(arch)
    llm = make_llm(gguf_files[arch])
    params = SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
    outputs = llm.generate(PROMPTS, params)
    for output, (prompt_ids, token_ids) in zip(outputs, expected):
        assert output.prompt_token_ids == prompt_ids
        assert output.outputs[0].token_ids == token_ids
        assert_same_text(output.outputs[0].text, tokenizer.decode(token_ids, skip_special_tokens=True))


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_linear_weights_are_the_files_tensors(arch, gguf_files, gguf_checkpoint_dirs):
    """Each linear layer computes with exactly the file's dequantized tensor
    (q/k rows un-permuted for llama), which is within the type's rounding of
    the original weight."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_files[arch]))
    file_tensors = {t.name: t for t in reader.tensors}
    original = helpers.checkpoint_tensors(gguf_checkpoint_dirs[arch])
    loaded = helpers.load(gguf_files[arch])
    config = loaded.arch
    for prefix, layer in helpers.linear_layers(loaded.model).items():
        parts = []
        for name in checkpoint_names(prefix):
            tensor = file_tensors[gguf_tensor_name(f"{name}.weight")]
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(tuple(reversed(tensor.shape.tolist())))
            if arch == "llama" and name.endswith(("q_proj", "k_proj")):
                heads = config.num_attention_heads if name.endswith("q_proj") else config.num_key_value_heads
                values = _unpermute(values, heads)
            parts.append(values)
        expected = torch.from_numpy(np.concatenate(parts).astype(np.float32))
        torch.testing.assert_close(helpers.effective_weight(layer), expected, rtol=1e-5, atol=1e-6)
        reference = helpers.fused_reference(original, prefix)
        assert float((expected - reference).abs().max()) < 0.25 * float(reference.abs().max())


def _unpermute(values: np.ndarray, heads: int) -> np.ndarray:
    """Inverse of llama.cpp's permutation, written independently of Octavo's."""
    rows = values.shape[0]
    return values.reshape(heads, rows // heads // 2, 2, -1).swapaxes(1, 2).reshape(values.shape)


def test_tokenizer_from_metadata(gguf_files, gguf_checkpoint_dirs, hf_reference, make_llm):
    """Octavo's tokenizer from the GGUF metadata encodes, decodes and renders
    chats like transformers' (and like the tokenizer the file was made from)."""
    from transformers import AutoTokenizer

    hf_tokenizer, _ = hf_reference("llama")
    original = AutoTokenizer.from_pretrained(str(gguf_checkpoint_dirs["llama"]))
    tokenizer = make_llm(gguf_files["llama"]).get_tokenizer()
    texts = ["Once upon a time", "<s>The fox</s> smiled.", "  spaces\tand\nnew lines 42!", "Octavo"]
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        assert ids == hf_tokenizer(text)["input_ids"] == original(text)["input_ids"]
        assert tokenizer.decode(ids) == hf_tokenizer.decode(ids) == text
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<s>", "</s>", "<pad>")
    chat = [{"role": "user", "content": "hi"}]
    rendered = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert rendered == original.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert rendered == "<|user|>\nhi</s>\n<|assistant|>\n"


def test_generate_cli_with_gguf_file(gguf_files, hf_reference, capsys):
    from octavo.entrypoints.cli.main import main

    tokenizer, expected = hf_reference("qwen2")
    rc = main(["generate", "--model", str(gguf_files["qwen2"]), "--dtype", "float32", "--max-tokens", "6", PROMPTS[0]])
    assert rc == 0
    out = capsys.readouterr().out
    assert out.endswith("\n") and out.startswith(PROMPTS[0])
    assert_same_text(out[len(PROMPTS[0]) : -1], tokenizer.decode(expected[0][1][:6], skip_special_tokens=True))


def test_q4_weight_memory(gguf_checkpoint_dirs, tmp_path):
    """All linear layers Q4_K: 144 bytes per 256 weights = 0.28 x bf16."""
    from octavo.quantization.memory import measure_weight_memory, weight_memory_of

    path = write_gguf(gguf_checkpoint_dirs["llama"], tmp_path / "q4.gguf", "llama", {}, GGUFVariant(default_type="Q4_K"))
    loaded = helpers.load(path, dtype="bfloat16")
    memory = weight_memory_of(loaded.model)
    assert memory.linear_ratio == pytest.approx(144 / 256 / 2)
    assert measure_weight_memory(str(path), dtype="bfloat16").linear_bytes == memory.linear_bytes
    assert all(layer.qweight.dtype == torch.uint8 for layer in helpers.linear_layers(loaded.model).values())


def test_float_file_loads_unquantized(gguf_checkpoint_dirs, tmp_path):
    path = write_gguf(gguf_checkpoint_dirs["qwen2"], tmp_path / "f16.gguf", "qwen2", {}, GGUFVariant(default_type="F16"))
    loaded = helpers.load(path)
    assert loaded.arch.quantization_config is None
    assert all(layer.weight.dtype == torch.float32 for layer in helpers.linear_layers(loaded.model).values())


def test_llama3_rope_freqs(gguf_checkpoint_dirs, tmp_path):
    """llama.cpp stores Llama 3.1 rope scaling as a rope_freqs tensor."""
    from octavo.errors import UnsupportedModelError
    from octavo.models.gguf_loader import gguf_arch_config
    from octavo.models.layers.rotary import compute_inv_freq

    params = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    base, _ = compute_inv_freq(64, 10000.0, None, 8192)
    scaled, _ = compute_inv_freq(64, 10000.0, params, 8192)
    factors = (base / scaled).numpy().astype(np.float32)
    path = write_gguf(gguf_checkpoint_dirs["llama"], tmp_path / "a.gguf", "llama", {}, GGUFVariant(extra_tensors={"rope_freqs.weight": (factors, "F32")}))
    assert gguf_arch_config(path).rope_parameters == params
    wrong = factors.copy()
    wrong[3] = 5.0
    path = write_gguf(gguf_checkpoint_dirs["llama"], tmp_path / "b.gguf", "llama", {}, GGUFVariant(extra_tensors={"rope_freqs.weight": (wrong, "F32")}))
    with pytest.raises(UnsupportedModelError, match="rope_freqs.weight"):
        gguf_arch_config(path)


def test_quantize_helper_round_trip():
    """The writer's quantize() output has the byte shapes GGUF expects."""
    values = np.zeros((2, 256), dtype=np.float32)
    assert quantize(values, "Q4_K").shape == (2, 144)
    assert quantize(values, "Q6_K").shape == (2, 210)
