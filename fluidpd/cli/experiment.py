"""`fluidpd experiment`: the FluidPD seed's Table 1 and Table 2, reproduced in simulation.

fluidpd experiment table1 [--quick] [--out DIR] [--seed N]
fluidpd experiment table2 [--out DIR] [--seed N]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

import fluidpd.bench.calibrate as calibrate
import fluidpd.bench.experiments as ex
from fluidpd.cli.argtypes import positive
from fluidpd.core.knobs import add_flags, flag_values
from fluidpd.placement.replan import ReplanConfig
from fluidpd.workload.profiler import ProfilerConfig


def _scales(text: str) -> tuple[float, ...]:
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("give at least one rate scale")
    return tuple(positive(float)(p.strip()) for p in parts)


def _workloads(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in ex.WORKLOADS]
    if not names or bad:
        raise argparse.ArgumentTypeError(
            f"unknown workload {', '.join(bad) or text!r}; choose from {', '.join(ex.WORKLOADS)}"
        )
    return names


def register(sub) -> None:
    p = sub.add_parser(
        "experiment",
        help="the seed's Table 1 / Table 2 in simulation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    which = p.add_subparsers(dest="table", required=True, parser_class=type(p))
    t1 = which.add_parser(
        "table1",
        help="SLO attainment, P99 TTFT and TBT of six systems on three workloads",
        description=ex.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    t1.add_argument("--quick", action="store_true", help="two rate scales per workload, 300 s windows, no goodput")
    t1.add_argument("--out", type=Path, default=Path("results/table1"), help="directory for table1.json and PNGs")
    t1.add_argument("--seed", type=int, default=0)
    t1.add_argument("--workloads", type=_workloads, default=None, help=f"subset of {', '.join(ex.WORKLOADS)}")
    t1.add_argument("--scales", type=_scales, default=None, help="rate scales for every workload (overrides)")
    t1.add_argument("--window", type=positive(float), default=None, help="seconds of each trace (overrides)")
    t1.add_argument("--no-goodput", action="store_true", help="skip the goodput search (full mode)")
    t1.add_argument(
        "--placement",
        default="auto",
        help="distserve's split (fluidtoken and fluidpd start there): auto (searched on each history window) "
        "or a fluidpd place JSON (default: auto)",
    )
    t1.set_defaults(func=run_table1)
    t2 = which.add_parser(
        "table2",
        help="FluidRole transition time vs restarts",
        description=ex.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    t2.add_argument("--out", type=Path, default=Path("results/table2"), help="directory for table2.json")
    t2.add_argument("--seed", type=int, default=0)
    t2.add_argument("--window", type=positive(float), default=None, help="seconds of the phase-shift run")
    t2.set_defaults(func=run_table2)
    rp = which.add_parser(
        "replan",
        help="replanning over hours: DistServe's restarts against FluidRole in place",
        description=__import__("fluidpd.bench.replan", fromlist=["_"]).__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rp.add_argument("--phase-s", type=positive(float), default=3600.0, help="seconds of each workload phase")
    rp.add_argument("--history-s", type=positive(float), default=600.0, help="history before the evaluated span")
    rp.add_argument("--out", type=Path, default=Path("results/replan"), help="directory for replan.json and PNG")
    rp.add_argument("--seed", type=int, default=0)
    add_flags(rp, ReplanConfig)
    add_flags(rp, ProfilerConfig)
    rp.set_defaults(func=run_replan)
    cal = which.add_parser(
        "calibrate",
        help="fit the A100's latency knobs to the DistServe paper's figures (minutes)",
        description=calibrate.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cal.add_argument("--iters", type=positive(int), default=150, help="Nelder-Mead iterations")
    cal.add_argument("--out", type=Path, default=None, help="write here instead of the package's calibration file")
    cal.add_argument("--restart", action="store_true", help="start from the built-in start, not the shipped fit")
    cal.set_defaults(func=run_calibrate)


def run_replan(args) -> int:
    from fluidpd.bench.replan import ReplanWorkload, run_replan, write_replan_plot

    if args.history_s >= args.phase_s * len(ReplanWorkload().phases):
        raise ValueError("--history-s must be shorter than the workload")
    t0 = time.perf_counter()
    config = ReplanConfig(
        **flag_values(args, ReplanConfig), profiler=ProfilerConfig(**flag_values(args, ProfilerConfig))
    )
    results, runs = run_replan(
        ex.setup(ex.BASELINE_SPLIT, args.seed), ReplanWorkload(args.phase_s, args.history_s), config
    )
    console = _console()
    phases = [p[2] for p in results["workload"]["phases"]]
    table = Table(
        title=f"replanning: {results['workload']['requests']} requests, start split "
        f"{ex.split_label(results['start_split'])} from the first {args.history_s:g} s, "
        f"restart {results['restart_s']:.1f} s"
    )
    for col in (
        "system",
        "joint attainment",
        *phases,
        "P99 TTFT s",
        "P99 TBT ms",
        "replans",
        "role changes",
        "GPU-s lost",
    ):
        table.add_column(col, justify="left" if col == "system" else "right")
    for name, r in results["systems"].items():
        table.add_row(
            name,
            _pct(r["attainment"]),
            *(_pct(r["phase_attainment"][p]) for p in phases),
            f"{r['ttft_p99_s']:.2f}",
            _ms(r["tbt_p99_s"]),
            str(sum(1 for p in r["replans"] if p["applied"])),
            str(r["role_changes"]),
            f"{r['gpu_s_lost']:.0f}",
        )
    console.print(table)
    path = _write_json(results, args.out / "replan.json")
    png = write_replan_plot(results, runs, args.out / "replan_roles.png")
    console.print(f"wrote {path} and {png} ({time.perf_counter() - t0:.0f} s)")
    return 0


def run_calibrate(args) -> int:
    from tqdm import tqdm

    from fluidpd.latency.calibration import calibration, latency_config, save_calibration

    t0 = time.perf_counter()
    with tqdm(total=args.iters, desc="fit", unit="iter", file=sys.stderr) as bar:

        def progress(it: int, value: float) -> None:
            bar.set_postfix_str(f"loss {value:.4f}", refresh=False)
            bar.update(it + 1 - bar.n)

        start = latency_config(calibrate.GPU) if calibration(calibrate.GPU) and not args.restart else None
        lat, values = calibrate.fit(start, iters=args.iters, progress=progress)
    rec = calibrate.record(values)
    path = save_calibration(calibrate.GPU, lat, rec, args.out)
    _print_calibration(_console(), rec)
    _console().print(f"wrote {path} ({time.perf_counter() - t0:.0f} s)")
    return 0


def _print_calibration(console: Console, rec: dict) -> None:
    table = Table(title=f"{calibrate.GPU} calibration: {rec['model']}")
    for col in ("figure", "target", "model", "error", "weight"):
        table.add_column(col, justify="left" if col == "figure" else "right")
    for f in rec["figures"]:
        table.add_row(
            f["key"], f"{f['target']:.4g} {f['unit']}", f"{f['model']:.4g}", f"{f['error']:+.1%}", f"{f['weight']:g}"
        )
    console.print(table)
    r = rec["ratio_2p1d"]
    console.print(f"2P1D / colocated per-GPU goodput: {r['model']:.2f}x (target {r['target']:g}x)")


def _console() -> Console:
    return Console(width=None if sys.stdout.isatty() else 160)


def _pct(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1%}"


def _ms(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 1e3:,.1f}"


def _write_json(obj, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1, default=_jsonable) + "\n")
    return path


def _jsonable(o):
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


def run_table1(args) -> int:
    t0 = time.perf_counter()
    console = _console()
    just = ex.ttft_justification()
    console.print(
        f"[bold]Table 1 setting[/]: {ex.N_WORKERS} x {ex.GPU} (one worker per GPU), {ex.MODEL} {ex.DTYPE}, "
        f"step jitter CV {ex.JITTER_CV}, SLO TTFT {ex.SLO.ttft_s:g} s, TBT {ex.SLO.tbt_s * 1e3:g} ms"
    )
    console.print(
        f"SLO_TTFT: the p99 azure_code prompt ({just['p99_prompt_tokens']:,} tokens) prefills alone in "
        f"{just['prefill_alone_s']:.2f} s on one {ex.GPU} at {ex.DTYPE} (roofline), so {ex.SLO.ttft_s:g} s "
        f"leaves {just['queueing_headroom_s']:.2f} s (less than one such prefill) of queueing."
    )
    results, kept = ex.run_table1(
        args.workloads,
        quick=args.quick,
        scales=args.scales,
        window_s=args.window,
        seed=args.seed,
        goodput=False if args.no_goodput else None,
        placement=args.placement,
    )
    for name, entry in results["workloads"].items():
        _print_headline(console, name, entry, results["table1"][name])
        _print_curve(console, name, entry)
        if name == "phase_shift":
            _print_phases(console, entry)
    _print_goodput_and_goals(console, results)
    out = args.out
    json_path = _write_json(results, out / "table1.json")
    paths = ex.write_table1_plots(results, kept, out)
    results["command_wall_s"] = time.perf_counter() - t0
    _write_json(results, json_path)
    console.print(f"wrote {json_path} and {len(paths)} PNGs in {out} ({results['command_wall_s']:.0f} s)")
    return 0


def _print_headline(console: Console, name: str, entry: dict, rows: list[dict]) -> None:
    x = entry["headline_scale"]
    run = entry["runs"][f"{x:g}"]
    tuned = run["tuned_on_history"]
    table = Table(
        title=f"Table 1: {name} x{x:g} ({run['requests']} requests, {entry['window_s']:g} s from "
        f"{entry['start_s']:g} s) - headline rate; tuned on history: split {tuned['split_label']}, "
        f"chunk budget {tuned['chunk_budget']}"
    )
    cols = (
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
    for col in cols:
        table.add_column(col, justify="left" if col in ("system", "split", "what it is") else "right")
    for r in rows:
        dynamic = "transitions" in r and r["system"] not in ("static-pd 2P:6D", "static-pd best")
        split = (
            ("from " if dynamic else "") + r["split"]
            if r["policy"] != "colocated" and r["system"] != "chunked"
            else "-"
        )
        table.add_row(
            r["system"],
            split,
            _pct(r["attainment"]),
            _pct(r["strict_attainment"]),
            f"{r['ttft_p99_s'] * 1e3:,.0f}",
            _ms(r["tbt_p99_s"]),
            _ms(r["tbt_decode_p99_s"]),
            str(len(r["transitions"])) if dynamic else "-",
            r["what"],
        )
    console.print(table)


def _print_curve(console: Console, name: str, entry: dict) -> None:
    table = Table(title=f"{name}: joint attainment by rate scale (oracle's split in brackets)")
    table.add_column("system")
    for x in entry["scales"]:
        table.add_column(f"x{x:g}", justify="right")
    for s in ex.SYSTEMS:
        cells = []
        for x in entry["scales"]:
            run = entry["runs"][f"{x:g}"]
            v = _pct(run["systems"][s]["attainment"])
            cells.append(f"{v} ({run['best_split']})" if s == "static-pd best" else v)
        table.add_row(s, *cells)
    console.print(table)


def _print_phases(console: Console, entry: dict) -> None:
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
        table.add_row(label, *(_pct(r["phase_attainment"][lab]) for lab in labels))
    console.print(table)


def _print_goodput_and_goals(console: Console, results: dict) -> None:
    gp = results.get("goodput")
    if gp:
        splits = ", ".join(f"{k} {v:.2f}" for k, v in gp["static_pd"].items())
        console.print(
            f"[bold]Goodput[/] ({gp['workload']}, highest rate scale with >= {gp['target_attainment']:.0%} "
            f"joint attainment): fluidpd x{gp['fluidpd']:.2f}, distserve ({gp['distserve_split']}) "
            f"x{gp['distserve']:.2f}, chunked ({gp['chunk_budget']}) x{gp['chunked']:.2f}; static-pd {splits}"
        )
        console.print(
            f"fluidpd / distserve {gp['ratio_vs_distserve']:.2f}x (goal {gp['goal']['distserve']:g}x), "
            f"/ chunked {gp['ratio_vs_chunked']:.2f}x (goal {gp['goal']['chunked']:g}x), / oracle "
            f"{gp['best_static_split']} {gp['ratio_vs_best_static']:.2f}x: {'met' if gp['met'] else 'NOT met'}"
        )
    goals = results["goals"]
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


def run_table2(args) -> int:
    t0 = time.perf_counter()
    console = _console()
    res = ex.run_table2(args.window, args.seed)
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
    for col in ("count", "drain", "remap", "dispatch", "route", "total"):
        phases.add_column(col, justify="right")
    order = ("drain", "remap", "dispatch", "route", "total")
    phases.add_row("all", str(fr["transitions"]), *(_ms(med[p]) for p in order))
    for d, v in fr["by_direction"].items():
        phases.add_row(d, str(v["count"]), *(_ms(v["median_s"][p]) for p in order))
    console.print(phases)
    console.print(
        f"  all transitions: min total {fr['min_total_s'] * 1e3:.0f} ms, max {fr['max_total_s'] * 1e3:.0f} ms; "
        f"Table 2's FluidRole row is the decode->prefill median ({fr['table_total_s'] * 1e3:.0f} ms), "
        f"the seed's 280 ms case"
    )
    rm = res["restart_model"]
    console.print(
        f"restart model: disk {rm['disk_bw_bytes_s'] / 1e9:.2f} GB/s (140 GB / 82.4 s), shared memory "
        f"{rm['shm_bw_bytes_s'] / 1e9:.2f} GB/s (140 GB / 14.1 s), VM provisioning {rm['vm_provision_s']:.1f} s "
        f"(the seed's 185 s less its 82.4 s disk load)"
    )
    for key, title in (
        ("fp8", f"Table 2: {ex.MODEL} FP8 ({res['fp8']['weight_bytes'] / 1e9:.1f} GB of weights)"),
        ("fp16", f"{ex.MODEL} FP16 ({res['fp16']['weight_bytes'] / 1e9:.1f} GB), same model"),
        ("seed_table", "the seed's Table 2 (70B FP16, 140 GB), as printed; ratio to its 0.28 s"),
    ):
        rows = res[key] if key == "seed_table" else res[key]["rows"]
        table = Table(title=title)
        for col in ("mechanism", "weight reload (s)", "context rebuild (s)", "total downtime (s)", "x FluidRole"):
            table.add_column(col, justify="left" if col == "mechanism" else "right")
        for r in rows:
            table.add_row(
                r["mechanism"],
                f"{r['weight_reload_s']:.1f}",
                f"{r['context_rebuild_s']:.1f}",
                f"{r['total_s']:.2f}" if r["total_s"] < 10 else f"{r['total_s']:.1f}",
                f"{r['vs_fluidrole']:.2f}x" if r["vs_fluidrole"] < 10 else f"{r['vs_fluidrole']:,.0f}x",
            )
        console.print(table)
    path = _write_json(res, args.out / "table2.json")
    console.print(f"wrote {path} ({time.perf_counter() - t0:.0f} s)")
    return 0
