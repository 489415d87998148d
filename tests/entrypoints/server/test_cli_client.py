"""``octavo chat`` and ``octavo complete`` against the shared server: what
they print is what the OpenAI routes answer for the same conversation
(greedy), interactive input keeps the chat's history, and errors exit 1 with
the server's message."""

from __future__ import annotations

import io

from octavo.entrypoints.cli.main import main
from tests.entrypoints.server.conftest import API_KEY, MODEL_NAME

GREEDY = ["--max-tokens", "8", "--temperature", "0"]


def client_args(server, mode: str, *extra: str) -> list[str]:
    return [mode, "--url", f"{server.url}/v1", "--api-key", API_KEY, *GREEDY, *extra]


def chat_text(openai_client, messages) -> str:
    response = openai_client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=8, temperature=0)
    return response.choices[0].message.content


def test_quick_chat_and_complete_print_the_answer(server, openai_client, capsys):
    assert main(client_args(server, "chat", "--system-prompt", "You are a fox.", "-q", "Where is the river?")) == 0
    expected = chat_text(openai_client, [{"role": "system", "content": "You are a fox."},
                                         {"role": "user", "content": "Where is the river?"}])
    assert capsys.readouterr().out == expected + "\n"
    assert main(client_args(server, "complete", "-q", "Once upon a time")) == 0
    completion = openai_client.completions.create(model=MODEL_NAME, prompt="Once upon a time", max_tokens=8, temperature=0)
    assert capsys.readouterr().out == completion.choices[0].text + "\n"


def test_interactive_chat_keeps_the_history(server, openai_client, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("Hello\n\nAnd then?\n"))
    assert main(client_args(server, "chat")) == 0
    first = chat_text(openai_client, [{"role": "user", "content": "Hello"}])
    history = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": first},
               {"role": "user", "content": "And then?"}]
    assert capsys.readouterr().out == f"{first}\n{chat_text(openai_client, history)}\n"  # the blank line is skipped


def test_errors_exit_1_with_the_servers_message(server, capsys):
    args = ["chat", "--url", f"{server.url}/v1", "--api-key", "wrong", "-q", "hi"]
    assert main(args) == 1
    assert "401: invalid or missing API key" in capsys.readouterr().err
    assert main(client_args(server, "chat", "--model-name", "nope", "-q", "hi")) == 1
    assert "the model `nope` does not exist" in capsys.readouterr().err
