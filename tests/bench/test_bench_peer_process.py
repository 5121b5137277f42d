"""A benchmark's server subprocess (fluidpd.bench.peers.process): ready once /health answers, stopped
when the block ends however it ends, and a server that dies on start reported with its log; and
benchmarks/peers/engine_vs_peers.py going on without a peer that cannot start (a fake llama-server that kills
itself with SIGILL, or none) against a fake OpenAI-compatible server standing in for fluidpd."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from fluidpd.bench.peers.llamacpp import describe_build, llama_server_cmd
from fluidpd.bench.peers.process import ServerProcess, ServerStartError, exit_reason, free_port

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SIGILL_SERVER = "#!/bin/sh\nkill -ILL $$\n"

HEALTH_SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def health_server(tmp_path) -> ServerProcess:
    port = free_port()
    cmd = [sys.executable, "-c", HEALTH_SERVER, str(port)]
    return ServerProcess("fake", cmd, f"http://127.0.0.1:{port}", tmp_path / "fake.log")


def test_ready_inside_the_block_and_stopped_after_it(tmp_path):
    with health_server(tmp_path) as server:
        assert httpx.get(server.url + "/health").status_code == 200
    assert server.proc is not None and server.proc.poll() is not None


def test_stopped_when_the_block_raises(tmp_path):
    server = health_server(tmp_path)
    with pytest.raises(KeyboardInterrupt), server:
        raise KeyboardInterrupt
    assert server.proc is not None and server.proc.poll() is not None


def test_a_server_that_dies_on_start_is_reported_with_its_log(tmp_path):
    cmd = [sys.executable, "-c", "import sys; print('no such model file'); sys.exit(3)"]
    server = ServerProcess("broken", cmd, f"http://127.0.0.1:{free_port()}", tmp_path / "broken.log")
    with pytest.raises(RuntimeError, match=r"(?s)broken exited with 3 before it was ready.*no such model file"):
        server.start()


def test_a_server_killed_by_sigill_on_start_says_so(tmp_path):
    binary = tmp_path / "llama-server"
    binary.write_text(SIGILL_SERVER)
    binary.chmod(0o755)
    server = ServerProcess("llama.cpp server", [str(binary)], f"http://127.0.0.1:{free_port()}", tmp_path / "l.log")
    with pytest.raises(ServerStartError) as info:
        server.start()
    assert info.value.reason == "killed by SIGILL (Illegal instruction)"
    assert "llama.cpp server killed by SIGILL (Illegal instruction) before it was ready" in str(info.value)


def test_exit_reasons():
    assert exit_reason(3) == "exited with 3"
    assert exit_reason(-9) == "killed by SIGKILL (Killed)"
    assert exit_reason(-200) == "killed by signal 200"


class FakeOpenAI(http.server.BaseHTTPRequestHandler):
    """/v1/models and streamed /v1/completions, each token a millisecond apart; the connection closes after."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.reply(200, json.dumps({"data": [{"id": "fake"}]}).encode(), "application/json")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(body["max_tokens"]):
            self.wfile.write(f"data: {json.dumps({'choices': [{'text': f' t{i}'}]})}\n\n".encode())
            self.wfile.flush()
            time.sleep(0.001)
        self.wfile.write(b"data: [DONE]\n\n")

    def reply(self, status, data, kind):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def fake_fluidpd():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeOpenAI)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def engine_vs_peers(tmp_path: Path, url: str) -> subprocess.CompletedProcess:
    script = next(BENCHMARKS.rglob("engine_vs_peers.py"))  # wherever benchmarks/ keeps it
    cmd = [sys.executable, str(script), "--url", url, "--peer", "llama.cpp", "--rounds", "1",
           "--plot", str(tmp_path / "p.png"), "--json", str(tmp_path / "r.json")]  # fmt: skip
    env = {**os.environ, "FLUIDPD_CACHE": str(tmp_path / "cache")}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def test_engine_vs_peers_says_plainly_that_a_peer_killed_by_sigill_could_not_start(tmp_path, fake_fluidpd):
    binary = tmp_path / "cache" / "llama.cpp" / "llama-server"
    binary.parent.mkdir(parents=True)
    binary.write_text(SIGILL_SERVER)
    binary.chmod(0o755)
    done = engine_vs_peers(tmp_path, fake_fluidpd)
    out = done.stdout + done.stderr
    assert "Traceback" not in out
    assert ("peer llama.cpp could not start: killed by SIGILL (Illegal instruction) — "
            "rebuild with scripts/install_llama_cpp.sh") in done.stdout  # fmt: skip
    assert "llama.cpp build: no build-flags.txt" in done.stdout
    assert "engine_vs_peers: fluidpd alone: single-stream" in done.stdout  # the others are still measured
    assert done.returncode == 1


def test_engine_vs_peers_without_a_built_peer_goes_on_and_exits_1(tmp_path, fake_fluidpd):
    done = engine_vs_peers(tmp_path, fake_fluidpd)
    assert "Traceback" not in done.stdout + done.stderr
    assert "peer llama.cpp could not start: llama.cpp's server is not at" in done.stdout
    assert "scripts/install_llama_cpp.sh" in done.stdout and "fluidpd alone" in done.stdout
    assert done.returncode == 1
    result = json.loads((tmp_path / "r.json").read_text())  # fluidpd's figures kept, no peer's
    assert list(result["medians"]) == ["fluidpd"] and result["peer"] is None and result["rounds"] == 1
    assert result["medians"]["fluidpd"]["single"] > 0 and len(result["per_round"]["fluidpd"]) == 1
    assert (tmp_path / "p.png").stat().st_size > 0


def test_the_build_flags_the_installer_recorded_are_described(tmp_path, monkeypatch):
    monkeypatch.setenv("FLUIDPD_CACHE", str(tmp_path))
    (tmp_path / "llama.cpp").mkdir()
    (tmp_path / "llama.cpp" / "build-flags.txt").write_text(
        "tier: avx2\nisa: SSE42 AVX2\ncpu: AMD EPYC\nbuilt: 2026-12-07T05:00:00Z\n"
    )
    assert describe_build() == "tier avx2 (SSE42 AVX2), built 2026-12-07T05:00:00Z on AMD EPYC"


def test_llama_server_command_line():
    cmd = llama_server_cmd(Path("/c/llama-server"), "/m.gguf", 8123, threads=2)
    assert cmd[0] == "/c/llama-server" and cmd[cmd.index("-m") + 1] == "/m.gguf"
    assert [cmd[cmd.index(f) + 1] for f in ("-t", "-np", "-c", "--port")] == ["2", "8", "8192", "8123"]
    assert "--cont-batching" in cmd
