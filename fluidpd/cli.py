"""The `fluidpd` command line: one subcommand per module, each registering itself."""
from __future__ import annotations

import argparse
import importlib
import sys

# subcommand name -> module exposing `register(subparsers)`; each sets `func` on its parser.
COMMANDS = {
    "simulate": "fluidpd.sim.cli",
    "generate": "fluidpd.engine.cli",
    "experiment": "fluidpd.bench.cli",
    "serve": "fluidpd.server.cli",
    "bench": "fluidpd.bench.loadgen_cli",
}


class CliError(Exception):
    """A user error on the command line: printed as a message, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own errors also exit 2, with our prefix
        self.print_usage(sys.stderr)
        self.exit(2, f"fluidpd: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fluidpd", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, module in COMMANDS.items():
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("fluidpd"):
                continue  # a command whose module is not built yet
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (CliError, ValueError, FileNotFoundError) as exc:
        print(f"fluidpd {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
