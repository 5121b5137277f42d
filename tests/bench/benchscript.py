"""Load a script of benchmarks/ as a module (the tests of benchmark scripts share it)."""

import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def path_of(name: str) -> Path:
    """benchmarks/<group>/<name>.py (or benchmarks/<name>.py): script names are unique across the groups."""
    found = [*BENCHMARKS.glob(f"{name}.py"), *BENCHMARKS.glob(f"*/{name}.py")]
    if len(found) != 1:
        raise LookupError(f"{len(found)} scripts named {name}.py under {BENCHMARKS} (one expected)")
    return found[0]


def load(name: str):
    """benchmarks/<group>/<name>.py, registered in sys.modules (its dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(name, path_of(name))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
