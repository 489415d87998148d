"""GGUF (ggml) tensor types: their block layouts and a torch dequantizer.

A ggml row of ``K`` values is ``K / block_elems`` blocks of ``block_bytes``
bytes each; rows are independent, so a weight ``[N, K]`` is stored as uint8
``[N, K / block_elems * block_bytes]`` and can be split by rows (output
features) or, at block boundaries, by columns. Supported types and layouts
(little-endian; ``f16`` = IEEE half):

* F32, F16, BF16: plain values (block of 1);
* Q8_0 (32 values, 34 bytes): ``f16 d``, 32 x int8 ``q``; ``w = d * q``;
* Q4_0 (32, 18): ``f16 d``, 16 bytes: value ``j < 16`` is the low nibble
  of byte ``j``, value ``j >= 16`` the high nibble of byte ``j - 16``;
  ``w = d * (q - 8)``;
* Q4_1 (32, 20): ``f16 d, f16 m``, nibbles as Q4_0; ``w = d * q + m``;
* Q5_0 (32, 22): ``f16 d``, 4 bytes ``qh`` (bit ``j`` of the little-endian
  word: value ``j``'s fifth bit), nibbles as Q4_0; ``w = d * (q - 16)``;
* Q5_1 (32, 24): ``f16 d, f16 m``, ``qh``, nibbles; ``w = d * q + m``;
* IQ4_NL (32, 18): ``f16 d``, nibbles as Q4_0 indexing a fixed table of 16
  levels (``IQ4_LEVELS``); ``w = d * level[q]``;
* Q4_K (256, 144): ``f16 d, f16 dmin``, 12 bytes of eight 6-bit (scale,
  min) pairs, 128 bytes of nibbles; value ``j``: chunk ``j // 64``, nibble
  ``(j // 32) % 2`` of byte ``32 * (j // 64) + j % 32``; sub-block ``j // 32``;
  ``w = d * sc * q - dmin * m``;
* Q5_K (256, 176): Q4_K plus 32 bytes of high bits (value ``j``: bit
  ``j // 32`` of byte ``j % 32``), 5-bit ``q``;
* Q6_K (256, 210): 128 bytes of low nibbles, 64 bytes of 2-bit highs,
  16 int8 scales (one per 16 values), ``f16 d``; ``w = d * sc * (q - 32)``;
* Q2_K (256, 84): 16 bytes of (4-bit scale, 4-bit min) per 16 values, 64
  bytes of 2-bit values, ``f16 d, f16 dmin``; value ``j`` (half ``h = j //
  128``, ``r = j % 128``) is bits ``2 * (r // 32)`` of byte ``32h + r % 32``,
  sub-block ``j // 16``; ``w = d * sc * q - dmin * m``;
* Q3_K (256, 110): 32 bytes ``hmask``, 64 bytes of 2-bit values (as Q2_K),
  12 bytes of sixteen 6-bit scales, ``f16 d``; the third bit of value ``j``
  is bit ``j // 32`` of ``hmask[j % 32]``; ``w = d * (sc - 32) * (q - 4 *
  (1 - bit))``;
* IQ4_XS (256, 136): ``f16 d``, 2 bytes of scale high bits, 4 bytes of
  scale low nibbles (eight 6-bit scales, one per 32 values), 128 bytes of
  IQ4_NL nibbles (16 bytes per 32 values); ``w = d * (sc - 32) * level[q]``.

The Triton kernels (``gguf_triton``) implement the same formulas and are
tested against these functions, which are in turn tested against the
``gguf`` package's own numpy dequantizer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GGMLType:
    name: str
    type_id: int
    block_elems: int
    block_bytes: int

    @property
    def is_quantized(self) -> bool:
        return self.block_elems > 1

    def row_bytes(self, num_elems: int) -> int:
        """Bytes of a row of ``num_elems`` values (must be whole blocks)."""
        if num_elems % self.block_elems:
            raise ValueError(f"a {self.name} row of {num_elems} values is not a whole number of {self.block_elems}-value blocks")
        return num_elems // self.block_elems * self.block_bytes


# ggml type ids, as in the GGUF spec (gguf.GGMLQuantizationType).
GGML_TYPES: dict[int, GGMLType] = {
    t.type_id: t
    for t in (
        GGMLType("F32", 0, 1, 4),
        GGMLType("F16", 1, 1, 2),
        GGMLType("BF16", 30, 1, 2),
        GGMLType("Q8_0", 8, 32, 34),
        GGMLType("Q4_0", 2, 32, 18),
        GGMLType("Q4_1", 3, 32, 20),
        GGMLType("Q5_0", 6, 32, 22),
        GGMLType("Q5_1", 7, 32, 24),
        GGMLType("Q2_K", 10, 256, 84),
        GGMLType("Q3_K", 11, 256, 110),
        GGMLType("Q4_K", 12, 256, 144),
        GGMLType("Q5_K", 13, 256, 176),
        GGMLType("Q6_K", 14, 256, 210),
        GGMLType("IQ4_NL", 20, 32, 18),
        GGMLType("IQ4_XS", 23, 256, 136),
    )
}
GGML_TYPES_BY_NAME = {t.name: t for t in GGML_TYPES.values()}


def _f16(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    return blocks[:, offset : offset + 2].contiguous().view(torch.float16).to(torch.float32)


def _scale_min_k4(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eight 6-bit (scale, min) pairs from Q4_K/Q5_K's 12 bytes: pairs 0-3 are
    the low 6 bits of bytes 0-3 / 4-7; pairs 4-7 take 4 bits from bytes 8-11
    and their top 2 bits from the top of bytes 0-3 / 4-7."""
    s = scales.to(torch.int32)
    low_sc, low_m, mixed = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = torch.cat([low_sc & 63, (mixed & 0xF) | ((low_sc >> 6) << 4)], dim=1)
    mn = torch.cat([low_m & 63, (mixed >> 4) | ((low_m >> 6) << 4)], dim=1)
    return sc.to(torch.float32), mn.to(torch.float32)


