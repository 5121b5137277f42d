"""Resident memory of a process (Linux /proc; 0 where it cannot be read), and handing freed heap back."""

from __future__ import annotations

import ctypes
import ctypes.util


def rss_bytes(pid: int | str = "self") -> int:
    """Resident set size of process `pid` (default: this one) in bytes."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:")), 0)
    except OSError:
        return 0


def trim_heap() -> None:
    """Return the heap freed by a load (dequantised copies, packing temporaries) to the OS (glibc only)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is not None and hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)
    except OSError:
        pass
