"""Every example in the README runs, verbatim, and succeeds.

The quickstart block must be exactly the two-command contract (`make run`, `make test`; CI runs
the second). The server every HTTP example talks to is started with the very command `make run`
runs (read from `make -n run`), on 127.0.0.1:8000 as the examples say. Then every fenced `bash`
line runs through bash (curl examples must answer 2xx) and every `python` block runs with this
interpreter; `fluidpd` commands run from a scratch directory so their outputs land there.
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
README = (ROOT / "README.md").read_text()
BLOCKS = [(m.group(1), m.group(2)) for m in re.finditer(r"```(\w+)\n(.*?)```", README, re.S)]
QUICKSTART = "make run"
URL = "http://127.0.0.1:8000"
# curl's body, then its status code on a line of its own
CURL = 'curl() { command curl -w "\\n__status=%{http_code}\\n" "$@"; }\n'


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


BASH = [c for lang, b in BLOCKS if lang == "bash" for c in commands(b)]
PYTHON = [b for lang, b in BLOCKS if lang == "python"]
ONLINE = [c for c in BASH if c.startswith("curl ") or c.startswith("fluidpd bench ")]
OFFLINE = [c for c in BASH if c.startswith("fluidpd ") and c not in ONLINE]


def run(cmd: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", OMP_NUM_THREADS="1")
    return subprocess.run(["bash", "-c", CURL + cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_readme_is_made_of_runnable_examples():
    assert BLOCKS and BASH and PYTHON
    quick = [b for lang, b in BLOCKS if lang == "bash" and QUICKSTART in b]
    first = [c.split(" #")[0].strip() for c in commands(quick[0])] if quick else []
    assert first == ["make run", "make test"], "the quickstart is the two commands"
    other = [c for c in BASH if c not in ONLINE + OFFLINE and not c.startswith(("make run ", "make test "))]
    assert not other, f"README commands this test does not know how to run: {other}"


def serve_command() -> list[str]:
    out = subprocess.run(["make", "-n", "run"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    line = next(line for line in out.splitlines() if " serve" in line and "fluidpd" in line)
    argv = shlex.split(line)
    return [str(Path(sys.executable).parent / "fluidpd"), *argv[1:]]


def wait_ready(proc: subprocess.Popen, timeout_s: float = 600) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"`make run`'s server exited: {proc.stdout.read()}")
        try:
            if httpx.get(URL + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    pytest.fail("`make run`'s server did not become healthy")


@pytest.fixture(scope="module")
def server():
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", 8000)) == 0:
            pytest.fail("port 8000 is taken: the README's examples need it (stop whatever serves there)")
    proc = subprocess.Popen(
        serve_command(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    try:
        wait_ready(proc)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.slow
@pytest.mark.parametrize("cmd", ONLINE)
def test_http_example(server, cmd, tmp_path):
    res = run(cmd, tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr
    if cmd.startswith("curl "):
        codes = re.findall(r"__status=(\d+)", res.stdout)
        assert codes and all(c.startswith("2") for c in codes), res.stdout[-2000:]
        assert not any(line.startswith('data: {"error"') for line in res.stdout.splitlines()), res.stdout[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("code", PYTHON)
def test_python_example(server, code, tmp_path):
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip(), "the example printed nothing"


@pytest.mark.slow
@pytest.mark.parametrize("cmd", OFFLINE)
def test_command_example(cmd, tmp_path):
    res = run(cmd, tmp_path, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
