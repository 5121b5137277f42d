"""The FluidPD seed's Table 2 in simulation: FluidRole's transition time against restarts.

FluidRole's phases are timed on the phase-shift run (x1, 600 s, on Table 1's cluster; when the
pressure indices trigger no decode -> prefill switch, the run is repeated with admin switches in the
middle of every phase: decode -> prefill in the surges, prefill -> decode in the waves). The command
reports phase medians over all transitions and per direction, and sets the median decode -> prefill
transition (the seed's 280 ms case) against restarts modelled in `fluidpd.bench.restarts`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from fluidpd.bench.experiments.output import make_console, write_json
from fluidpd.bench.experiments.table2.report import print_fluidrole, print_restarts
from fluidpd.bench.experiments.table2.run import run_table2
from fluidpd.core.argtypes import positive

HELP = "FluidRole transition time vs restarts"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=Path("results/table2"), help="directory for table2.json")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--window", type=positive(float), default=None, help="seconds of the phase-shift run")


def main(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    console = make_console()
    res = run_table2(args.window, args.seed)
    print_fluidrole(console, res)
    print_restarts(console, res)
    path = write_json(res, args.out / "table2.json")
    console.print(f"wrote {path} ({time.perf_counter() - t0:.0f} s)")
    return 0
