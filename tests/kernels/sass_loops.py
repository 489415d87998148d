"""Instruction counts of compiled kernels' loops for sm_90, without a GPU.

``python -m tests.kernels.sass_loops [NAME_SUBSTRING ...]`` (``TRITON_INTERPRET``
unset) compiles the ``aot_compile`` cases whose names contain a substring,
disassembles the cubin with the ``cuobjdump`` Triton ships, and prints, for each
backward branch (a loop), its instruction count, the barriers, shared-memory
round trips and global loads in it, and the kernel's registers and spills.
A layout conversion inside a GEMV's loop shows as ``BAR``/``STS``/``LDS``
pairs; it is what this report is for: the cost per weight value is read off
before a GPU run is spent on it.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget

from tests.kernels.aot_compile import case_pointers, cases, compile_one

LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
BRANCH_TARGET = re.compile(r"BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))")


def cuobjdump(cubin: bytes, flag: str) -> str:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True, check=True).stdout


def disassemble(cubin: bytes) -> list[tuple[int, str, str]]:
    """``(address, opcode, operands)`` of every instruction in ``cubin``."""
    return [(int(m[1], 16), m[3], m[4]) for m in LINE.finditer(cuobjdump(cubin, "-sass"))]


def resources(cubin: bytes) -> str:
    """Registers and stack (spills) per thread, as ``cuobjdump -res-usage`` reports them."""
    usage = re.search(r"REG:(\d+) STACK:(\d+)", cuobjdump(cubin, "-res-usage"))
    return f"{usage[1]} registers, stack {usage[2]} bytes" if usage else "resources unknown"


def loops(code: list[tuple[int, str, str]]) -> list[tuple[int, int]]:
    """``(start, end)`` addresses of each backward branch's body."""
    found = []
    for address, opcode, operands in code:
        target = BRANCH_TARGET.search(opcode + operands)
        if opcode.startswith("BRA") and target and target[1] and int(target[1], 16) < address:
            found.append((int(target[1], 16), address))
    return found


def summarize(code, start: int, end: int) -> str:
    body = [op for address, op, _ in code if start <= address <= end]
    kinds = collections.Counter(op.split(".")[0] for op in body)
    loads = sum(1 for op in body if op.startswith("LDG"))
    return (f"{len(body)} instructions: {kinds['BAR']} BAR, {kinds['STS']} STS, {kinds['LDS'] + kinds['LDSM']} LDS, "
            f"{loads} LDG, {kinds['FFMA']} FFMA, {kinds['HMMA']} HMMA")


def main(names: list[str]) -> None:
    target = GPUTarget("cuda", 90, 32)
    for name, kernel, consts, tiles in cases():
        if names and not any(n in name for n in names):
            continue
        options = dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages) if tiles else {}
        compiled = compile_one(kernel, consts, target, **options, pointers=case_pointers(name))
        code = disassemble(compiled.asm["cubin"])
        print(f"{name}: {len(code)} instructions, {resources(compiled.asm['cubin'])}")
        for start, end in loops(code):
            print(f"  loop {start:#06x}-{end:#06x}: {summarize(code, start, end)}")
            if os.environ.get("SASS_OPCODES"):
                kinds = collections.Counter(op for address, op, _ in code if start <= address <= end)
                print("   ", ", ".join(f"{op} {n}" for op, n in kinds.most_common()))


if __name__ == "__main__":
    main(sys.argv[1:])
