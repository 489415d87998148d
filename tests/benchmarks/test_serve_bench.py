"""``octavo bench serve`` against a stand-in OpenAI server (plain asyncio, no
Octavo): datasets, streaming endpoints, failures with their errors, the
report and its JSON."""

from __future__ import annotations

import json
import random
from argparse import Namespace

import pytest

from octavo.benchmarks.serve_datasets import count_tokens, sample_requests
from octavo.benchmarks.serve_report import _percentile, parse_goodput
from octavo.core.tokenizer import load_tokenizer
from octavo.entrypoints.cli.main import main
from tests.benchmarks.stand_in_openai import StandInServer

FAILING = {3: "FAIL-503", 7: "FAIL-CHUNK", 11: "FAIL-DROP"}


def write_sharegpt(path, num_rows: int) -> None:
    rows = []
    for index in range(num_rows):
        prompt = f"please tell me a short story about the number {index} and a cat"
        prompt = f"{FAILING[index]} {prompt}" if index in FAILING else prompt
        answer = "once upon a time there was a cat who liked numbers very much"
        rows.append({"id": str(index), "conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": answer}]})
    path.write_text(json.dumps(rows))


def bench(server: StandInServer, tmp_path, *extra: str) -> dict:
    out = tmp_path / "result.json"
    argv = ["bench", "serve", "--base-url", server.url, "--disable-tqdm", "--output-json", str(out), *extra]
    assert main(argv) == 0
    return json.loads(out.read_text())


def test_completions_from_sharegpt_count_failures_with_their_errors(tmp_path, tokenizer_dir, capsys, monkeypatch):
    dataset = tmp_path / "sharegpt.json"
    write_sharegpt(dataset, 30)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-stand-in")
    with StandInServer() as server:
        result = bench(
            server, tmp_path, "--tokenizer", str(tokenizer_dir), "--dataset-name", "sharegpt", "--dataset-path",
            str(dataset), "--num-prompts", "30", "--sharegpt-output-len", "6", "--max-concurrency", "4",
            "--ignore-eos", "--seed", "3", "--goodput", "ttft:60000", "e2el:60000",
        )
    assert result["completed"] == 27 and result["failed"] == 3
    errors = " ".join(error for error, _ in result["errors"])
    assert "HTTP 503" in errors and "the engine failed" in errors and "Error" in errors  # the dropped stream
    assert result["total_output_tokens"] == 27 * 6
    assert result["mean_ttft_ms"] > 0 and result["p99_itl_ms"] > 0 and result["median_tpot_ms"] > 0
    assert result["request_goodput"] == pytest.approx(result["request_throughput"])
    body = server.bodies[-1]
    assert body["stream"] and body["stream_options"] == {"include_usage": True} and body["ignore_eos"] is True
    assert body["model"] == "stand-in" and body["max_tokens"] == 6
    table = capsys.readouterr().out
    assert "Failed requests" in table and "P99 TTFT (ms)" in table and "error x1" in table


def test_chat_with_random_prompts_at_a_request_rate(tmp_path, tokenizer_dir):
    with StandInServer() as server:
        result = bench(
            server, tmp_path, "--tokenizer", str(tokenizer_dir), "--endpoint", "/v1/chat/completions",
            "--dataset-name", "random", "--random-input-len", "24", "--random-output-len", "6",
            "--random-range-ratio", "0.5", "--num-prompts", "12", "--request-rate", "500", "--save-detailed",
        )
    assert result["completed"] == 12 and result["failed"] == 0
    max_tokens = [b["max_tokens"] for b in server.bodies[1:]]  # the first is the untimed check
    assert all(3 <= n <= 9 for n in max_tokens) and len(set(max_tokens)) > 1
    assert result["total_output_tokens"] == sum(max_tokens)
    assert all(b["messages"][0]["role"] == "user" for b in server.bodies)
    assert len(result["requests"]) == 12 and all(r["success"] for r in result["requests"])


def test_datasets_lengths_and_prefixes(tokenizer_dir):
    tokenizer = load_tokenizer(tokenizer_dir)
    args = Namespace(
        dataset_name="random", num_prompts=8, random_input_len=40, random_output_len=7, random_range_ratio=0.0,
        random_prefix_len=0,
    )
    samples = sample_requests(args, tokenizer, random.Random(0))
    assert all(s.expected_output_len == 7 for s in samples)
    assert all(abs(s.prompt_len - 40) <= 4 for s in samples)  # random ids do not always re-encode alike
    assert all(s.prompt_len == count_tokens(tokenizer, s.prompt) for s in samples)
    args = Namespace(
        dataset_name="prefix_repetition", num_prompts=9, prefix_repetition_prefix_len=32,
        prefix_repetition_suffix_len=8, prefix_repetition_num_prefixes=3, prefix_repetition_output_len=5,
    )
    samples = sample_requests(args, tokenizer, random.Random(0))
    heads = {s.prompt[:12] for s in samples}
    assert len(heads) == 3 and all(s.expected_output_len == 5 for s in samples)


def test_goodput_and_percentiles():
    assert parse_goodput(["ttft:500", "tpot:50"]) == {"ttft": 0.5, "tpot": 0.05}
    with pytest.raises(ValueError):
        parse_goodput(["itl:5"])
    assert _percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5 and _percentile([1.0, 2.0], 99) == pytest.approx(1.99)
