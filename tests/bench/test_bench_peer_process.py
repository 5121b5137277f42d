"""A benchmark's server subprocess (fluidpd.bench.peers.process): ready once /health answers, stopped
when the block ends however it ends, and a server that dies on start reported with its log."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from fluidpd.bench.peers.llamacpp import llama_server_cmd
from fluidpd.bench.peers.process import ServerProcess, free_port

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


def test_llama_server_command_line():
    cmd = llama_server_cmd(Path("/c/llama-server"), "/m.gguf", 8123, threads=2)
    assert cmd[0] == "/c/llama-server" and cmd[cmd.index("-m") + 1] == "/m.gguf"
    assert [cmd[cmd.index(f) + 1] for f in ("-t", "-np", "-c", "--port")] == ["2", "8", "8192", "8123"]
    assert "--cont-batching" in cmd
