"""``octavo env`` and ``octavo plugins``: what they print and exit with."""

from __future__ import annotations

import subprocess
import sys

from octavo.entrypoints.cli.main import main
from tests.plugins.fake_plugins import platform_source

GOOD = 'OCTAVO_PLUGIN_API_VERSION = "1.0"\n'


def test_env_explains_the_choice(fresh_plugins, capsys):
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "platforms (rule: --platform or OCTAVO_PLATFORM if set; else the highest priority" in out
    assert " * cpu      priority    0  available   [octavo_builtin] always available" in out
    assert "   tpu      priority   80  unavailable [octavo_builtin] torch_xla is not installed" in out
    assert "selected: cpu (highest priority (0) among available platforms)" in out
    assert "  device type: cpu, distributed backend: gloo" in out
    assert "  attention backends, preferred first: torch_paged (installed)" in out
    assert "environment: no OCTAVO_* overrides" in out


def test_env_shows_broken_plugins_overrides_and_failed_requests(sandbox, monkeypatch, capsys):
    sandbox.add("broken_vendor", "raise ImportError('libvendor.so not found')\n", header=False)
    monkeypatch.setenv("OCTAVO_PLATFORM", "tpu")
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "environment: OCTAVO_PLATFORM=tpu" in out
    assert "  broken plugin broken_vendor (skipped): import failed: ImportError: libvendor.so not found" in out
    assert "selected: none (platform 'tpu' (OCTAVO_PLATFORM) is installed but not usable here: torch_xla is not installed)" in out


def test_env_shows_a_replaced_platform(sandbox, capsys):
    sandbox.add("vendor_cpu", GOOD + platform_source("C", "cpu", 0) + "\n@hookimpl\ndef octavo_platforms():\n    return [C]\n")
    assert main(["env"]) == 0
    assert "[vendor_cpu, replaces octavo_builtin's]" in capsys.readouterr().out


def test_plugins_list(sandbox, capsys):
    sandbox.add("typo", GOOD + "@hookimpl\ndef octavo_modles():\n    return {}\n")
    assert main(["plugins", "list"]) == 0
    out = capsys.readouterr().out
    assert "  octavo_builtin (octavo.plugins.builtin, plugin API 1.7)" in out
    assert "  BROKEN typo: it implements unknown hook 'octavo_modles'" in out
    assert "  [octavo_builtin] static_paged, torch_paged" in out
    models_line = next(line for line in out.splitlines() if "LlamaForCausalLM" in line)
    assert models_line.startswith("  [octavo_builtin] ")
    models = models_line.removeprefix("  [octavo_builtin] ").split(", ")
    assert models == sorted(models)
    assert {
        "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "BertModel",
        "MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "OlmoeForCausalLM",
        "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM",
        "Phi3ForCausalLM", "Olmo2ForCausalLM", "GraniteForCausalLM",
    } <= set(models)


def test_plugins_check_cpu(fresh_plugins, capsys):
    assert main(["plugins", "check", "cpu", "--only", "interface,kv_cache,attention"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "octavo conformance suite, platform cpu"
    assert [line.split()[:2] for line in lines[1:4]] == [["PASSED", "interface"], ["PASSED", "kv_cache"], ["PASSED", "attention"]]
    assert lines[-1] == "3 passed, 0 skipped, 0 failed"


def test_plugins_check_a_failing_platform_exits_1(sandbox, capsys):
    # A platform whose attention backend computes garbage.
    sandbox.add(
        "wrong_math",
        GOOD
        + platform_source("W", "wrong", -1)
        + """
    attention_backends = ("wrong_paged",)

from octavo.runtime.attention.torch_paged import TorchPagedAttention

class WrongPaged(TorchPagedAttention):
    name = "wrong_paged"

    def forward(self, query, key, value, kv_cache, metadata):
        return super().forward(query, key, value, kv_cache, metadata) * 1.01

@hookimpl
def octavo_platforms():
    return [W]

@hookimpl
def octavo_attention_backends():
    return {"wrong_paged": WrongPaged}
""",
    )
    assert main(["plugins", "check", "wrong", "--only", "attention"]) == 1
    out = capsys.readouterr().out
    assert "  FAILED  attention  wrong_paged float32 heads=4/4 d=32 window=None: max abs error" in out
    assert out.splitlines()[-1] == "0 passed, 0 skipped, 1 failed"


def test_plugins_check_unknown_platform_and_check(fresh_plugins, capsys):
    assert main(["plugins", "check", "cpu", "--only", "speed"]) == 2
    known = "interface, kv_cache, attention, fused_rotary, ops, quantization, model, plugin_models, two_devices"
    assert f"error: unknown check(s) speed (known: {known})" in capsys.readouterr().err
    assert main(["plugins", "check", "quantum"]) == 2
    assert "error: platform 'quantum' (--platform) is not installed" in capsys.readouterr().err


def test_engine_and_conformance_never_import_pydantic_or_fastapi(llama_dir, tmp_path):
    # The GPU image has no pydantic/fastapi: block them and run the engine and the suite.
    script = f"""
import sys

for name in ("pydantic", "fastapi", "uvicorn", "pytest"):
    sys.modules[name] = None  # any import of them now raises ImportError
from octavo import LLM, SamplingParams
llm = LLM({str(llama_dir)!r}, dtype="float32", max_model_len=128, num_kv_blocks=32)
out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
assert len(out[0].outputs[0].token_ids) == 4
from octavo.entrypoints.cli.main import main
checks = "interface,kv_cache,attention,fused_rotary,ops,quantization,model,two_devices"
code = main(["plugins", "check", "cpu", "--only", checks, "--workdir", {str(tmp_path)!r}])
print("exit", code)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("6 passed, 2 skipped, 0 failed\nexit 0"), result.stdout


def test_conformance_suite_runs_under_pytest(tmp_path):
    command = [
        sys.executable, "-m", "pytest", "--pyargs", "octavo.testing.conformance",
        "--octavo-platform", "cpu", "-k", "interface or kv_cache", "-p", "no:cacheprovider", "-q",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed, 7 deselected" in result.stdout
