"""`fluidpd simulate`: run policies over a trace on a simulated cluster and compare them."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from fluidpd.bench.report import print_table, write_json
from fluidpd.core.argtypes import positive
from fluidpd.core.knobs import add_flags, flag_values
from fluidpd.core.metrics import Slo
from fluidpd.policy.base import PolicyConfig
from fluidpd.policy.fluidconfig import FluidConfig
from fluidpd.policy.registry import POLICIES
from fluidpd.sim.config import SimConfig
from fluidpd.sim.goodput import goodput_rate_scale
from fluidpd.sim.run import Setup, SimResult, simulate
from fluidpd.specs.hardware import HARDWARE_NAMES, get_hardware
from fluidpd.specs.models import DTYPES, MODEL_NAMES, get_model
from fluidpd.workload.datacenter_config import DatacenterConfig
from fluidpd.workload.registry import SESSION_OPTIONS, TRACES, load_trace, session_options, trace_flags
from fluidpd.workload.trace import Trace


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    """The simulated cluster: model, GPU, SLOs and the knobs of SimConfig, PolicyConfig, FluidConfig."""
    p.add_argument("--model", required=True, choices=MODEL_NAMES)
    p.add_argument("--dtype", default="bf16", choices=DTYPES)
    p.add_argument("--gpu", required=True, choices=HARDWARE_NAMES)
    p.add_argument("--ttft-slo", type=positive(float), required=True, help="seconds")
    p.add_argument("--tbt-slo", type=positive(float), required=True, help="seconds")
    add_flags(p, SimConfig)
    add_flags(p, PolicyConfig)
    add_flags(p, FluidConfig)


def register(sub) -> None:
    p = sub.add_parser("simulate", help="compare policies on a simulated cluster", description=__doc__)
    p.add_argument("--trace", required=True, help=f"one of {', '.join(TRACES)}, or a file")
    p.add_argument("--policy", required=True, help=f"comma-separated: {', '.join(POLICIES)}")
    add_cluster_args(p)
    p.add_argument(
        "--sessions",
        action="store_true",
        help=f"closed-loop sessions with block ids for prefix reuse ({', '.join(SESSION_OPTIONS)})",
    )
    p.add_argument("--rate-scale", type=positive(float), default=1.0, help="compress time by X")
    p.add_argument("--samples", type=positive(int), default=1, help="sequences each request samples (n; 1 prefill)")
    p.add_argument(
        "--constrained", type=float, default=0.0, help="share of requests whose output a grammar constrains (0-1)"
    )
    p.add_argument("--start", type=float, default=0.0, help="evaluated window start, s into the rate-scaled trace")
    p.add_argument("--duration", type=positive(float), default=None, help="evaluated window length, s (default: all)")
    p.add_argument(
        "--placement",
        help="starting P/D split: auto (placement search on the --history s before --start; with chunked, "
        "its --chunk-budget too unless given) or a fluidpd place JSON",
    )
    p.add_argument("--history", type=positive(float), default=600.0, help="seconds of history for --placement auto")
    p.set_defaults(chunk_budget=None)  # not given: the knob's default, or with --placement auto chunked's tuned one
    p.add_argument("--out", type=Path, help="write the rows as JSON")
    p.add_argument("--plot", type=Path, help="directory for CDF and timeline PNGs")
    p.add_argument(
        "--trace-requests", type=Path, help="write every request's timeline as JSON lines (one per request and policy)"
    )
    p.add_argument("--goodput", action="store_true", help="binary-search the rate scale at 90%% attainment")
    add_flags(p, DatacenterConfig)
    p.set_defaults(func=run)


def parse_policies(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in POLICIES]
    if not names or bad:
        raise ValueError(f"unknown policy {', '.join(bad) or text!r}; choose from {', '.join(POLICIES)}")
    return names


def setup_from_args(args) -> Setup:
    return Setup(
        get_model(args.model, args.dtype),
        get_hardware(args.gpu),
        Slo(args.ttft_slo, args.tbt_slo),
        SimConfig(**flag_values(args, SimConfig)),
        PolicyConfig(**flag_values(args, PolicyConfig)),
        fluid=FluidConfig(**flag_values(args, FluidConfig)),
    )


def run_policy(trace: Trace, policy: str, setup: Setup, label: str = "", before_run=None) -> SimResult:
    horizon = float(trace.arrival_s[-1]) if len(trace) else 0.0
    with tqdm(
        total=len(trace), desc=label or policy, unit="req", delay=2.0, leave=False, mininterval=0.5, file=sys.stderr
    ) as bar:

        def progress(now, completed):
            bar.set_postfix_str(f"t={now:.0f}/{horizon:.0f}s", refresh=False)
            bar.update(completed - bar.n)

        return simulate(trace, policy, setup, progress, before_run=before_run)


def run(args) -> int:
    policies = parse_policies(args.policy)
    budget_given = args.chunk_budget is not None
    if not budget_given:
        args.chunk_budget = PolicyConfig().chunk_budget
    setup = setup_from_args(args)
    setup.roofline().kv_blocks(setup.sim.block_size)  # fails early if the weights don't fit
    base = _base_trace(args)
    window = functools.partial(_window, base, args)
    trace = window(args.rate_scale)
    if len(trace) == 0:
        raise ValueError("the trace window holds no requests")
    setups = _placed_setups(args, base, setup, policies, budget_given)
    traces = args.trace_requests.open("w") if args.trace_requests else None
    results, rows = _simulate_policies(args, trace, policies, setups, window, traces)
    title = (
        f"{args.trace} x{args.rate_scale:g}: {len(trace)} requests, {args.n_workers} x {args.gpu} "
        f"{args.model} {args.dtype}, SLO TTFT {args.ttft_slo}s TBT {args.tbt_slo * 1e3:g}ms"
    )
    if traces:
        traces.close()
    print_table(rows, title)
    if args.out:
        write_json(rows, args.out)
    if args.plot:
        write_plots(results, setup.slo, args.plot)
    return 0


def _base_trace(args) -> Trace:
    """--trace as loaded (sessions, samples and constrained outputs applied), before rate scaling."""
    sessions = session_options(args.trace) if args.sessions else {}
    base = load_trace(args.trace, seed=args.seed, **sessions, **trace_flags(args.trace, args))
    if args.samples > 1 or args.constrained:
        base = base.sampled(args.samples, args.constrained, args.seed)
    if args.start < 0:
        raise ValueError(f"--start must be >= 0, got {args.start}")
    return base


def _window(base: Trace, args, x: float) -> Trace:
    """The evaluated window (--start, --duration) of `base` at rate scale `x`."""
    scaled = base.scale_rate(x)
    if not args.start and not args.duration:
        return scaled
    return scaled.window(args.start, args.duration or max(scaled.duration_s - args.start, 0.0) + 1e-6)


def _placed_setups(args, base: Trace, setup: Setup, policies: list[str], budget_given: bool) -> dict[str, Setup]:
    """Each policy's setup: --placement's split (into `setup`), and with auto chunked's tuned budget."""
    history = None
    if args.placement:
        history = base.scale_rate(args.rate_scale).window(max(0.0, args.start - args.history), args.history)
        k, how = placed_split(args.placement, history if args.start > 0 else None, setup)
        setup.policy.prefill_workers = k
        print(f"placement: {k}P:{setup.sim.n_workers - k}D ({how})", file=sys.stderr)
    setups = dict.fromkeys(policies, setup)
    for name in ("chunked", "chunked-late-last"):
        if history is not None and args.placement == "auto" and name in policies and not budget_given:
            b, how = placed_budget(history, setup, name)
            setups[name] = dataclasses.replace(setup, policy=dataclasses.replace(setup.policy, chunk_budget=b))
            print(f"{name} chunk budget: {b} ({how})", file=sys.stderr)
    return setups


