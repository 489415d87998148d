"""``octavo run-batch``: an OpenAI batch file run offline through the
server's routes; answers equal the offline engine's (greedy), in input
order, with the server's own 4xx for bodies it refuses and an error for
lines that are not requests."""

from __future__ import annotations

import json

from octavo import SamplingParams
from octavo.entrypoints.cli.main import main

MESSAGES = [{"role": "user", "content": "Where is the river?"}]
GREEDY = {"temperature": 0, "max_tokens": 6}


def line(custom_id: str, url: str, body: dict) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def test_a_batch_file_runs_through_the_routes(llama_dir, reference_llm, tmp_path):
    lines = [
        line("chat", "/v1/chat/completions", {"model": "batch", "messages": MESSAGES, **GREEDY}),
        line("completion", "/v1/completions", {"model": "batch", "prompt": "Once upon a time", **GREEDY}),
        line("response", "/v1/responses", {"model": "batch", "input": "Once upon a time", "temperature": 0,
                                           "max_output_tokens": 6, "store": False}),
        line("bad-field", "/v1/chat/completions", {"model": "batch", "messages": MESSAGES, "temperature": "hot"}),
        line("pooling", "/v1/embeddings", {"model": "batch", "input": "hi"}),
        line("bad-url", "/v1/files", {}),
        "not json",
        line("stream", "/v1/completions", {"prompt": "x", "stream": True}),
    ]
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("\n".join(lines) + "\n")
    argv = ["run-batch", str(llama_dir), "-i", str(source), "-o", str(target), "--served-model-name", "batch",
            "--dtype", "float32", "--max-model-len", "2048", "--num-kv-blocks", "256", "--max-concurrency", "3"]
    assert main(argv) == 0
    results = [json.loads(text) for text in target.read_text().splitlines()]
    assert [r["custom_id"] for r in results] == ["chat", "completion", "response", "bad-field", "pooling", "bad-url", None,
                                                 "stream"]
    assert all(r["id"].startswith("batch_req_") for r in results)
    params = SamplingParams(temperature=0.0, max_tokens=6)
    chat, completion, response = (r["response"] for r in results[:3])
    assert chat["status_code"] == 200 and chat["request_id"]
    assert chat["body"]["choices"][0]["message"]["content"] == reference_llm.chat(MESSAGES, params)[0].outputs[0].text
    expected = reference_llm.generate(["Once upon a time"], params)[0].outputs[0].text
    assert completion["body"]["choices"][0]["text"] == expected
    assert response["body"]["output"][0]["content"][0]["text"] == reference_llm.chat(
        [{"role": "user", "content": "Once upon a time"}], params)[0].outputs[0].text
    assert results[3]["response"]["status_code"] == 400 and results[3]["response"]["body"]["error"]["param"] == "temperature"
    assert results[4]["response"]["body"]["error"]["code"] == "unsupported_task"
    assert [r["error"] is not None and r["response"] is None for r in results[5:]] == [True, True, True]
