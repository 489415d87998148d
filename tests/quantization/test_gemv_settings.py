"""The one-token quantized GEMVs' settings for A/B and tuning runs: an on/off
switch each (``1`` by default, ``0`` sends calls to the general kernel) and a
tiles override, read once per process and checked when the CUDA platform checks
its config at startup: a malformed value fails there, naming the variable (an
``InvalidArgumentError`` for a switch, a ``ValueError`` for tiles), not mid-run."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest

pytest.importorskip("triton", reason="Triton is not installed")

# (module, its switch function, the switch's variable, tiles variable, a value, the tiles it means)
SETTINGS = [
    ("int4_triton", "rows_gemv_enabled", "OCTAVO_INT4_GEMV_ROWS", None, None, None),
    ("int4_gemv_rows", None, None, "OCTAVO_INT4_GEMV_ROWS_TILES", "8,8,8,0", ("RowsTiles", (8, 8, 8, 0))),
    ("int4_gemv_rows", None, None, "OCTAVO_INT4_GEMV_ROWS_TILES", "8,8,8,1,0,3", ("RowsTiles", (8, 8, 8, 1, 0, 3))),
    ("gguf_q4k_pairs", "pairs_enabled", "OCTAVO_GGUF_Q4K_PAIRS", "OCTAVO_GGUF_Q4K_PAIRS_TILES", "16,1,4",
     ("PairsTiles", (16, 1, 4))),
    ("gguf_q6k_pairs", "pairs_enabled", "OCTAVO_GGUF_Q6K_PAIRS", "OCTAVO_GGUF_Q6K_PAIRS_TILES", "8,2,4,3",
     ("PairsTiles", (8, 2, 4, 3))),
    ("fp8_gemv_rows", "rows_enabled", "OCTAVO_FP8_GEMV_ROWS", "OCTAVO_FP8_GEMV_ROWS_TILES", "64,1,4",
     ("Fp8RowsTiles", (64, 1, 4))),
]


@pytest.mark.parametrize("module_name,switch,switch_env,tiles_env,tiles_value,tiles", SETTINGS)
def test_switch_and_tiles_from_the_environment(monkeypatch, module_name, switch, switch_env, tiles_env, tiles_value,
                                                tiles):
    from octavo.errors import InvalidArgumentError
    from octavo.platforms.cuda import CudaPlatform

    module = importlib.import_module(f"octavo.kernels.quant.{module_name}")
    cached = [getattr(module, name) for name in (switch, tiles_env and "tiles_from_env") if name]
    try:
        if tiles_env:
            monkeypatch.setenv(tiles_env, tiles_value)
            module.tiles_from_env.cache_clear()  # an earlier test's launch may have read it
            class_name, fields = tiles
            assert module.tiles_from_env() == getattr(module, class_name)(*fields)
            module.tiles_from_env.cache_clear()
            monkeypatch.setenv(tiles_env, "8,8")
            with pytest.raises(ValueError, match=tiles_env):
                CudaPlatform().check_config(SimpleNamespace(dtype="bfloat16"))
            monkeypatch.delenv(tiles_env)
            module.tiles_from_env.cache_clear()
        if switch:
            for value, expected in (("0", False), ("1", True)):
                monkeypatch.setenv(switch_env, value)
                getattr(module, switch).cache_clear()
                assert getattr(module, switch)() is expected
            monkeypatch.setenv(switch_env, "yes")
            getattr(module, switch).cache_clear()
            with pytest.raises(InvalidArgumentError, match=switch_env):
                CudaPlatform().check_config(SimpleNamespace(dtype="bfloat16"))
    finally:
        for function in cached:
            function.cache_clear()
