"""The `fluidpd` command line: one module per subcommand, registered by name, loaded on use."""

from __future__ import annotations

import argparse
import importlib
import sys

from fluidpd.core.registry import Registry

# subcommand -> module exposing `register(subparsers)`, which sets `func` on its parser
COMMANDS: Registry[str] = Registry("command")
for _name in ("serve", "top", "simulate", "experiment", "place", "bench", "generate", "profile"):
    COMMANDS.add(_name, f"fluidpd.cli.{_name}")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own errors also exit 2, with our prefix
        self.print_usage(sys.stderr)
        self.exit(2, f"fluidpd: error: {message}\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or of `command` alone (its module only is imported: `fluidpd serve`
    does not load the experiments' plotting, nor does the worker it spawns)."""
    parser = _Parser(prog="fluidpd", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in [command] if command in COMMANDS else COMMANDS:
        importlib.import_module(COMMANDS.get(name)).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as exc:
        print(f"fluidpd {args.command}: error: {exc}", file=sys.stderr)
        return 2
