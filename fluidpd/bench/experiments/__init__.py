"""The FluidPD seed's evaluation in simulation, one experiment per module, registered by name.

An experiment module exposes HELP (one line), `add_arguments(parser)` and `main(args) -> int`
(it runs, prints its tables and writes its files); its docstring is the command's description.
`fluidpd experiment <name>` has one subcommand per entry of EXPERIMENTS, in this order.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from fluidpd.core.registry import Registry

# experiment -> its module (fluidpd.bench.experiments.<name>)
EXPERIMENTS: Registry[str] = Registry("experiment")
for _name in ("table1", "table2", "kv", "replan", "calibrate", "scale"):
    EXPERIMENTS.add(_name, f"fluidpd.bench.experiments.{_name}")


def load(name: str) -> ModuleType:
    """The module of experiment `name` (imported on first use)."""
    return importlib.import_module(EXPERIMENTS.get(name))
