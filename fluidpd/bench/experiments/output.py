"""What the experiments print and write: a console for their tables, cell formats, JSON files."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from rich.console import Console


def make_console() -> Console:
    return Console(width=None if sys.stdout.isatty() else 160)


def pct(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1%}"


def ms(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 1e3:,.1f}"


def per_hour(n: int, rate: float | None) -> str:
    """A count of role switches with its rate per hour of trace ("3 (36/h)")."""
    return str(n) if rate is None else f"{n} ({rate:,.0f}/h)"


def write_json(obj, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1, default=_jsonable) + "\n")
    return path


def _jsonable(o):
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)
