"""The ``octavo`` command as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from octavo import LLM, SamplingParams


def octavo(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "octavo.entrypoints.cli.main", *args],
        capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})},
    )


def test_generate_streams_the_same_text_as_the_api(llama_dir):
    result = octavo("generate", "--model", str(llama_dir), "--dtype", "float32", "--max-tokens", "12", "Once upon a time")
    assert result.returncode == 0, result.stderr
    expected = LLM(str(llama_dir), dtype="float32").generate("Once upon a time", SamplingParams(temperature=0, max_tokens=12))
    assert result.stdout == "Once upon a time" + expected[0].outputs[0].text + "\n"
    assert "Loading model" in result.stderr


def test_generate_default_model_works_offline(tmp_path):
    env = {"OCTAVO_CACHE_DIR": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    result = octavo("generate", "--max-tokens", "8", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Once upon a time")


def test_generate_reports_bad_input_cleanly(tmp_path):
    result = octavo("generate", "--model", str(tmp_path / "missing"), "hi")
    assert result.returncode == 2
    assert "error: model" in result.stderr and "not found" in result.stderr
    assert "Traceback" not in result.stderr


def test_env_explains_the_platform_choice():
    result = octavo("env")
    assert result.returncode == 0, result.stderr
    assert "* cpu" in result.stdout and "selected: cpu" in result.stdout
    missing = octavo("env", env={"OCTAVO_PLATFORM": "nonexistent"})
    assert "platform 'nonexistent' (OCTAVO_PLATFORM) is not installed (installed: " in missing.stdout


def test_bench_latency_and_throughput(llama_dir, tmp_path):
    out = tmp_path / "latency.json"
    result = octavo("bench", "latency", "--model", str(llama_dir), "--dtype", "float32", "--batch-size", "2",
                    "--input-len", "8", "--output-len", "4", "--num-iters", "1", "--num-iters-warmup", "0",
                    "--compare-hf", "--hf-mode", "static", "--output-json", str(out))
    assert result.returncode == 0, result.stderr
    assert "TTFT (batch 2 x 8 tokens)" in result.stdout and "decode per token" in result.stdout
    # The table names HF's mode, and the floor says what it counts.
    assert "hf (static: static cache, no compile)" in result.stdout
    assert "floor = max(bytes /" in result.stdout and "KV cache float32" in result.stdout
    data = json.loads(out.read_text())
    assert data["hf_mode"] == "static"
    # Timings on a shared CI machine are noise; only their presence is asserted.
    assert {"ttft_s", "decode_s_per_token"} <= data["octavo"].keys() and data["hf"]["ttft_s"] > 0
    assert data["floor"]["ttft_s"] > 0
    out = tmp_path / "throughput.json"
    result = octavo("bench", "throughput", "--model", str(llama_dir), "--dtype", "float32", "--num-prompts", "4",
                    "--input-len", "8", "--output-len", "4", "--output-json", str(out))
    assert result.returncode == 0, result.stderr
    assert "output tokens/s (4 x 8 in / 4 out)" in result.stdout
    assert "engine steps of the timed run" in result.stdout
    # All four prompts fit one step's budget: one prefill step, then three decode steps.
    summary = json.loads(out.read_text())["step_trace"]["summary"]
    assert summary["prefill/mixed"]["steps"] == 1 and summary["decode"]["steps"] == 3


def test_bench_reports_speculative_decoding(llama_dir, tmp_path):
    out = tmp_path / "throughput.json"
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2})
    result = octavo("bench", "throughput", "--model", str(llama_dir), "--dtype", "float32", "--num-prompts", "4",
                    "--input-len", "16", "--output-len", "24", "--speculative-config", spec, "--output-json", str(out))
    assert result.returncode == 0, result.stderr
    assert "speculative decoding: " in result.stdout and "so speculation may pass it" in result.stdout
    stats = json.loads(out.read_text())["spec_decoding"]
    assert 0 <= stats["num_accepted_tokens"] <= stats["num_draft_tokens"] and stats["num_drafts"] > 0


def test_bench_refuses_an_hf_mode_that_does_not_fit(llama_dir):
    result = octavo("bench", "throughput", "--model", str(llama_dir), "--compare-hf", "--hf-mode", "compiled")
    assert result.returncode == 2
    assert "--hf-mode compiled does not apply to bench throughput (choose from generate_batch)" in result.stderr


def test_version(capsys):
    from octavo.entrypoints.cli.main import main
    from octavo.version import __version__

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out == f"octavo {__version__}\n"


@pytest.mark.parametrize("flag", ["--dtype=float8", "--max-num-seqs=0"])
def test_bad_engine_flags(llama_dir, flag):
    result = octavo("generate", "--model", str(llama_dir), flag, "hi")
    assert result.returncode == 2 and "error:" in result.stderr


def test_the_cli_starts_without_the_serve_extra():
    """A base install has no httpx, fastapi or uvicorn: `octavo --help` and
    `octavo bench serve --help` still build their parsers (CI's `make run`
    caught `bench serve` importing httpx at parser time)."""

    code = (
        "import sys\n"
        "for name in ('httpx', 'fastapi', 'uvicorn', 'orjson'): sys.modules[name] = None\n"
        "from octavo.entrypoints.cli.main import main\n"
        "for argv in (['octavo', '--help'], ['octavo', 'bench', 'serve', '--help']):\n"
        "    sys.argv = argv\n"
        "    try: main()\n"
        "    except SystemExit as exc: assert exc.code == 0, exc.code\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
