"""Load a script of benchmarks/ as a module (the tests of benchmark scripts share it)."""

import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load(name: str):
    """benchmarks/<name>.py, registered in sys.modules (its dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
