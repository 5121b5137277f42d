"""Table 2 printed: FluidRole's phase medians, then the restart tables (FP8, FP16, the seed's own)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from fluidpd.bench.experiments.common import MODEL
from fluidpd.bench.experiments.output import ms

PHASE_COLUMNS = ("drain", "remap", "dispatch", "route", "total")
RESTART_COLUMNS = ("mechanism", "weight reload (s)", "context rebuild (s)", "total downtime (s)", "x FluidRole")


def print_fluidrole(console: Console, res: dict) -> None:
    fr = res["fluidrole"]
    med = fr["median_s"]
    how = (
        "forced mid-phase by admin switches (the pressure indices triggered no decode->prefill switch)"
        if fr["forced"]
        else "triggered by PPI/DPI"
    )
    console.print(
        f"FluidRole on phase_shift ({res['setting']['requests']} requests, {res['setting']['window_s']:g} s): "
        f"{fr['transitions']} transitions, {how}"
    )
    phases = Table(title="FluidRole phase durations, medians (ms)")
    phases.add_column("transitions")
    for col in ("count", *PHASE_COLUMNS):
        phases.add_column(col, justify="right")
    phases.add_row("all", str(fr["transitions"]), *(ms(med[p]) for p in PHASE_COLUMNS))
    for d, v in fr["by_direction"].items():
        phases.add_row(d, str(v["count"]), *(ms(v["median_s"][p]) for p in PHASE_COLUMNS))
    console.print(phases)
    console.print(
        f"  all transitions: min total {fr['min_total_s'] * 1e3:.0f} ms, max {fr['max_total_s'] * 1e3:.0f} ms; "
        f"Table 2's FluidRole row is the decode->prefill median ({fr['table_total_s'] * 1e3:.0f} ms), "
        f"the seed's 280 ms case"
    )


def print_restarts(console: Console, res: dict) -> None:
    rm = res["restart_model"]
    console.print(
        f"restart model: disk {rm['disk_bw_bytes_s'] / 1e9:.2f} GB/s (140 GB / 82.4 s), shared memory "
        f"{rm['shm_bw_bytes_s'] / 1e9:.2f} GB/s (140 GB / 14.1 s), VM provisioning {rm['vm_provision_s']:.1f} s "
        f"(the seed's 185 s less its 82.4 s disk load)"
    )
    for key, title in (
        ("fp8", f"Table 2: {MODEL} FP8 ({res['fp8']['weight_bytes'] / 1e9:.1f} GB of weights)"),
        ("fp16", f"{MODEL} FP16 ({res['fp16']['weight_bytes'] / 1e9:.1f} GB), same model"),
        ("seed_table", "the seed's Table 2 (70B FP16, 140 GB), as printed; ratio to its 0.28 s"),
    ):
        console.print(_restart_table(title, res[key] if key == "seed_table" else res[key]["rows"]))


def _restart_table(title: str, rows: list[dict]) -> Table:
    table = Table(title=title)
    for col in RESTART_COLUMNS:
        table.add_column(col, justify="left" if col == "mechanism" else "right")
    for r in rows:
        table.add_row(
            r["mechanism"],
            f"{r['weight_reload_s']:.1f}",
            f"{r['context_rebuild_s']:.1f}",
            f"{r['total_s']:.2f}" if r["total_s"] < 10 else f"{r['total_s']:.1f}",
            f"{r['vs_fluidrole']:.2f}x" if r["vs_fluidrole"] < 10 else f"{r['vs_fluidrole']:,.0f}x",
        )
    return table
