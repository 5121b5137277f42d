"""The host CPU as /proc/cpuinfo describes it (Linux; empty elsewhere)."""

from __future__ import annotations

import functools
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