def _q8_0(blocks: torch.Tensor) -> torch.Tensor:
    return _f16(blocks, 0) * blocks[:, 2:34].contiguous().view(torch.int8).to(torch.float32)


def _q4_0(blocks: torch.Tensor) -> torch.Tensor:
    qs = blocks[:, 2:18].to(torch.int32)
    values = torch.cat([qs & 0xF, qs >> 4], dim=1) - 8
    return _f16(blocks, 0) * values.to(torch.float32)


def _k_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """128 bytes -> [n, 8, 32]: sub-block 2c is the low nibbles of bytes
    32c..32c+31, sub-block 2c+1 their high nibbles."""
    qs = qs.to(torch.int32).reshape(-1, 4, 1, 32)
    return torch.cat([qs & 0xF, qs >> 4], dim=2).reshape(-1, 8, 32)


def _q4_k(blocks: torch.Tensor) -> torch.Tensor:
    sc, mn = _scale_min_k4(blocks[:, 4:16])
    q = _k_nibbles(blocks[:, 16:144]).to(torch.float32)
    w = (_f16(blocks, 0) * sc)[:, :, None] * q - (_f16(blocks, 2) * mn)[:, :, None]
    return w.reshape(-1, 256)


def _q5_k(blocks: torch.Tensor) -> torch.Tensor:
    sc, mn = _scale_min_k4(blocks[:, 4:16])
    qh = blocks[:, 16:48].to(torch.int32)
    bits = torch.arange(8, dtype=torch.int32, device=blocks.device)
    high = (qh[:, None, :] >> bits[None, :, None]) & 1  # [n, 8 sub-blocks, 32]
    q = (_k_nibbles(blocks[:, 48:176]) | (high << 4)).to(torch.float32)
    w = (_f16(blocks, 0) * sc)[:, :, None] * q - (_f16(blocks, 2) * mn)[:, :, None]
    return w.reshape(-1, 256)


