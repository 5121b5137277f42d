"""What a stopped `fluidpd serve` left behind: live processes of its tree and shared-memory segments (Linux)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from fluidpd.engine.kvstore.shm import default_dir
from fluidpd.runtime.transport.shm_segment import SHM_DIR, leftover_segments


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text.rsplit(")", 1)[1].split()  # after "pid (comm)": the name may hold spaces and parentheses
    return fields[0], int(fields[1])


def alive(pid: int) -> bool:
    """Running or stopped, not gone and not a zombie (one whose parent has not reaped it yet is dead)."""
    st = _stat(pid)
    return st is not None and st[0] != "Z"


def descendants(pid: int) -> list[int]:
    """The live processes below `pid`: its children, theirs, and so on."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(int(name))) is not None and st[0] != "Z":
            children.setdefault(st[1], []).append(int(name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children.get(p, [])
    return sorted(found)


def kill_tree(proc) -> None:
    """SIGKILL a still-running Popen `proc` and every process below it (a test or benchmark leaving early)."""
    if proc.poll() is not None:
        return
    tree = descendants(proc.pid)
    proc.kill()
    proc.wait()
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def processes_left(pids: list[int], timeout_s: float = 60.0) -> list[int]:
    """Those of `pids` still alive after waiting up to `timeout_s` for them to go."""
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def segments_left(server_pid: int, pids: list[int]) -> list[str]:
    """Shared-memory files still there that the server (pid `server_pid`) or its processes `pids` made:
    its node KV store (`--kv-offloading-size`) and the KV transport's segments."""
    left = sorted(str(p) for p in default_dir().glob(f"fluidpd-kv-{server_pid}-*"))
    for pid in [server_pid, *pids]:
        left += [os.path.join(SHM_DIR, n) for n in leftover_segments(pid)]
    return left
