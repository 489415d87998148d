"""``octavo serve`` arguments: defaults (host, port, default model, served name) and bad values."""

from __future__ import annotations

import argparse

import pytest

from octavo.default_model import DEFAULT_MODEL_NAME
from octavo.entrypoints.cli import serve
from octavo.entrypoints.cli.common import engine_args_from
from octavo.errors import InvalidArgumentError


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    serve.add_parser(sub)
    return parser.parse_args(["serve", *argv])


def test_defaults(monkeypatch):
    monkeypatch.delenv(serve.API_KEY_ENV, raising=False)
    args = parse([])
    assert (args.host, args.port) == ("127.0.0.1", 8000)
    assert engine_args_from(args).model is None  # the built-in default model
    config = serve.server_config_from(args)
    assert config.served_model_names == [DEFAULT_MODEL_NAME]
    assert config.api_key is None


def test_model_path_is_the_served_name_and_env_key(monkeypatch):
    monkeypatch.setenv(serve.API_KEY_ENV, "from-env")
    config = serve.server_config_from(parse(["/models/x", "--max-logprobs", "5"]))
    assert config.served_model_names == ["/models/x"]
    assert config.api_key == "from-env"
    assert engine_args_from(parse(["/models/x", "--max-logprobs", "5"])).max_logprobs == 5
    config = serve.server_config_from(parse(["/models/x", "--served-model-name", "a", "b", "--api-key", "flag"]))
    assert config.served_model_names == ["a", "b"] and config.api_key == "flag"


@pytest.mark.parametrize("argv", [["--max-queued-requests", "-1"], ["--shutdown-timeout", "-2"], ["--max-n", "0"], ["--port", "70000"], ["--root-path", "api"]])
def test_bad_values(argv):
    with pytest.raises(InvalidArgumentError):
        serve.server_config_from(parse(argv))