def _q6_k(blocks: torch.Tensor) -> torch.Tensor:
    ql = blocks[:, 0:128].to(torch.int32).reshape(-1, 2, 1, 64)
    low = torch.cat([ql & 0xF, ql >> 4], dim=2).reshape(-1, 256)  # index 128a + 64s + l
    qh = blocks[:, 128:192].to(torch.int32).reshape(-1, 2, 1, 32)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.int32, device=blocks.device).reshape(1, 1, 4, 1)
    high = ((qh >> shifts) & 3).reshape(-1, 256)  # index 128a + 32t + l
    q = ((low | (high << 4)) - 32).to(torch.float32).reshape(-1, 16, 16)
    scales = blocks[:, 192:208].contiguous().view(torch.int8).to(torch.float32)
    return (_f16(blocks, 208) * scales)[:, :, None].mul(q).reshape(-1, 256)


# IQ4_NL / IQ4_XS's 16 non-uniform levels (ggml's kvalues_iq4nl).
IQ4_LEVELS = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def _nibbles_32(qs: torch.Tensor) -> torch.Tensor:
    """16 bytes -> 32 values: low nibbles first, then high nibbles."""
    qs = qs.to(torch.int32)
    return torch.cat([qs & 0xF, qs >> 4], dim=1)


def _fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """4 bytes (a little-endian word) -> bit ``j`` for each of 32 values."""
    bits = torch.arange(8, dtype=torch.int32, device=qh.device)
    return ((qh.to(torch.int32)[:, :, None] >> bits) & 1).reshape(-1, 32)


def _q4_1(blocks: torch.Tensor) -> torch.Tensor:
    return _f16(blocks, 0) * _nibbles_32(blocks[:, 4:20]).to(torch.float32) + _f16(blocks, 2)


def _q5_0(blocks: torch.Tensor) -> torch.Tensor:
    q = _nibbles_32(blocks[:, 6:22]) | (_fifth_bits(blocks[:, 2:6]) << 4)
    return _f16(blocks, 0) * (q - 16).to(torch.float32)


def _q5_1(blocks: torch.Tensor) -> torch.Tensor:
    q = _nibbles_32(blocks[:, 8:24]) | (_fifth_bits(blocks[:, 4:8]) << 4)
    return _f16(blocks, 0) * q.to(torch.float32) + _f16(blocks, 2)


def _iq4_nl(blocks: torch.Tensor) -> torch.Tensor:
    levels = torch.tensor(IQ4_LEVELS, dtype=torch.float32, device=blocks.device)
    return _f16(blocks, 0) * levels[_nibbles_32(blocks[:, 2:18]).long()]


def _two_bit_values(qs: torch.Tensor) -> torch.Tensor:
    """Q2_K/Q3_K's 64 bytes -> 256 2-bit values: value 128h + 32s + l is bits
    2s of byte 32h + l."""
    qs = qs.to(torch.int32).reshape(-1, 2, 1, 32)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.int32, device=qs.device).reshape(1, 1, 4, 1)
    return ((qs >> shifts) & 3).reshape(-1, 256)


def _q2_k(blocks: torch.Tensor) -> torch.Tensor:
    scales = blocks[:, 0:16].to(torch.int32)
    q = _two_bit_values(blocks[:, 16:80]).to(torch.float32).reshape(-1, 16, 16)
    sc, mn = (scales & 0xF).to(torch.float32), (scales >> 4).to(torch.float32)
    w = (_f16(blocks, 80) * sc)[:, :, None] * q - (_f16(blocks, 82) * mn)[:, :, None]
    return w.reshape(-1, 256)


