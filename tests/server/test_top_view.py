"""`fluidpd top`'s frame and its errors, against canned answers and tiny HTTP servers (no model)."""

from __future__ import annotations

import http.server
import io
import json
import threading

import pytest
from rich.console import Console

from fluidpd.cli import main
from fluidpd.cli.top_view import TopError, fetch, render, sparkline

SNAP = {
    "policy": "fluidpd",
    "model": "smollm2",
    "state": "prefill_heavy",
    "now_s": 42.0,
    "outstanding": 5,
    "draining": True,
    "workers_down": [],
    "slo": {"ttft_s": 5.0, "tbt_s": 0.5},
    "ppi": 0.8,
    "dpi": 0.1,
    "history": {"t_s": [0, 1, 2, 3], "ppi": [0.0, 0.2, 0.4, 0.8], "dpi": [0.1, 0.1, 0.1, 0.1]},
    "recent": {
        "window_s": 60,
        "finished": 12,
        "ttft_p50_s": 0.5,
        "ttft_p99_s": 2.5,
        "tbt_p50_s": 0.03,
        "tbt_p99_s": 0.2,
        "attainment": 0.75,
        "strict_attainment": 0.5,
        "refused": 3,
        "failed": 1,
    },
    "workers": [
        {
            "id": 0,
            "role": "prefill",
            "routable": True,
            "transition": None,
            "running": 1,
            "waiting": 4,
            "kv_blocks_used": 10,
            "kv_blocks_total": 40,
            "prefix_cache": {"cached_blocks": 7, "hit_rate": 0.25},
            "step_time_ewma_s": 0.0,
            "tokens_out": 100,
            "borrowed_chunks": 0,
        },
        {
            "id": 1,
            "role": "decode",
            "routable": False,
            "running": 3,
            "waiting": 0,
            "kv_blocks_used": 30,
            "kv_blocks_total": 80,
            "prefix_cache": {"cached_blocks": 2, "hit_rate": 0.5},
            "step_time_ewma_s": 0.031,
            "tokens_out": 400,
            "borrowed_chunks": 9,
            "transition": {"worker": 1, "from": "decode", "to": "prefill", "phase": "migrate", "done": False},
        },
    ],
    "transitions": [
        {
            "worker": 1,
            "from": "decode",
            "to": "prefill",
            "reason": "auto: PPI",
            "began_s": 40.5,
            "phase": "migrate",
            "done": False,
            "total_s": None,
        }
    ],
    "losses": [{"worker": 2, "at_s": 12.0, "reason": "WorkerError: gone", "restarted": 4}],
}


def text(renderable) -> str:
    c = Console(file=io.StringIO(), width=200, force_terminal=False)
    c.print(renderable)
    return c.file.getvalue()


def test_a_frame_shows_workers_pressure_the_last_minute_and_the_switches():
    prev = json.loads(json.dumps(SNAP))
    prev["now_s"], prev["workers"][1]["tokens_out"] = 40.0, 300
    del prev["workers"][0]  # a worker the last answer did not have: no rate yet
    frame = text(render(SNAP, prev))
    assert "state prefill_heavy" in frame and "DRAINING" in frame and "5 in flight" in frame
    assert "PPI   0.80  ▁▃▅█" in frame and "DPI   0.10  ████" in frame
    assert "12 finished" in frame and "p99 2.50 s" in frame and "p99 200 ms" in frame
    assert "joint 75.0% strict 50.0%" in frame and "refused 3" in frame and "failed 1" in frame
    rows = {ln.split()[0]: ln.split("│") for ln in frame.splitlines() if ln.strip()[:1].isdigit()}
    assert [c.strip() for c in rows["1"]] == [
        "1",
        "decode",
        "→prefill (migrate)",
        "3",
        "0",
        "30/80 38%",
        "2",
        "50.0%",
        "31 ms",
        "50.0",
        "9",
    ]
    assert [c.strip() for c in rows["0"]][5:] == ["10/40 25%", "7", "25.0%", "0 ms", "-", "0"]  # no old answer
    assert "worker 1 decode→prefill (auto: PPI): migrate" in frame
    assert "worker 2: WorkerError: gone (4 restarted)" in frame


def test_a_failed_refresh_keeps_the_last_frame_and_says_why():
    frame = text(render(SNAP, error="cannot reach http://x: refused"))
    assert frame.startswith("! cannot reach http://x: refused (showing the last answer; retrying)")


def test_sparkline_scales_to_its_largest_value():
    assert sparkline([0, 1, 2, 4]) == "▁▃▅█"
    assert sparkline([0.0, 0.0]) == "▁▁" and sparkline([None, float("nan"), 1.0]) == "▁▁█"
    assert len(sparkline(list(range(100)), width=10)) == 10


class _Answer(http.server.BaseHTTPRequestHandler):
    status, body = 200, b"{}"

    def do_GET(self):
        self.send_response(self.status)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.fixture()
def answering():
    servers = []

    def start(status: int, body: bytes) -> str:
        handler = type("H", (_Answer,), {"status": status, "body": body})
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for srv in servers:
        srv.shutdown()


def test_errors_are_plain_messages(answering):
    refused = json.dumps({"error": {"message": "Missing or invalid API key", "code": 401}}).encode()
    with pytest.raises(TopError, match="refused the key \\(HTTP 401\\): pass --api-key"):
        fetch(answering(401, refused), None)
    with pytest.raises(TopError, match="check --api-key"):
        fetch(answering(401, refused), "wrong")
    with pytest.raises(TopError, match="is it a FluidPD server"):
        fetch(answering(404, b"{}"), None)
    with pytest.raises(TopError, match="did not answer JSON"):
        fetch(answering(200, b"<html>"), None)
    assert fetch(answering(200, json.dumps(SNAP).encode()), None)["state"] == "prefill_heavy"


def test_the_command_exits_1_with_one_line_when_the_server_is_unreachable(capsys):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["top", "--url", f"http://127.0.0.1:{port}", "--once"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"fluidpd top: cannot reach http://127.0.0.1:{port}") and "Traceback" not in err
    assert "is `fluidpd serve` running there?" in err
