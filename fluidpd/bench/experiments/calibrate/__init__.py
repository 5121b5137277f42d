"""Fit a GPU's latency knobs to measured figures: the A100-80GB against the DistServe paper.

The figures (OPT-13B FP16 on one A100-80GB, as the DistServe seed quotes them) and, as a second
reference, DistServe's own published simulator profile for the same model and GPU. Figure 1's
four rates come from simulations (phase policies `prefill-only`, `decode-only`, `colocated`,
`static-pd` 2P1D; goodput = highest Poisson rate with >= 90% attainment); the others from the
latency model directly. The fit minimises the weighted sum of squared log errors (Nelder-Mead
over transformed knobs) and writes the knobs with every figure, its source, the fitted value and
its error to fluidpd/latency/calibrations/<gpu>.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fluidpd.bench.experiments.calibrate import fit as calibrate
from fluidpd.bench.experiments.output import make_console
from fluidpd.core.argtypes import positive

HELP = "fit the A100's latency knobs to the DistServe paper's figures (minutes)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--iters", type=positive(int), default=150, help="Nelder-Mead iterations")
    p.add_argument("--out", type=Path, default=None, help="write here instead of the package's calibration file")
    p.add_argument("--restart", action="store_true", help="start from the built-in start, not the shipped fit")


def main(args: argparse.Namespace) -> int:
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
    console = make_console()
    print_calibration(console, rec)
    console.print(f"wrote {path} ({time.perf_counter() - t0:.0f} s)")
    return 0


def print_calibration(console: Console, rec: dict) -> None:
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