def _q3_k_scales(raw: torch.Tensor) -> torch.Tensor:
    """12 bytes -> sixteen 6-bit scales: scale i has its low 4 bits in byte
    ``i % 8`` (nibble ``i // 8``) and its high 2 bits in byte ``8 + i % 4``
    (bits ``2 * (i // 4)``)."""
    b = raw.to(torch.int32)
    i = torch.arange(16, device=raw.device)
    low = (b[:, i % 8] >> (4 * (i // 8))) & 0xF
    high = (b[:, 8 + i % 4] >> (2 * (i // 4))) & 3
    return low | (high << 4)


def _q3_k(blocks: torch.Tensor) -> torch.Tensor:
    hmask = blocks[:, 0:32].to(torch.int32)
    bits = torch.arange(8, dtype=torch.int32, device=blocks.device)
    high = ((hmask[:, None, :] >> bits[None, :, None]) & 1).reshape(-1, 256)  # value 32b + l: bit b of byte l
    q = _two_bit_values(blocks[:, 32:96]) - 4 * (1 - high)
    scales = (_q3_k_scales(blocks[:, 96:108]) - 32).to(torch.float32)
    w = (_f16(blocks, 108) * scales)[:, :, None] * q.to(torch.float32).reshape(-1, 16, 16)
    return w.reshape(-1, 256)


def _iq4_xs(blocks: torch.Tensor) -> torch.Tensor:
    levels = torch.tensor(IQ4_LEVELS, dtype=torch.float32, device=blocks.device)
    high = blocks[:, 2:4].contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    low = blocks[:, 4:8].to(torch.int32)
    sub = torch.arange(8, device=blocks.device)
    scales = ((low[:, sub // 2] >> (4 * (sub % 2))) & 0xF) | (((high >> (2 * sub)) & 3) << 4)
    q = _nibbles_32(blocks[:, 8:136].reshape(-1, 16)).reshape(-1, 8, 32)
    w = (_f16(blocks, 0) * (scales - 32).to(torch.float32))[:, :, None] * levels[q.long()]
    return w.reshape(-1, 256)


_DEQUANTIZERS = {
    "Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q2_K": _q2_k, "Q3_K": _q3_k,
    "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k, "IQ4_NL": _iq4_nl, "IQ4_XS": _iq4_xs,
}
_PLAIN = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def dequantize_gguf(raw: torch.Tensor, ggml_type: GGMLType, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 ``[..., row_bytes]`` of ``ggml_type`` rows -> ``dtype`` ``[..., K]``."""
    if raw.dtype != torch.uint8:
        raise TypeError(f"GGUF data must be uint8 bytes, got {raw.dtype}")
    row_bytes = raw.shape[-1]
    if row_bytes % ggml_type.block_bytes:
        raise ValueError(f"{row_bytes} bytes per row is not a whole number of {ggml_type.name} blocks")
    num_elems = row_bytes // ggml_type.block_bytes * ggml_type.block_elems
    if ggml_type.name in _PLAIN:
        values = raw.contiguous().view(_PLAIN[ggml_type.name])
        return values.to(dtype)
    blocks = raw.reshape(-1, ggml_type.block_bytes)
    values = _DEQUANTIZERS[ggml_type.name](blocks)
    return values.reshape(*raw.shape[:-1], num_elems).to(dtype)


# Where each quantized type keeps its float16 scale fields, inside a block.
SCALE_OFFSETS = {
    "Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q2_K": (80, 82), "Q3_K": (108,),
    "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_NL": (0,), "IQ4_XS": (0,),
}


def random_gguf_rows(type_name: str, rows: int, cols: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Random ggml rows ``[rows, row_bytes]`` of ``type_name`` with sane float16
    scales (no inf/NaN): inputs for kernel checks and benchmarks."""
    t = GGML_TYPES_BY_NAME[type_name]
    blocks = torch.randint(0, 256, (rows * cols // t.block_elems, t.block_bytes), dtype=torch.uint8, generator=generator)
    for offset in SCALE_OFFSETS[type_name]:
        scales = (torch.rand(blocks.shape[0], 1, generator=generator) * 0.002).to(torch.float16)
        blocks[:, offset : offset + 2] = scales.view(torch.uint8)
    return blocks.reshape(rows, -1)
