"""The ``octavo`` command: generate, env, serve, bench, plugins, run-batch, and the chat / complete clients."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The command's parser and each subcommand's (each takes ``--config FILE.yaml``)."""
    from octavo.entrypoints.cli.config_file import add_config_flag
    from octavo.version import __version__

    parser = argparse.ArgumentParser(prog="octavo", description="Octavo LLM inference engine")
    parser.add_argument("--version", action="version", version=f"octavo {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    from octavo.entrypoints.cli import env, generate

    generate.add_parser(sub)
    env.add_parser(sub)
    for optional in ("serve", "bench", "plugins", "client", "run_batch"):
        try:
            module = __import__(f"octavo.entrypoints.cli.{optional}", fromlist=["add_parser"])
        except ImportError:
            continue
        module.add_parser(sub)
    for command in sub.choices.values():
        add_config_flag(command)
    return parser, sub.choices


def parse_args(argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed, the values of a ``--config`` file as the command's defaults."""
    from octavo.entrypoints.cli.config_file import apply_config_file
    from octavo.entrypoints.cli.dotted_flags import apply_dotted_flags

    parser, commands = build_parser()
    return parser.parse_args(apply_dotted_flags(apply_config_file(list(argv), commands), commands))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from octavo.errors import OctavoError

    try:
        return int(args.func(args) or 0)
    except OctavoError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
