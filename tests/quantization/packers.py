"""Hand-packed quantized checkpoints for tests, written from the formats'
specs in numpy, independently of Octavo's own packing code.

* GPTQ: ``qweight`` int32 [K/8, N] (input k in bits 4*(k%8) of row k//8),
  ``qzeros`` int32 [G, N/8] (output n in bits 4*(n%8)), stored zero = true
  zero - 1 for checkpoint_format "gptq" (v1), the true zero for "gptq_v2";
  ``scales`` fp16 [G, N]; ``g_idx`` int32 [K] (act-order: a permutation of
  the inputs is grouped, ``g_idx[perm[i]] = i // group_size``).
* AWQ: ``qweight`` int32 [K, N/8] and ``qzeros`` int32 [G, N/8], nibble i of
  a word holding output 8c + (0, 2, 4, 6, 1, 3, 5, 7)[i]; ``scales`` fp16 [G, N].
* GPTQ 8-bit: the same with 4 values per int32 (input k in bits 8*(k%4)).
* compressed-tensors pack-quantized: ``weight_packed`` int32 [N, K*b/32]
  (input k in bits b*(k%p) of word k//p, values unsigned), ``weight_scale``
  [N, G], ``weight_zero_point`` int32 [N*b/32, G] packed along the outputs
  (asymmetric only; a symmetric zero is 2**(b-1)), ``weight_g_idx`` [K].
* fp8: ``weight`` e4m3 + ``weight_scale`` per tensor (scalar) or per channel;
  block-wise: ``weight_scale_inv`` [N/bn, K/bk], ``W = q * s``.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def input_perm(module: str, num_in: int, seed: int = 0) -> np.ndarray:
    """A deterministic act-order permutation per layer input (q/k/v share one,
    gate/up share one)."""
    layer = int(module.split(".")[2])
    kind = module.rsplit(".", 1)[-1]
    source = {"q_proj": 0, "k_proj": 0, "v_proj": 0, "o_proj": 1, "gate_proj": 2, "up_proj": 2, "down_proj": 3}[kind]
    return np.random.default_rng([seed, layer, source]).permutation(num_in)


def _pack_nibbles(values: np.ndarray, axis: int, order=None, bits: int = 4) -> np.ndarray:
    """Pack 32/bits consecutive entries along ``axis`` into one int32 (entry j -> bits b*j)."""
    pack = 32 // bits
    values = np.moveaxis(values.astype(np.uint32), axis, -1)
    grouped = values.reshape(*values.shape[:-1], -1, pack)
    if order is not None:
        grouped = grouped[..., list(order)]
    words = np.zeros(grouped.shape[:-1], dtype=np.uint32)
    for j in range(pack):
        words |= (grouped[..., j] & np.uint32((1 << bits) - 1)) << np.uint32(bits * j)
    return np.moveaxis(words.view(np.int32), -1, axis)


@dataclass
class Int4Packed:
    tensors: dict[str, np.ndarray]
    dequantized: np.ndarray  # [N, K] float32, what the packed tensors mean per the spec
    scale_bound: np.ndarray  # [N, K] the step size each element was quantized with


def _group_quantize(w: np.ndarray, groups: np.ndarray, num_groups: int, sym: bool, min_zero: int, bits: int = 4):
    """Asymmetric (or GPTQ-symmetric) ``bits``-bit per (group, output), unsigned values."""
    top = (1 << bits) - 1
    num_out, num_in = w.shape
    scales = np.zeros((num_groups, num_out), np.float32)
    zeros = np.zeros((num_groups, num_out), np.int64)
    for g in range(num_groups):
        cols = w[:, groups == g]
        if sym:
            amax = np.abs(cols).max(axis=1)
            scale, zero = 2 * amax / top, np.full(num_out, 1 << (bits - 1))
        else:
            low, high = np.minimum(cols.min(axis=1), 0), np.maximum(cols.max(axis=1), 0)
            scale = (high - low) / top
            zero = np.clip(np.round(-low / np.maximum(scale, 1e-12)), min_zero, top)
        scales[g] = np.maximum(scale, 1e-8).astype(np.float16).astype(np.float32)
        zeros[g] = zero
    s, z = scales[groups].T, zeros[groups].T  # [N, K]
    q = np.clip(np.round(w / s) + z, 0, top).astype(np.int64)
    return q, scales, zeros, (q - z) * s, s


def _act_order_groups(num_in: int, group_size: int, perm: np.ndarray | None) -> np.ndarray:
    perm = np.arange(num_in) if perm is None else perm
    g_idx = np.empty(num_in, np.int32)
    g_idx[perm] = np.arange(num_in) // group_size
    return g_idx


def pack_gptq(
    w: np.ndarray, group_size: int, sym: bool, v2: bool, perm: np.ndarray | None = None, bits: int = 4
) -> Int4Packed:
    """``perm``: act-order, the order in which inputs were quantized (GPTQ
    derives it from the layer's input statistics, so layers sharing an input
    -- q/k/v, gate/up -- share it)."""
    num_out, num_in = w.shape
    gs = num_in if group_size == -1 else group_size
    g_idx = _act_order_groups(num_in, gs, perm)
    q, scales, zeros, dq, step = _group_quantize(w, g_idx, num_in // gs, sym, min_zero=0 if v2 else 1, bits=bits)
    stored_zeros = zeros if v2 else zeros - 1
    tensors = {
        "qweight": _pack_nibbles(q.T, axis=0, bits=bits),
        "qzeros": _pack_nibbles(stored_zeros, axis=1, bits=bits),
        "scales": scales.astype(np.float16),
        "g_idx": g_idx,
    }
    return Int4Packed(tensors, dq.astype(np.float32), step)


def pack_awq(w: np.ndarray, group_size: int) -> Int4Packed:
    num_in = w.shape[1]
    groups = np.arange(num_in) // group_size
    q, scales, zeros, dq, step = _group_quantize(w, groups, num_in // group_size, sym=False, min_zero=0)
    tensors = {
        "qweight": _pack_nibbles(q.T, axis=1, order=AWQ_ORDER),
        "qzeros": _pack_nibbles(zeros, axis=1, order=AWQ_ORDER),
        "scales": scales.astype(np.float16),
    }
    return Int4Packed(tensors, dq.astype(np.float32), step)


def pack_compressed_tensors(
    w: np.ndarray, bits: int, group_size: int | None, sym: bool, perm: np.ndarray | None = None
) -> Int4Packed:
    """compressed-tensors ``pack-quantized`` (``group_size`` None: per channel)."""
    num_out, num_in = w.shape
    gs = num_in if group_size is None else group_size
    g_idx = _act_order_groups(num_in, gs, perm)
    q, scales, zeros, dq, step = _group_quantize(w, g_idx, num_in // gs, sym, min_zero=0, bits=bits)
    tensors = {
        "weight_packed": _pack_nibbles(q, axis=1, bits=bits),
        "weight_scale": scales.T.astype(np.float16),
        "weight_shape": np.array([num_out, num_in], dtype=np.int32),
    }
    if not sym:
        tensors["weight_zero_point"] = _pack_nibbles(zeros.T, axis=0, bits=bits)
    if perm is not None:
        tensors["weight_g_idx"] = g_idx
    return Int4Packed(tensors, dq.astype(np.float32), step)


def fp8_block_pack(block_n: int, block_k: int):
    """A block-wise fp8 packer (``weight_scale_inv`` [N/bn, K/bk])."""

    def pack(module: str, w: np.ndarray) -> dict[str, np.ndarray]:
        wt = torch.from_numpy(w)
        n, k = wt.shape
        blocks = wt.reshape(n // block_n, block_n, k // block_k, block_k)
        scale = blocks.abs().amax(dim=(1, 3)) / 448.0
        q = (blocks / scale[:, None, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
        dq = (q.to(torch.float32) * scale[:, None, :, None]).reshape(n, k).numpy()
        return {"weight": q.reshape(n, k), "weight_scale_inv": scale.numpy().astype(np.float32), "_dequantized": dq}

    return pack


def write_quantized_checkpoint(source: Path, out: Path, quant_config: dict, pack) -> dict[str, np.ndarray]:
    """Copy ``source`` to ``out`` with every linear weight replaced by
    ``pack(name, weight [N, K] float32) -> {suffix: array or tensor}``; returns
    what each packed layer means (``name -> dequantized [N, K]``), as the
    packer reports it under the key ``_dequantized``."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, out)
    tensors = load_file(str(source / "model.safetensors"))
    result, meanings = {}, {}
    for name, value in tensors.items():
        module, _, suffix = name.rpartition(".")
        if suffix == "weight" and module.rsplit(".", 1)[-1] in LINEAR_NAMES:
            packed = pack(module, value.to(torch.float32).numpy())
            meanings[module] = packed.pop("_dequantized", None)
            for key, array in packed.items():
                tensor = array if isinstance(array, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(array))
                result[f"{module}.{key}"] = tensor.contiguous()
        else:
            result[name] = value
    save_file(result, str(out / "model.safetensors"))
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = quant_config
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return meanings


def fp8_pack(per_tensor: bool):
    """An fp8 packer: per-tensor (scalar) or per-channel ([N, 1]) scales."""

    def pack(module: str, w: np.ndarray) -> dict[str, np.ndarray]:
        wt = torch.from_numpy(w)
        if per_tensor:
            scale = wt.abs().max() / 448.0
            q = (wt / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
            scale_array = scale.reshape(()).numpy().astype(np.float32)
        else:
            scale = wt.abs().amax(dim=1, keepdim=True) / 448.0
            q = (wt / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
            scale_array = scale.numpy().astype(np.float32)
        dq = (q.to(torch.float32) * scale).numpy()
        return {"weight": q, "weight_scale": scale_array, "_dequantized": dq}

    return pack
