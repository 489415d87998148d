"""Instruction counts of compiled kernels' loops for sm_90, without a GPU.

``python -m tests.kernels.sass_loops [NAME_SUBSTRING ...]`` (``TRITON_INTERPRET``
unset) compiles the ``aot_compile`` cases (and the quantized GEMMs of
``tests/quantization/test_triton_compile.py``, names starting ``quant``)
whose names contain a substring,
disassembles the cubin with the ``cuobjdump`` Triton ships, and prints, for each
backward branch (a loop), its instruction count, the barriers, shared-memory
round trips and global loads in it, and the kernel's registers and spills.
``SASS_OVERRIDE="BLOCK_N=8,SPLIT=16,num_warps=8"`` compiles the chosen cases at
other constexprs and warps (a kernel's default tiles, a sweep's candidates).
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


def quant_cases():
    """``(name, kernel, constexprs, pointer types, options)`` of the quantized GEMMs' compile cases,
    and the GGUF decode GEMV of each type."""
    from octavo.kernels.quant import gguf_triton
    from octavo.kernels.quant.gguf_dequant import GGML_TYPES_BY_NAME
    from tests.quantization.test_triton_compile import QUANT_KERNELS

    for name, (kernel, consts, pointers, options) in QUANT_KERNELS.items():
        yield f"quant {name}", kernel, consts, pointers, options
    for type_name, code in gguf_triton._CODES.items():
        a, b = gguf_triton._PLANES[type_name]
        ggml = GGML_TYPES_BY_NAME[type_name]
        sb_bytes = 256 // ggml.block_elems * ggml.block_bytes
        consts = dict(TYPE=code, A=a, B=b, SB_BYTES=sb_bytes, BLOCK_M=2, BLOCK_N=4, STEPS=2)
        yield f"quant gguf gemv {type_name}", gguf_triton._gguf_gemv_kernel, consts, {"w_ptr": "*u8"}, {}
        consts = dict(TYPE=code, A=a, B=b, SB_BYTES=sb_bytes, BLOCK_N=8, STEPS=1, PDL=False)
        yield f"quant gguf gemv 1-token {type_name}", gguf_triton._gguf_gemv_one_kernel, consts, {"w_ptr": "*u8"}, {
            "num_warps": 1}


def overrides_from_env() -> tuple[dict, dict]:
    """``SASS_OVERRIDE="BLOCK_N=8,SPLIT=16,num_warps=8"``: integer constexprs and compile
    options (``num_warps``, ``num_stages``) that replace the cases' own, to read a
    kernel's loop at other tiles than its case's."""
    consts, options = {}, {}
    for item in filter(None, os.environ.get("SASS_OVERRIDE", "").split(",")):
        key, value = (part.strip() for part in item.split("="))
        (options if key in ("num_warps", "num_stages") else consts)[key] = int(value)
    return consts, options


def all_cases(names: list[str]):
    """``(name, compile thunk)`` of every case whose name contains one of ``names`` (all when empty)."""
    target = GPUTarget("cuda", 90, 32)
    more_consts, more_options = overrides_from_env()
    for name, kernel, consts, tiles in cases():
        options = dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages) if tiles else {}
        yield name, lambda k=kernel, c={**consts, **more_consts}, o={**options, **more_options}, n=name: compile_one(
            k, c, target, **o, pointers=case_pointers(n))
    if names and not any(n.startswith("quant") for n in names):
        return
    for name, kernel, consts, pointers, options in quant_cases():
        yield name, lambda k=kernel, c={**consts, **more_consts}, p=pointers, o={**options, **more_options}: compile_one(
            k, c, target, **o, pointers=p)


def main(names: list[str]) -> None:
    for name, build in all_cases(names):
        if names and not any(n in name for n in names):
            continue
        compiled = build()
        code = disassemble(compiled.asm["cubin"])
        print(f"{name}: {len(code)} instructions, {resources(compiled.asm['cubin'])}")
        for start, end in loops(code):
            print(f"  loop {start:#06x}-{end:#06x}: {summarize(code, start, end)}")
            if os.environ.get("SASS_OPCODES"):
                kinds = collections.Counter(op for address, op, _ in code if start <= address <= end)
                print("   ", ", ".join(f"{op} {n}" for op, n in kinds.most_common()))


if __name__ == "__main__":
    main(sys.argv[1:])