def _simulate_policies(
    args, trace: Trace, policies: list[str], setups: dict[str, Setup], window, traces
) -> tuple[list, list]:
    """(results, table rows) of each policy on `trace`; with --goodput its rate scale at 90% attainment."""
    results, rows = [], []
    for name in policies:
        result = run_policy(trace, name, setups[name], before_run=traces and request_timelines(traces, name))
        row = result.row()
        if args.goodput:
            row["goodput_rate_scale"] = goodput_rate_scale(
                lambda x, name=name: simulate(window(x), name, setups[name]).summary["attainment"],
                start=args.rate_scale,
            )
        results.append(result)
        rows.append(row)
    return results, rows


def request_timelines(out, policy: str):
    """A `before_run` that traces every request of the simulated cluster into `out` (JSON lines)."""
    import json

    from fluidpd.world.trace import RequestTracer

    def write(trace) -> None:
        out.write(json.dumps({"policy": policy, **trace.to_json()}) + "\n")

    def before_run(cluster) -> None:
        cluster.tracer = RequestTracer(write)

    return before_run


def placed_split(placement: str, history: Trace | None, setup: Setup) -> tuple[int, str]:
    """Prefill workers from `placement`: "auto" searches on `history`, else a `fluidpd place` file."""
    from fluidpd.placement.plan import fixed_split, split_of

    n = setup.sim.n_workers
    if placement != "auto":
        from fluidpd.placement.result import load_placement

        return split_of(load_placement(Path(placement)), n), f"from {placement}"
    if history is None:
        raise ValueError("--placement auto searches on the history before the evaluated window: give --start > 0")
    k, scores = fixed_split(history, setup)
    return (
        k,
        f"auto: static-pd attainment {scores[k]:.1%} on {len(history)} requests of history, the best of {n - 1} splits",
    )


def placed_budget(history: Trace, setup: Setup, policy: str = "chunked") -> tuple[int, str]:
    """A chunked policy's token budget searched on `history` (`best_chunk_budget`), and a line saying why."""
    from fluidpd.placement.plan import CHUNK_BUDGETS, best_chunk_budget

    b, scores = best_chunk_budget(history, setup, CHUNK_BUDGETS, policy=policy)
    return b, (
        f"auto: {policy} attainment {scores[b]:.1%} on {len(history)} requests of history, "
        f"the best of {len(scores)} budgets"
    )


def write_plots(results: list[SimResult], slo: Slo, directory: Path) -> list[Path]:
    from fluidpd.bench.plots import cdf_plot, sorted_cdf, timeline_plot

    directory.mkdir(parents=True, exist_ok=True)
    ttft = {r.policy: sorted_cdf(np.frombuffer(r.cluster.metrics.ttft, dtype=np.float64)) for r in results}
    tbt = {r.policy: r.cluster.metrics.tbt.cdf_points() for r in results}
    paths = [
        cdf_plot(ttft, "TTFT (s)", directory / "ttft_cdf.png", slo.ttft_s),
        cdf_plot(tbt, "time between tokens (s)", directory / "tbt_cdf.png", slo.tbt_s),
    ]
    for r in results:
        paths.append(
            timeline_plot(
                r.cluster.timeline, f"{r.policy}: per-worker timeline", directory / f"timeline_{r.policy}.png"
            )
        )
    return paths
