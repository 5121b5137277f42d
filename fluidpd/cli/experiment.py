"""`fluidpd experiment <name>`: the FluidPD seed's evaluation in simulation, one subcommand per
experiment registered in `fluidpd.bench.experiments.EXPERIMENTS` (`fluidpd experiment <name> -h`)."""

from __future__ import annotations

import argparse

from fluidpd.bench.experiments import EXPERIMENTS, load


def register(sub) -> None:
    p = sub.add_parser(
        "experiment",
        help="the seed's evaluation in simulation: Table 1, Table 2, replanning, calibration",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    which = p.add_subparsers(dest="experiment", required=True, parser_class=type(p))
    for name in EXPERIMENTS:
        module = load(name)
        q = which.add_parser(
            name, help=module.HELP, description=module.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        module.add_arguments(q)
        q.set_defaults(func=module.main)
