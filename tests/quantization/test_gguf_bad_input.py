"""Bad GGUF files: each is refused with a ModelLoadError (or its subclass
UnsupportedModelError) naming the file and the tensor or field, before the
model is built -- never silent garbage, never a numpy/struct traceback.

Headers are crafted byte by byte where the ``gguf`` writer would refuse to
write them (absurd counts, overflowing shapes, unknown type ids).
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from octavo.errors import ModelLoadError, UnsupportedModelError
from octavo.models.gguf_loader import gguf_arch_config
from tests.quantization.gguf_writer import GGUFVariant, write_gguf


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def craft(path: Path, fields: list[bytes], tensors: list[bytes], data: bytes = b"") -> Path:
    header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(fields)) + b"".join(fields) + b"".join(tensors)
    header += b"\0" * (-len(header) % 32)
    path.write_bytes(header + data)
    return path


def string_field(key: str, value: str) -> bytes:
    return _string(key) + struct.pack("<I", 8) + _string(value)


def tensor_info(name: str, dims: list[int], type_id: int, offset: int = 0) -> bytes:
    return _string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", type_id, offset)


@pytest.fixture(scope="module")
def good_file(gguf_checkpoint_dirs, tmp_path_factory) -> Path:
    return write_gguf(gguf_checkpoint_dirs["llama"], tmp_path_factory.mktemp("good") / "good.gguf", "llama", {"ffn_down.weight": "Q4_K"})


def test_truncated_file(good_file, tmp_path):
    data = good_file.read_bytes()
    for cut in (len(data) - 100, 2000, 10):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(data[:cut])
        with pytest.raises(ModelLoadError, match=r"cut\d+\.gguf: .*(truncated|ends inside|more than the file can hold)"):
            gguf_arch_config(path)


def test_truncated_file_names_the_tensor(good_file, tmp_path):
    path = tmp_path / "short.gguf"
    path.write_bytes(good_file.read_bytes()[:-100])
    with pytest.raises(ModelLoadError, match=r"tensor '[\w.]+' \(F32 \[256\]\) needs bytes \d+\.\.\d+ but the file has \d+ \(truncated\?\)"):
        gguf_arch_config(path)


@pytest.mark.parametrize(
    "content,message",
    [
        (b"", "cannot read"),
        (b"GGML" + b"\0" * 60, "not a GGUF file"),
        (b"GGUF" + struct.pack("<I", 7) + b"\0" * 60, "GGUF version 7 is not supported"),
    ],
)
def test_not_gguf(content, message, tmp_path):
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError, match=message):
        gguf_arch_config(path)


def test_absurd_array_length_is_refused_before_reading(tmp_path):
    # A uint8 array claiming 2**40 items in a 100-byte file.
    field = _string("tokenizer.ggml.scores") + struct.pack("<IIQ", 9, 0, 2**40)
    path = craft(tmp_path / "array.gguf", [field], [])
    with pytest.raises(ModelLoadError, match="field 'tokenizer.ggml.scores' claims 1099511627776 items"):
        gguf_arch_config(path)


def test_absurd_counts(tmp_path):
    path = tmp_path / "counts.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2**62, 2**62) + b"\0" * 64)
    with pytest.raises(ModelLoadError, match="more than the file holds"):
        gguf_arch_config(path)


def test_overflowing_shape_names_the_tensor(tmp_path):
    # 2**40 x 2**40 x 2**40 F32 values: 2**122 bytes, which uint64 arithmetic would wrap.
    tensor = tensor_info("token_embd.weight", [2**40, 2**40, 2**40], 0)
    path = craft(tmp_path / "huge.gguf", [string_field("general.architecture", "llama")], [tensor], b"\0" * 64)
    with pytest.raises(ModelLoadError, match=r"tensor 'token_embd.weight' \(F32 .*\) needs bytes"):
        gguf_arch_config(path)


@pytest.mark.parametrize(
    "dims,type_id,message",
    [
        ([64], 999, "unknown ggml type id 999"),
        ([1, 2, 3, 4, 5], 0, "has 5 dimensions"),
        ([0, 4], 0, "empty dimension"),
        ([100, 4], 12, "rows of 100 values are not whole Q4_K blocks of 256"),
    ],
)
def test_bad_tensor_descriptions(dims, type_id, message, tmp_path):
    path = craft(tmp_path / "t.gguf", [string_field("general.architecture", "llama")], [tensor_info("blk.0.attn_q.weight", dims, type_id)], b"\0" * 4096)
    with pytest.raises(ModelLoadError, match=rf"'blk.0.attn_q.weight'.*{message}|{message}.*"):
        gguf_arch_config(path)


def test_unsupported_architecture(tmp_path):
    path = craft(tmp_path / "gpt2.gguf", [string_field("general.architecture", "gpt2")], [])
    with pytest.raises(UnsupportedModelError, match="GGUF architecture 'gpt2' is not supported"):
        gguf_arch_config(path)


def test_unsupported_tensor_type(gguf_checkpoint_dirs, tmp_path):
    # IQ2_XXS is a real ggml type (256 values in 66 bytes) that Octavo does not dequantize.
    iq2 = np.zeros((256, 512 // 256 * 66), dtype=np.uint8)
    path = write_gguf(
        gguf_checkpoint_dirs["llama"], tmp_path / "iq2.gguf", "llama", {},
        GGUFVariant(skip=("blk.0.ffn_down.weight",), extra_tensors={"blk.0.ffn_down.weight": (iq2, "IQ2_XXS")}),
    )
    with pytest.raises(ModelLoadError, match="tensor 'blk.0.ffn_down.weight' has ggml type IQ2_XXS, which Octavo does not support"):
        gguf_arch_config(path)


def test_metadata_disagrees_with_tensors(gguf_checkpoint_dirs, tmp_path):
    path = write_gguf(gguf_checkpoint_dirs["llama"], tmp_path / "m.gguf", "llama", {}, GGUFVariant(config_overrides={"intermediate_size": 256}))
    with pytest.raises(ModelLoadError, match=r"tensor 'blk.0.ffn_\w+.weight' has shape \[\d+, \d+\], but the metadata implies \[256, 256\]"):
        gguf_arch_config(path)


def test_missing_tensor(gguf_checkpoint_dirs, tmp_path):
    path = write_gguf(gguf_checkpoint_dirs["qwen2"], tmp_path / "m.gguf", "qwen2", {}, GGUFVariant(skip=("blk.1.ffn_up.weight",)))
    with pytest.raises(ModelLoadError, match="tensor 'blk.1.ffn_up.weight' is missing"):
        gguf_arch_config(path)


def test_unknown_tensor(gguf_checkpoint_dirs, tmp_path):
    extra = {"blk.0.ffn_gate_exps.weight": (np.zeros((4, 256), dtype=np.float32), "F32")}
    path = write_gguf(gguf_checkpoint_dirs["qwen2"], tmp_path / "moe.gguf", "qwen2", {}, GGUFVariant(extra_tensors=extra))
    with pytest.raises(UnsupportedModelError, match="tensor 'blk.0.ffn_gate_exps.weight' is not part of a qwen2 model"):
        gguf_arch_config(path)


def test_bad_metadata_value(gguf_checkpoint_dirs, tmp_path):
    path = write_gguf(gguf_checkpoint_dirs["qwen2"], tmp_path / "ctx.gguf", "qwen2", {}, GGUFVariant(config_overrides={"max_position_embeddings": 2**31}))
    with pytest.raises(ModelLoadError, match="'qwen2.context_length' = 2147483648 is out of range"):
        gguf_arch_config(path)


def test_llm_refuses_bad_file_before_loading(good_file, tmp_path):
    from octavo import LLM

    path = tmp_path / "short.gguf"
    path.write_bytes(good_file.read_bytes()[:-100])
    with pytest.raises(ModelLoadError, match="short.gguf"):
        LLM(str(path), dtype="float32", max_model_len=64)
