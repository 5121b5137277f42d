"""The replan experiment printed: one row per system, joint attainment overall and per phase."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from fluidpd.bench.experiments.common import split_label
from fluidpd.bench.experiments.output import ms, pct

COLUMNS = ("system", "joint attainment", "P99 TTFT s", "P99 TBT ms", "replans", "role changes", "GPU-s lost")


def print_replan(console: Console, results: dict, history_s: float) -> None:
    phases = [p[2] for p in results["workload"]["phases"]]
    table = Table(
        title=f"replanning: {results['workload']['requests']} requests, start split "
        f"{split_label(results['start_split'])} from the first {history_s:g} s, "
        f"restart {results['restart_s']:.1f} s"
    )
    for col in (*COLUMNS[:2], *phases, *COLUMNS[2:]):
        table.add_column(col, justify="left" if col == "system" else "right")
    for name, r in results["systems"].items():
        table.add_row(
            name,
            pct(r["attainment"]),
            *(pct(r["phase_attainment"][p]) for p in phases),
            f"{r['ttft_p99_s']:.2f}",
            ms(r["tbt_p99_s"]),
            str(sum(1 for p in r["replans"] if p["applied"])),
            str(r["role_changes"]),
            f"{r['gpu_s_lost']:.0f}",
        )
    console.print(table)
