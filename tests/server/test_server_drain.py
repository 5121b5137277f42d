"""Graceful drain on SIGTERM: the real `fluidpd serve` with two process workers and a node KV store in
/dev/shm, streams in flight; no admitted request lost, then no process or segment left behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from serverhelp import healthy

from fluidpd.bench.leftovers import descendants, kill_tree, processes_left, segments_left
from fluidpd.bench.peers.process import free_port
from fluidpd.server.config import ServeConfig

SERVE = [
    "--workers", "2", "--backend", "process", "--num-kv-blocks", "256", "--max-model-len", "512",
    "--kv-offloading-size", "0.02", "--log-level", "warning",
]  # fmt: skip
WAIT_S = 300.0  # far above the work on a loaded 2-core host: a hang guard, never a latency bound


@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    log: Path
    workers: list[int] = field(default_factory=list)  # the worker processes' pids
    store: str = ""  # the node KV store's file

    def signal(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def stderr(self) -> str:
        return self.log.read_text()


@contextlib.contextmanager
def serving(tmp_path: Path, *extra: str):
    """A started `fluidpd serve` (killed with its whole tree if the test leaves it running)."""
    port = free_port()
    log = tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "fluidpd.cli", "serve", *SERVE, "--port", str(port), *extra]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    srv = Server(proc, f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + WAIT_S
        while not healthy(srv.url):
            assert proc.poll() is None and time.monotonic() < deadline, srv.stderr()
            time.sleep(1.0)
        state = httpx.get(srv.url + "/v1/admin/cluster").json()
        srv.workers = [w["pid"] for w in state["workers"]]
        srv.store = state["kv_store"]["path"]
        yield srv
    finally:
        kill_tree(proc)


class Stream(threading.Thread):
    """One streamed completion read on a thread: its text chunks, finish reason, error event and [DONE]."""

    def __init__(self, url: str, prompt: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.url, self.max_tokens = url, max_tokens
        self.body = {
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        self.first = threading.Event()
        self.status = 0
        self.finish: str | None = None
        self.error: dict | None = None
        self.done = False
        self.completion_tokens = 0
        self.failure: BaseException | None = None  # the connection broke (not an event the client saw)

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.url + "/v1/completions", json=self.body, timeout=WAIT_S) as r:
                self.status = r.status_code
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self._event(line[6:])
        except BaseException as exc:  # noqa: BLE001 - recorded for the test to assert on
            self.failure = exc
        finally:
            self.first.set()

    def _event(self, data: str) -> None:
        if data == "[DONE]":
            self.done = True
            return
        obj = json.loads(data)
        if "error" in obj:
            self.error = obj["error"]
        for choice in obj.get("choices") or []:
            self.first.set()
            self.finish = choice.get("finish_reason") or self.finish
        if obj.get("usage"):
            self.completion_tokens = obj["usage"]["completion_tokens"]


def start_streams(url: str, max_tokens: list[int]) -> list[Stream]:
    streams = [Stream(url, f"Story {i}: once upon a time", n) for i, n in enumerate(max_tokens)]
    for s in streams:
        s.start()
    for s in streams:
        assert s.first.wait(WAIT_S) and s.failure is None and s.status == 200, (s.status, s.failure)
    return streams


def wait_draining(url: str) -> httpx.Response:
    """/health once the server has taken the signal (it answers 200 until its next tick)."""
    deadline = time.monotonic() + WAIT_S
    while (r := httpx.get(url + "/health", timeout=WAIT_S)).status_code == 200 and time.monotonic() < deadline:
        time.sleep(0.02)
    return r


def assert_nothing_left(srv: Server, tree: list[int]) -> None:
    assert srv.workers and set(srv.workers) <= set(tree)
    assert processes_left(tree) == []
    assert not os.path.exists(srv.store)
    assert segments_left(srv.proc.pid, tree) == []


@pytest.mark.slow
def test_sigterm_finishes_the_streams_in_flight_refuses_new_ones_and_exits_0(tmp_path):
    with serving(tmp_path) as srv:
        assert os.path.exists(srv.store)
        streams = start_streams(srv.url, [24, 32, 48, 160])  # the longest keeps the drain open for the checks
        tree = descendants(srv.proc.pid)
        srv.signal()
        health = wait_draining(srv.url)
        assert health.status_code == 503 and health.json()["status"] == "draining"
        assert health.json()["outstanding"] >= 1
        for stream in (False, True):
            r = httpx.post(srv.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 4, "stream": stream})
            assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
            assert r.json()["error"]["type"] == "service_unavailable" and r.json()["error"]["code"] == "server_draining"
        for s in streams:
            s.join(WAIT_S)
            assert s.failure is None and s.error is None, (s.failure, s.error)
            assert s.finish == "length" and s.done and s.completion_tokens == s.max_tokens
        assert srv.proc.wait(WAIT_S) == 0, srv.stderr()
        assert "drained in" in srv.stderr()
        assert_nothing_left(srv, tree)


@pytest.mark.slow
@pytest.mark.parametrize("cut_by", ["second signal", "timeout"])
def test_a_second_signal_or_the_timeout_cuts_the_streams_visibly_and_exits_1(tmp_path, cut_by):
    timeout = "1" if cut_by == "timeout" else str(WAIT_S)
    with serving(tmp_path, "--shutdown-timeout-s", timeout) as srv:
        streams = start_streams(srv.url, [480, 480, 480])  # far longer than the drain allows
        tree = descendants(srv.proc.pid)
        srv.signal()
        assert wait_draining(srv.url).json()["status"] == "draining"
        if cut_by == "second signal":
            srv.signal()
        for s in streams:
            s.join(WAIT_S)
            assert not s.is_alive() and s.failure is None, s.failure
            assert s.error is not None and s.error["type"] == "service_unavailable", s.error
            assert s.finish is None and s.done
        assert srv.proc.wait(WAIT_S) == 1, srv.stderr()
        assert f"cut 3 admitted requests at {'a second signal' if cut_by == 'second signal' else 'the 1 s'}" in (
            srv.stderr()
        )
        assert_nothing_left(srv, tree)


def test_the_shutdown_timeout_is_a_flag_and_must_not_be_negative():
    from fluidpd.cli import build_parser

    args = build_parser().parse_args(["serve", "--shutdown-timeout-s", "2.5"])
    assert args.shutdown_timeout_s == 2.5
    assert build_parser().parse_args(["serve"]).shutdown_timeout_s == ServeConfig().shutdown_timeout_s
    with pytest.raises(ValueError, match="shutdown_timeout_s"):
        ServeConfig(shutdown_timeout_s=-1)


def test_a_draining_runtime_refuses_with_503_retry_after_and_health_says_so(served, monkeypatch):
    monkeypatch.setattr(served.runtime, "draining", True)
    for stream in (False, True):
        r = httpx.post(served.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "stream": stream})
        assert r.status_code == 503 and r.headers["Retry-After"] == "1"
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = httpx.post(served.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 503 and r.json()["error"]["code"] == "server_draining"
    health = httpx.get(served.url + "/health")
    assert health.status_code == 503 and health.json()["status"] == "draining" and "outstanding" in health.json()
