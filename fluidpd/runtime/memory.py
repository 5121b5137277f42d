"""Resident memory of a process (Linux /proc; 0 where it cannot be read)."""

from __future__ import annotations


def rss_bytes(pid: int | str = "self") -> int:
    """Resident set size of process `pid` (default: this one) in bytes."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:")), 0)
    except OSError:
        return 0
