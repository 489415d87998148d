"""Tile shapes of the grouped MoE kernels (``fused_moe.py``).

``moe_tiles`` picks the gate-up kernel's tiles (and the alignment's
``block_m``) by the average number of tokens per expert; the down kernel
takes the same unless ``grouped_down_tiles`` says otherwise: its K is the
expert width (768 for Qwen3-MoE: six steps of 128) and each column tile
re-reads the block's activation rows, so a wider column tile may pay there
where it does not for the gate-up (``OCTAVO_MOE_GROUPED_DOWN_TILES`` for
tuning runs, ``benchmarks/moe_gpu.py --down-sweep``).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from octavo.kernels.triton_utils import ints_from_env


@dataclass(frozen=True)
class MoeTiles:
    block_m: int  # sorted slots per block (each block holds one expert's tokens)
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


# By average tokens per expert (T * k / E), smallest first. Decode (a few
# tokens per expert, memory-bound: every program streams weight tiles) takes
# the smallest block_m that tl.dot allows; from ~64 tokens an expert a tile
# that holds all of an expert's tokens wins: each expert's weights are then
# read once. Swept on an H100 at Qwen3-30B-A3B's shapes (round 33,
# benchmarks/moe_gpu.py --sweep; 25-64 shapes per size, us per layer):
# 32 an expert (512 tokens) 597 with the 32-row tile, the best of all (deeper
# pipelines and wider K lost); 64 an expert 718 with 128 rows against 763
# with 32; 128 an expert 895 against 970 with 64; 512 an expert 2,041-2,063
# with 128 rows, the best three. Between 32 and 64 (not measured) the 64-row
# tile, within 3% of the best at both ends. OCTAVO_MOE_TILES overrides.
_TILE_TABLE = (
    (16, MoeTiles(16, 64, 128, 4, 4)),
    (32, MoeTiles(32, 64, 128, 4, 3)),
    (48, MoeTiles(64, 128, 64, 4, 4)),
    (None, MoeTiles(128, 128, 64, 8, 3)),
)


@functools.cache
def _tiles_from_env() -> MoeTiles | None:
    parts = ints_from_env("OCTAVO_MOE_TILES", "block_m,block_n,block_k,num_warps,num_stages", (5,))
    return None if parts is None else MoeTiles(*parts)


def moe_tiles(num_tokens: int, top_k: int, num_experts: int) -> MoeTiles:
    """The tile shape for a batch of ``num_tokens`` routed to ``top_k`` of ``num_experts``."""
    override = _tiles_from_env()
    if override is not None:
        return override
    per_expert = num_tokens * top_k / max(num_experts, 1)
    return next(tiles for limit, tiles in _TILE_TABLE if limit is None or per_expert <= limit)


# Shared memory one gate-up program's pipeline may fill: every stage holds an
# activation tile and the gate and up weight tiles. 160 KiB fits Hopper (227)
# and Ampere (164) and keeps the bf16 tiles above; float32 halves what fits.
SHARED_MEMORY_BUDGET = 160 * 1024


def fit_shared_memory(tiles: MoeTiles, element_size: int, budget: int = SHARED_MEMORY_BUDGET) -> MoeTiles:
    """``tiles`` with fewer stages, then a narrower K, until the gate-up
    kernel's pipeline fits ``budget`` bytes at ``element_size`` bytes a value
    (float32 on the large tiles once asked for 288 KiB: refused on an H100)."""
    stage_bytes = lambda t: (t.block_m + 2 * t.block_n) * t.block_k * element_size  # noqa: E731
    while stage_bytes(tiles) * tiles.num_stages > budget:
        if tiles.num_stages > 2:
            tiles = dataclasses.replace(tiles, num_stages=tiles.num_stages - 1)
        elif tiles.block_k > 16:
            tiles = dataclasses.replace(tiles, block_k=tiles.block_k // 2)
        else:
            break
    return tiles


@dataclass(frozen=True)
class DownTiles:
    """What the grouped down kernel may set apart from the gate-up's tiles
    (its ``block_m`` is the alignment's)."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


# The grouped down kernel's own tiles under the largest gate-up tile (128 rows: prefill), for
# narrow experts (K, the expert width, at most 1,024): 256 columns a program read each block's
# activation rows half as often. H100, round 41 (Qwen3-30B-A3B, 8,192 tokens, moe_gpu.py
# --down-sweep): a layer 1,965 -> 1,719 us (3 stages: 1,778; outputs bit for bit the same). Four
# stages take 192 KiB of shared memory in bf16: taken only where the device has that much (not
# an A100's 164 KiB; never float32's 384 KiB, which an H100 refused at launch).
WIDE_DOWN = DownTiles(256, 64, 8, 4)


def _down_pipeline_bytes(block_m: int, down: DownTiles, element_size: int) -> int:
    """Shared memory the down kernel's pipeline asks: each stage an activation and a weight tile."""
    return (block_m + down.block_n) * down.block_k * element_size * down.num_stages


def default_down_tiles(tiles: MoeTiles, expert_width: int, shared_memory: int, element_size: int = 2) -> DownTiles | None:
    """The down kernel's tiles where they differ from the gate-up's ``tiles`` by default, else None."""
    fits = _down_pipeline_bytes(tiles.block_m, WIDE_DOWN, element_size) <= shared_memory
    if tiles.block_m == 128 and expert_width <= 1024 and fits:
        return WIDE_DOWN
    return None


@functools.cache
def _down_tiles_from_env() -> DownTiles | None:
    parts = ints_from_env("OCTAVO_MOE_GROUPED_DOWN_TILES", "block_n,block_k,num_warps,num_stages", (4,))
    return None if parts is None else DownTiles(*parts)


def grouped_down_tiles(tiles: MoeTiles, down: DownTiles | None = None, default: DownTiles | None = None) -> MoeTiles:
    """The grouped down kernel's tiles: the gate-up's ``tiles`` with ``down``'s
    (tuning runs), ``OCTAVO_MOE_GROUPED_DOWN_TILES``'s or ``default``'s
    (``default_down_tiles``) fields in their place."""
    down = down or _down_tiles_from_env() or default
    return tiles if down is None else dataclasses.replace(tiles, **dataclasses.asdict(down))
