"""Table 1 printed: the setting, per workload the headline table, the rate curve and (phase shift)
the per-phase table, then goodput and the goals."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from fluidpd.bench.experiments.common import DTYPE, GPU, JITTER_CV, MODEL, N_WORKERS, SLO, ttft_justification
from fluidpd.bench.experiments.envelope import EnvelopePoint, describe
from fluidpd.bench.experiments.output import ms, pct, per_hour
from fluidpd.bench.experiments.table1.run import SYSTEMS

HEADLINE_COLUMNS = (
    "system",
    "split",
    "joint",
    "strict",
    "P99 TTFT (ms)",
    "P99 TBT (ms)",
    "P99 TBT no hand-off",
    "switches",
    "what it is",
)


def print_setting(console: Console, model: str = MODEL) -> None:
    just = ttft_justification(model)
    console.print(
        f"[bold]Table 1 setting[/]: {N_WORKERS} x {GPU} (one worker per GPU), {model} {DTYPE}, "
        f"step jitter CV {JITTER_CV}, SLO TTFT {SLO.ttft_s:g} s, TBT {SLO.tbt_s * 1e3:g} ms"
    )
    console.print(
        f"SLO_TTFT: the p99 azure_code prompt ({just['p99_prompt_tokens']:,} tokens) prefills alone in "
        f"{just['prefill_alone_s']:.2f} s on one {GPU} at {DTYPE} (roofline), so {SLO.ttft_s:g} s "
        f"leaves {just['queueing_headroom_s']:.2f} s (less than one such prefill) of queueing."
    )


def print_results(console: Console, results: dict) -> None:
    for name, entry in results["workloads"].items():
        print_headline(console, name, entry, results["table1"][name])
        print_curve(console, name, entry)
        if name == "phase_shift":
            print_phases(console, entry)
    print_goodput(console, results.get("goodput"))
    print_goals(console, results["goals"])
    console.print(describe([EnvelopePoint.from_json(p) for p in results["envelope"]]))


def print_headline(console: Console, name: str, entry: dict, rows: list[dict]) -> None:
    x = entry["headline_scale"]
    run = entry["runs"][f"{x:g}"]
    tuned = run["tuned_on_history"]
    table = Table(
        title=f"Table 1: {name} x{x:g} ({run['requests']} requests, {entry['window_s']:g} s from "
        f"{entry['start_s']:g} s) - headline rate; tuned on history: split {tuned['split_label']}, "
        f"chunk budget {tuned['chunk_budget']} (late-last {tuned['chunk_budget_late_last']})"
    )
    for col in HEADLINE_COLUMNS:
        table.add_column(col, justify="left" if col in ("system", "split", "what it is") else "right")
    for r in rows:
        table.add_row(*_headline_cells(r))
    console.print(table)


def _headline_cells(r: dict) -> tuple[str, ...]:
    dynamic = "transitions" in r and r["system"] not in ("static-pd 2P:6D", "static-pd best")
    placed = r["policy"] not in ("colocated", "chunked", "chunked-late-last")
    split = ("from " if dynamic else "") + r["split"] if placed else "-"
    return (
        r["system"],
        split,
        pct(r["attainment"]),
        pct(r["strict_attainment"]),
        f"{r['ttft_p99_s'] * 1e3:,.0f}",
        ms(r["tbt_p99_s"]),
        ms(r["tbt_decode_p99_s"]),
        per_hour(len(r["transitions"]), r.get("switches_per_hour")) if dynamic else "-",
        r["what"],
    )


def print_curve(console: Console, name: str, entry: dict) -> None:
    table = Table(title=f"{name}: joint attainment by rate scale (oracle's split in brackets)")
    table.add_column("system")
    for x in entry["scales"]:
        table.add_column(f"x{x:g}", justify="right")
    for s in SYSTEMS:
        cells = []
        for x in entry["scales"]:
            run = entry["runs"][f"{x:g}"]
            v = pct(run["systems"][s]["attainment"])
            cells.append(f"{v} ({run['best_split']})" if s == "static-pd best" else v)
        table.add_row(s, *cells)
    console.print(table)


def print_phases(console: Console, entry: dict) -> None:
    x = entry["headline_scale"]
    run = entry["runs"][f"{x:g}"]
    labels = [p[2] for p in entry["phases"]]
    table = Table(title=f"phase_shift x{x:g}: joint attainment per phase")
    table.add_column("system")
    for lab in labels:
        table.add_column(lab, justify="right")
    rows = list(run["systems"].items()) + [
        (f"  static-pd {k}", r) for k, r in run["splits"].items() if k not in ("2P:6D", run["best_split"])
    ]
    for label, r in rows:
        table.add_row(label, *(pct(r["phase_attainment"][lab]) for lab in labels))
    console.print(table)


def print_goodput(console: Console, gp: dict | None) -> None:
    if not gp:
        return
    splits = ", ".join(f"{k} {v:.2f}" for k, v in gp["static_pd"].items())
    console.print(
        f"[bold]Goodput[/] ({gp['workload']}, highest rate scale with >= {gp['target_attainment']:.0%} "
        f"joint attainment): fluidpd x{gp['fluidpd']:.2f}, distserve ({gp['distserve_split']}) "
        f"x{gp['distserve']:.2f}, chunked ({gp['chunk_budget']}) x{gp['chunked']:.2f}, chunked late-last "
        f"({gp['chunk_budget_late_last']}) x{gp['chunked_late_last']:.2f}; static-pd {splits}"
    )
    console.print(
        f"fluidpd / distserve {gp['ratio_vs_distserve']:.2f}x (goal {gp['goal']['distserve']:g}x), "
        f"/ chunked {gp['ratio_vs_chunked']:.2f}x (goal {gp['goal']['chunked']:g}x), / chunked late-last "
        f"{gp['ratio_vs_chunked_late_last']:.2f}x (goal {gp['goal']['chunked late-last']:g}x), / oracle "
        f"{gp['best_static_split']} {gp['ratio_vs_best_static']:.2f}x: {'met' if gp['met'] else 'NOT met'}"
    )


def print_goals(console: Console, goals: dict) -> None:
    for name, d in goals["dominates"].items():
        verdict = "met" if d["met"] else "NOT met: " + "; ".join(d["misses"])
        console.print(f"[bold]fluidpd >= every system[/] on {name} (within 1 point, joint and strict): {verdict}")
    b = goals.get("bursty")
    if b:
        console.print(
            f"[bold]Bursty goal[/] (azure_code x1: fluidpd >= {b['goal']['fluidpd_attainment']:.0%} with P99 TBT "
            f"<= {b['goal']['fluidpd_tbt_p99_s'] * 1e3:g} ms): {b['fluidpd_attainment']:.1%}, "
            f"{b['fluidpd_tbt_p99_s'] * 1e3:.1f} ms: {'met' if b['met'] else 'NOT met'}"
        )
