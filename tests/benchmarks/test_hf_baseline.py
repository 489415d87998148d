"""The Hugging Face baseline's modes on a tiny model on the CPU: the compiled
mode (static cache + torch.compile, dynamo only through the "eager" backend
to stay fast) runs warmed up with nothing compiled while timed, a compile in
the timed region fails loudly, and the hand-written loop of
``benchmarks/hf_compiled_loop.py`` decodes the tokens ``generate`` does."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from octavo.benchmarks.hf_baseline import HFGenerate, HFRecompiledError, check_no_recompiles, compile_count, load_hf_model
from octavo.benchmarks.latency import LatencyWorkload, measure_hf

CPU = torch.device("cpu")
LOOP_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "hf_compiled_loop.py"


@pytest.fixture(scope="module")
def hf_model(llama_dir):
    return load_hf_model(llama_dir, torch.float32, CPU, dummy=False)


@pytest.mark.slow
def test_compiled_mode_is_timed_without_compiling(hf_model):
    result = measure_hf(hf_model, hf_model.config.vocab_size, LatencyWorkload(1, 6, 4), 1, CPU, "compiled", backend="eager")
    assert result.ttft_s > 0 and result.decode_s_per_token > 0


@pytest.mark.parametrize("mode", ["static", "eager"])
def test_uncompiled_modes_compile_nothing(hf_model, mode):
    before = compile_count()
    hf = HFGenerate(hf_model, mode, CPU, max_cache_len=12)
    for new_tokens in (4, 1, 4):
        assert hf.seconds([[5, 6, 7, 8]], new_tokens) > 0
    assert compile_count() == before


def test_a_compile_in_the_timed_region_fails_loudly():
    before = compile_count()
    torch.compile(lambda x: x * 2 + 1, backend="eager")(torch.ones(3))
    with pytest.raises(HFRecompiledError, match=r"compiled 1 new graph\(s\) inside the timed region"):
        check_no_recompiles(before, "compiled")


@pytest.mark.slow
def test_hand_written_loop_decodes_what_generate_does(llama_dir, hf_model, tmp_path):
    spec = importlib.util.spec_from_file_location("hf_compiled_loop", LOOP_SCRIPT)
    loop = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loop)
    out = tmp_path / "loop.json"
    args = ["--model", str(llama_dir), "--no-dummy", "--dtype", "float32", "--device", "cpu", "--backend", "eager",
            "--input-len", "6", "--output-len", "5", "--iters", "1", "--warmup", "1", "--output-json", str(out)]
    assert loop.main(args) == 0
    result = json.loads(out.read_text())
    assert result["recompiles_in_timed_runs"] == 0 and result["decode_ms_per_token"] > 0
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(10, hf_model.config.vocab_size - 10, (1, 6), generator=generator)
    with torch.no_grad():
        expected = hf_model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=5,
                                     min_new_tokens=5, do_sample=False)
    assert result["token_ids"] == expected[:, 6:].tolist()
