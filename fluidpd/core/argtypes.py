"""Argument types shared by the command-line tools (the `fluidpd` subcommands and the experiments)."""

from __future__ import annotations

import argparse
import math


def positive(kind):
    """An argparse type: `kind(text)`, which must be > 0 (a clear message otherwise)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
        return value

    return parse


def names_of(known, what: str = "workload"):
    """An argparse type: a comma-separated list of names, each in `known` (a clear message otherwise)."""

    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        bad = [n for n in names if n not in known]
        if not names or bad:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(bad) or text!r}; choose from {', '.join(known)}"
            )
        return names

    return parse
