"""A server subprocess for a benchmark: started on a free port, ready once its health URL answers 200,
and stopped with the benchmark however it ends (its parent's death included, on Linux)."""

from __future__ import annotations

import ctypes
import ctypes.util
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

PR_SET_PDEATHSIG = 1
# `fluidpd serve` as a benchmark starts it: this host profiled as it is now, never a profile kept from another run
SERVE = [sys.executable, "-m", "fluidpd.cli", "serve", "--no-profile-cache"]


class ServerStartError(RuntimeError):
    """A server that never became ready: `reason` says why in a few words (killed by SIGILL (Illegal
    instruction), exited with 3, not ready within 600 s); the message adds its log's last lines."""

    def __init__(self, name: str, reason: str, log_path: Path, tail: list[str]):
        self.name, self.reason, self.log_path = name, reason, log_path
        super().__init__(f"{name} {reason} before it was ready; log {log_path}:\n" + "\n".join(tail))


def exit_reason(returncode: int) -> str:
    """`exited with N`, or `killed by SIGILL (Illegal instruction)` for a process a signal ended."""
    if returncode >= 0:
        return f"exited with {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        return f"killed by signal {-returncode}"
    return f"killed by {name} ({signal.strsignal(-returncode)})"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    # Runs in the child before exec: the kernel sends it SIGTERM when the benchmark dies, even by SIGKILL.
    name = ctypes.util.find_library("c")
    if sys.platform.startswith("linux") and name:
        ctypes.CDLL(name).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class ServerProcess:
    """One server command run as a context manager: `with ServerProcess(...) as s:` waits until it is ready."""

    def __init__(self, name: str, cmd: list[str], url: str, log_path: Path, ready_timeout_s: float = 600.0):
        self.name, self.cmd, self.url, self.log_path = name, cmd, url, log_path
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace").splitlines()[-5:]
                raise ServerStartError(self.name, exit_reason(self.proc.returncode), self.log_path, tail)
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        tail = self.log_path.read_text(errors="replace").splitlines()[-5:]
        raise ServerStartError(self.name, f"was not ready within {self.ready_timeout_s:.0f} s", self.log_path, tail)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> ServerProcess:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
