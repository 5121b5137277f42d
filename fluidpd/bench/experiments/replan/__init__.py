"""Replanning over hours: DistServe's restart-based replanning against FluidPD applying the same
plans in place (DistServe Section VI; `fluidpd experiment replan`).

The workload: hour-long phases cut from the shipped Azure traces, conversation (long outputs) then
code (long prompts, short outputs) then conversation again, so the best split moves twice. The
first `history_s` seconds are history only: the starting split is searched on them (static-pd
over every split), and attainment is reported on what follows. Systems:
  static-pd   the starting split, never changed;
  distserve   static-pd plus the replanner: a changed worker drains, goes down for the modelled
              cold restart (`fluidpd experiment table2`'s model), and comes back in its new role;
  fluidpd     FluidPD from the same split, with the same replanner applying its plans in place.
GPU-seconds lost: for restarts, the downtime (and the drain before it) times the worker's GPUs;
for FluidRole, the whole transition.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from fluidpd.bench.experiments.common import BASELINE_SPLIT, setup
from fluidpd.bench.experiments.output import make_console, write_json
from fluidpd.bench.experiments.replan.figures import write_replan_plot
from fluidpd.bench.experiments.replan.report import print_replan
from fluidpd.bench.experiments.replan.run import ReplanWorkload, run_replan
from fluidpd.core.argtypes import positive
from fluidpd.core.knobs import add_flags, flag_values
from fluidpd.placement.replan import ReplanConfig
from fluidpd.workload.profiler import ProfilerConfig

HELP = "replanning over hours: DistServe's restarts against FluidRole in place"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--phase-s", type=positive(float), default=3600.0, help="seconds of each workload phase")
    p.add_argument("--history-s", type=positive(float), default=600.0, help="history before the evaluated span")
    p.add_argument("--out", type=Path, default=Path("results/replan"), help="directory for replan.json and PNG")
    p.add_argument("--seed", type=int, default=0)
    add_flags(p, ReplanConfig)
    add_flags(p, ProfilerConfig)


def main(args: argparse.Namespace) -> int:
    if args.history_s >= args.phase_s * len(ReplanWorkload().phases):
        raise ValueError("--history-s must be shorter than the workload")
    t0 = time.perf_counter()
    config = ReplanConfig(
        **flag_values(args, ReplanConfig), profiler=ProfilerConfig(**flag_values(args, ProfilerConfig))
    )
    results, runs = run_replan(setup(BASELINE_SPLIT, args.seed), ReplanWorkload(args.phase_s, args.history_s), config)
    console = make_console()
    print_replan(console, results, args.history_s)
    path = write_json(results, args.out / "replan.json")
    png = write_replan_plot(results, runs, args.out / "replan_roles.png")
    console.print(f"wrote {path} and {png} ({time.perf_counter() - t0:.0f} s)")
    return 0
