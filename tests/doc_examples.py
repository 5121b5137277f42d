"""What tests/test_docs.py's README and docs examples share: fenced blocks, their commands, and `make run`'s server.

The server every HTTP example talks to is started with the very command `make run` runs (read from
`make -n run`), on 127.0.0.1:8000 as the examples say.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
URL = "http://127.0.0.1:8000"
# curl's body, then its status code on a line of its own
CURL = 'curl() { command curl -w "\\n__status=%{http_code}\\n" "$@"; }\n'
FENCE = re.compile(r"```(\w+)\n(.*?)```", re.S)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(text)]


def commands(block: str) -> list[str]:
    """The block's commands: continuation lines joined, comments and blank lines dropped."""
    out, cur = [], ""
    for line in block.splitlines():
        cur += line[:-1] + " " if line.endswith("\\") else line
        if line.endswith("\\"):
            continue
        if cur.strip() and not cur.strip().startswith("#"):
            out.append(cur.strip())
        cur = ""
    return out


def run(cmd: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """`cmd` through bash, with this interpreter's `fluidpd` first on PATH and curl printing its status."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", OMP_NUM_THREADS="1")
    return subprocess.run(["bash", "-c", CURL + cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def check_http(cmd: str, res: subprocess.CompletedProcess) -> None:
    """A command against the server succeeded: exit 0, every curl answer 2xx, no error event in a stream."""
    assert res.returncode == 0, res.stderr
    if cmd.startswith("curl "):
        codes = re.findall(r"__status=(\d+)", res.stdout)
        assert codes and all(c.startswith("2") for c in codes), res.stdout[-2000:]
        assert not any(line.startswith('data: {"error"') for line in res.stdout.splitlines()), res.stdout[-2000:]


def check_python(code: str, cwd: Path, timeout: float = 600) -> None:
    res = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip(), "the example printed nothing"


def serve_command() -> list[str]:
    out = subprocess.run(["make", "-n", "run"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    line = next(line for line in out.splitlines() if " serve" in line and "fluidpd" in line)
    argv = shlex.split(line)
    return [str(Path(sys.executable).parent / "fluidpd"), *argv[1:]]


def wait_ready(proc: subprocess.Popen, log: Path, timeout_s: float = 600) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"`make run`'s server exited: {log.read_text()[-5000:]}")
        try:
            if httpx.get(URL + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    pytest.fail("`make run`'s server did not become healthy")


def wait_idle(timeout_s: float = 600) -> None:
    """Until `make run`'s server has no request outstanding: an example never queues behind the one before
    it (whose client may have left requests running), which the server's admission control could refuse."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if httpx.get(URL + "/v1/admin/cluster", timeout=30).json()["outstanding"] == 0:
            return
        time.sleep(0.5)
    pytest.fail("`make run`'s server still had requests outstanding")


@pytest.fixture
def make_run_idle(make_run_server):
    """`make run`'s server, with nothing outstanding (registered in tests/conftest.py)."""
    wait_idle()
    return make_run_server


@pytest.fixture(scope="session")
def make_run_server(tmp_path_factory):
    """`make run`'s server on 127.0.0.1:8000, started once for the README's and the docs' examples
    (registered in tests/conftest.py); its log in a file (a pipe nobody reads fills up)."""
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", 8000)) == 0:
            pytest.fail("port 8000 is taken: the examples need it (stop whatever serves there)")
    log = tmp_path_factory.mktemp("server") / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            serve_command(), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1")
        )
    try:
        wait_ready(proc, log)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
