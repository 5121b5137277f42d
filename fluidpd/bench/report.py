"""Tables and plots of serving results (simulated or measured): one row per policy."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

COLUMNS = [
    ("policy", "policy", "{}"),
    ("requests", "reqs", "{:d}"),
    ("completed", "done", "{:d}"),
    ("attainment", "attain", "{:.1%}"),
    ("strict_attainment", "strict", "{:.1%}"),
    ("ttft_p50_s", "TTFT p50 s", "{:.3f}"),
    ("ttft_p99_s", "TTFT p99 s", "{:.3f}"),
    ("tbt_p50_s", "TBT p50 ms", "ms"),
    ("tbt_p99_s", "TBT p99 ms", "ms"),
    ("tbt_decode_p99_s", "decode TBT p99", "ms"),
    ("tpot_mean_s", "TPOT ms", "ms"),
    ("throughput_tok_s", "tok/s", "{:.0f}"),
    ("prefix_cache_hit_rate", "hit", "{:.1%}"),
    ("prefix_cache_oracle_hit_rate", "oracle hit", "{:.1%}"),
    ("goodput_rate_scale", "goodput x", "{:.2f}"),
    ("sim_wall_s", "wall s", "{:.1f}"),
]


def _fmt(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if fmt == "ms":
        return f"{value * 1e3:.1f}"
    return fmt.format(value)


def print_table(rows: list[dict], title: str = "", console: Console | None = None) -> None:
    console = console or Console(width=None if sys.stdout.isatty() else 180)
    cols = [c for c in COLUMNS if any(c[0] in r for r in rows)]
    table = Table(title=title or None)
    for _, header, _ in cols:
        table.add_column(header, justify="left" if header == "policy" else "right")
    for r in rows:
        table.add_row(*(_fmt(r.get(key), fmt) for key, _, fmt in cols))
    console.print(table)


def write_json(rows: list[dict], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, indent=2, default=float) + "\n")
