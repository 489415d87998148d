"""``--config FILE.yaml`` (vLLM's): a command's options from a YAML file,
flags on the command line winning; vLLM's short number forms (32k, 8G);
bad files and values stop the command naming the key."""

from __future__ import annotations

import pytest

from octavo.entrypoints.cli.common import human_readable_int
from octavo.entrypoints.cli.main import parse_args


def write(tmp_path, text: str):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


def test_the_files_values_are_the_defaults_and_flags_win(tmp_path):
    config = write(tmp_path, """
model: org/from-the-file
port: 6379
tensor_parallel_size: 2
max-model-len: 32k
enable-prefix-caching: false
no-ui: true
served-model-name: [a, b]
hf-overrides: {rope_theta: 10000.0}
speculative_config:
  method: ngram
  num_speculative_tokens: 4
kv-cache-memory-bytes: 8G
gpu-memory-utilization: 0.5
uvicorn-log-level: warning
""")
    args = parse_args(["serve", "--config", config, "--port", "8001"])
    assert args.model == "org/from-the-file" and args.port == 8001 and args.tensor_parallel_size == 2
    assert args.max_model_len == 32000 and args.kv_cache_memory_bytes == 8 * 2**30
    assert args.enable_prefix_caching is False and args.enable_ui is False
    assert args.served_model_name == ["a", "b"] and args.hf_overrides == {"rope_theta": 10000.0}
    assert args.speculative_config == {"method": "ngram", "num_speculative_tokens": 4}
    assert args.gpu_memory_utilization == 0.5 and args.uvicorn_log_level == "warning"
    # The positional model on the command line wins over the file's; so does a switch.
    args = parse_args(["serve", "my/model", f"--config={config}", "--enable-prefix-caching"])
    assert args.model == "my/model" and args.enable_prefix_caching is True
    # Other commands read it too (--model is an option there).
    assert parse_args(["generate", "--config", write(tmp_path, "model: x\nmax-num-seqs: 3\n")]).max_num_seqs == 3


@pytest.mark.parametrize(
    "text, message",
    [
        ("colour: blue\n", "unknown option 'colour'"),
        ("port: [1, 2]\n", "port takes one value"),
        ("enforce-eager: yes please\n", "enforce-eager is a switch"),
        ("port: eighty\n", "port"),
        ("scheduling-policy: lifo\n", "must be one of"),
        ("max-model-len: 1.5K\n", "max-model-len"),
        ("trust-remote-code: true\n", "never runs code"),
        ("tokenizer-mode: mistral\n", "mistral_common"),
        ("- a\n- b\n", "must hold a mapping"),
        ("port: [\n", "not valid YAML"),
    ],
)
def test_bad_files_name_the_key(tmp_path, capsys, text, message):
    with pytest.raises(SystemExit):
        parse_args(["serve", "--config", write(tmp_path, text)])
    assert message in capsys.readouterr().err


def test_a_missing_file(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_args(["serve", "--config", str(tmp_path / "absent.yaml")])
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text, value", [("8192", 8192), ("32k", 32000), ("25.6k", 25600), ("32K", 32768), ("1M", 2**20), ("2g", 2 * 10**9)]
)
def test_human_readable_numbers(text, value):
    assert human_readable_int(text) == value


@pytest.mark.parametrize("text", ["1.5K", "k", "12x", "0.0001k", ""])
def test_bad_numbers(text):
    import argparse

    with pytest.raises(argparse.ArgumentTypeError):
        human_readable_int(text)


def test_dotted_json_flags():
    """vLLM's ``--speculative-config.method mtp`` form, nested keys, JSON values, merged in order."""
    args = parse_args([
        "serve", "m", "--speculative-config.method", "ngram", "--speculative-config.num_speculative_tokens=3",
        "--hf-overrides", '{"a": 1}', "--hf-overrides.rope_parameters.rope_theta", "1e6",
        "--hf-overrides.rope_parameters.rope_type", "default", "--port", "9",
    ])
    assert args.speculative_config == {"method": "ngram", "num_speculative_tokens": 3}
    assert args.hf_overrides == {"a": 1, "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}}
    assert args.port == 9 and args.model == "m"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--speculative-config.method"], "needs a value"),
        (["--speculative-config..x", "1"], "empty key"),
        (["--hf-overrides.a", "1", "--hf-overrides.a.b", "2"], "already a value"),
        (["--port.x", "1"], "unrecognized arguments"),
    ],
)
def test_bad_dotted_flags(capsys, argv, message):
    with pytest.raises(SystemExit):
        parse_args(["serve", *argv])
    assert message in capsys.readouterr().err


def test_image_flags_reach_the_engine_args():
    from octavo.entrypoints.cli.common import engine_args_from

    args = parse_args(["serve", "some/model", "--limit-mm-per-prompt", '{"image": 3}',
                       "--allowed-local-media-path", "/srv/media"])
    engine_args = engine_args_from(args)
    assert engine_args.limit_mm_per_prompt == {"image": 3} and engine_args.allowed_local_media_path == "/srv/media"
    dotted = parse_args(["serve", "some/model", "--limit-mm-per-prompt.image", "0"])  # vLLM's dotted form
    assert engine_args_from(dotted).limit_mm_per_prompt == {"image": 0}
