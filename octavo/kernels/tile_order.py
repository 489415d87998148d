"""The order in which a 2-D GEMM grid walks its output tiles (device side).

Program ``pid`` of a 1-D grid over ``cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N)``
tiles takes tile ``(pid_m, pid_n)`` in groups of ``GROUP_M`` row tiles:
consecutive programs cover a few row tiles across all column tiles, so
programs that read the same weight columns run close together and find them
in L2. Shared by the quantized GEMMs (fp8 block, grouped int4/int8, GGUF).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """``(pid_m, pid_n)``: the output tile of program ``pid``."""
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    return pid_m, pid_n


@triton.jit
def program_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's tile as ``(offs_m, offs_n, mask_m, mask_n, rows_m, rows_n)``:
    row and column offsets, their in-range masks, and the int64 row indices
    to read, out-of-range ones pointed at row 0 (their results are never
    stored), so that loads in the K loop need no masks along M or N."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    rows_m = tl.where(mask_m, offs_m, 0).to(tl.int64)
    rows_n = tl.where(mask_n, offs_n, 0).to(tl.int64)
    return offs_m, offs_n, mask_m, mask_n, rows_m, rows_n
