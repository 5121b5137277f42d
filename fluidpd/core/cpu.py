"""The host CPU as /proc/cpuinfo describes it (Linux; empty elsewhere), and the cores a worker may use."""

from __future__ import annotations

import functools
import os
import platform


def _cpuinfo(*keys: str) -> str | None:
    """The value of the first /proc/cpuinfo line whose key is one of `keys` (None: none, or no file)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in keys:
                    return value.strip()
    except OSError:
        pass
    return None


@functools.cache
def cpu_flags() -> frozenset[str]:
    """Feature flags of the CPU (x86 `flags`, Arm `Features`)."""
    return frozenset((_cpuinfo("flags", "Features") or "").split())


def cpu_name() -> str:
    """The CPU's model name."""
    return _cpuinfo("model name") or platform.processor()


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity; all of the machine's where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def worker_threads(workers: int, threads: int = 0) -> int:
    """Torch threads for each of `workers` engine workers sharing this machine: `threads` when > 0,
    else the usable cores split evenly between them (at least one each)."""
    if threads < 0 or workers < 1:
        raise ValueError(f"threads must be >= 0 and workers >= 1, got threads={threads}, workers={workers}")
    return threads if threads > 0 else max(1, usable_cores() // workers)
