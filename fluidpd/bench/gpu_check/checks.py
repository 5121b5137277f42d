"""The checks by name, in the order a run takes them (cheap and fundamental first)."""

from __future__ import annotations

from collections.abc import Callable

from fluidpd.bench.gpu_check import engine_check, generate_check, imports_check, serve_check, steps_check
from fluidpd.bench.gpu_check.context import CheckContext
from fluidpd.core.registry import Registry

Check = Callable[[CheckContext], dict]
CHECKS: Registry[Check] = Registry("gpu check")
CHECKS.add("imports", imports_check.check)
CHECKS.add("engine", engine_check.check)
CHECKS.add("generate", generate_check.check)
CHECKS.add("serve", serve_check.check)
CHECKS.add("steps", steps_check.check)
