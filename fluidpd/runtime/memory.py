"""Resident memory of a worker's process (Linux /proc; 0 where it cannot be read)."""

from __future__ import annotations


def worker_pid(backend) -> int | None:
    """The pid a backend's engine runs in (a process worker's own; this one for in-process workers)."""
    pid = getattr(backend, "pid", None)
    if pid is None:
        pid = getattr(getattr(backend, "info", None), "pid", None)
    return pid


def rss_bytes(pid: int | None) -> int:
    """Resident set size of process `pid` in bytes."""
    if pid is None:
        return 0
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:")), 0)
    except OSError:
        return 0
