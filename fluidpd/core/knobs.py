"""Config dataclass fields as command-line flags, so a default and its help are written once.

    @dataclass
    class PolicyConfig:
        chunk_budget: int = knob(512, "tokens per mixed step (chunked)")

    add_flags(parser, PolicyConfig)           # --chunk-budget INT (default 512)
    PolicyConfig(**flag_values(args, PolicyConfig))

Only fields made with `knob` become flags; validation stays in the dataclass's __post_init__.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any


def knob(default: Any, help: str, *, flag: str | None = None, choices: tuple | None = None) -> Any:
    """A dataclass field with a default, a help string and (optionally) its own flag name."""
    meta = {"help": help, "flag": flag, "choices": choices}
    if isinstance(default, (list, dict, set)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _knobs(cls) -> list[tuple[dataclasses.Field, type]]:
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls) if "help" in f.metadata]


def _scalar(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if args else tp


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def flag_name(f: dataclasses.Field) -> str:
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")


def add_flags(parser: argparse.ArgumentParser | Any, cls, *, skip: tuple[str, ...] = (), **defaults: Any) -> None:
    """One flag per knob of `cls` (but `skip`); `defaults` override a field's default for this parser."""
    for f, tp in _knobs(cls):
        if f.name in skip:
            continue
        default = defaults.get(f.name, _default(f))
        kind = _scalar(tp)
        shown = "" if default is None else f" (default: {default})"
        if kind is bool:
            parser.add_argument(
                flag_name(f),
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=default,
                help=f.metadata["help"] + shown,
            )
        else:
            parser.add_argument(
                flag_name(f),
                dest=f.name,
                type=kind,
                default=default,
                choices=f.metadata["choices"],
                metavar=None if f.metadata["choices"] else kind.__name__.upper(),
                help=f.metadata["help"] + shown,
            )


def flag_values(args: argparse.Namespace, cls, *, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The parsed values of `cls`'s flags, as keyword arguments for `cls`."""
    return {f.name: getattr(args, f.name) for f, _ in _knobs(cls) if f.name not in skip and hasattr(args, f.name)}
