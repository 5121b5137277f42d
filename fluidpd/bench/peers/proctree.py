"""Resident memory of a process and all its descendants (Linux /proc; 0 where it cannot be read)."""

from __future__ import annotations

import os

from fluidpd.core.memory import rss_bytes


def _parent(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: the fields after the last ')' are plain.
    return int(stat.rsplit(")", 1)[1].split()[1])


def tree_pids(root: int) -> list[int]:
    """`root` and every live descendant of it."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if name.isdigit() and (ppid := _parent(name)) is not None:
            children.setdefault(ppid, []).append(int(name))
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo.extend(children.get(pid, ()))
    return pids


def tree_rss_bytes(root: int) -> int:
    """Sum of VmRSS over `root`'s process tree (shared pages count once per process, as `ps` shows them)."""
    return sum(rss_bytes(pid) for pid in tree_pids(root))
