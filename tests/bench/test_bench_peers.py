"""The side-by-side client (fluidpd.bench.peers.client) against a fake OpenAI-compatible server that keeps
connections alive, closes them after each response, or drops requests unanswered; the process-tree RSS."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest

from fluidpd.bench.peers.client import RoundShape, fill, measure
from fluidpd.bench.peers.llamacpp import cache_dir, llama_server_binary
from fluidpd.bench.peers.proctree import tree_pids, tree_rss_bytes
from fluidpd.core.memory import rss_bytes

SHAPE = RoundShape(single_out=5, concurrency=3, conc_out=4)
REQUESTS = 1 + 1 + 1 + 1 + SHAPE.concurrency  # /v1/models, warm-up, single, warm TTFT, concurrent


@dataclass
class FakeServer:
    """HTTP/1.1 with keep-alive unless `close_after_response`; drops the first `drop_posts` POSTs unanswered."""

    close_after_response: bool = False
    drop_posts: int = 0
    refuse_posts: int = 0
    connections: int = 0
    requests: int = 0
    posts: list = field(default_factory=list)  # (prompt, max_tokens) of each POST answered

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                method, path = lines[0].split()[:2]
                headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
                length = int({k.lower(): v for k, v in headers.items()}.get("content-length", 0))
                body = json.loads(await reader.readexactly(length)) if length else {}
                self.requests += 1
                if method == "POST" and self.drop_posts > 0:
                    self.drop_posts -= 1
                    return  # closed with no response: what httpx reports as RemoteProtocolError
                if method == "POST" and self.refuse_posts > 0:
                    self.refuse_posts -= 1
                    await self.send_json(writer, {"error": {"message": "overloaded"}}, b"429 Too Many Requests")
                elif path == "/v1/models":
                    await self.send_json(writer, {"data": [{"id": "fake"}]})
                else:
                    self.posts.append((body["prompt"], body["max_tokens"]))
                    await self.send_stream(writer, body["max_tokens"])
                if self.close_after_response:
                    return  # no `Connection: close` header: the client learns of it only on its next use
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    async def send_json(self, writer: asyncio.StreamWriter, obj: dict, status: bytes = b"200 OK") -> None:
        data = json.dumps(obj).encode()
        writer.write(b"HTTP/1.1 %s\r\nContent-Type: application/json\r\n" % status)
        writer.write(b"Content-Length: %d\r\n\r\n" % len(data))
        writer.write(data)
        await writer.drain()

    async def send_stream(self, writer: asyncio.StreamWriter, tokens: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        events = [{"choices": [{"text": f" t{i}"}]} for i in range(tokens)]
        events.append({"choices": [], "usage": {"completion_tokens": tokens}})
        for event in [*(f"data: {json.dumps(e)}\n\n" for e in events), "data: [DONE]\n\n"]:
            chunk = event.encode()
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
            await asyncio.sleep(0.001)  # tokens apart in time, so a decode rate exists
        writer.write(b"0\r\n\r\n")
        await writer.drain()


def serve(fake: FakeServer, client):
    async def scenario():
        server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            return await client(f"http://127.0.0.1:{port}")
        finally:
            server.close()
            await server.wait_closed()

    return asyncio.run(scenario())


def run_round(fake: FakeServer) -> dict:
    return serve(fake, lambda url: measure(url, lambda name: f"prompt {name}", "round0", SHAPE))


def test_cycling_the_kv_sends_each_unseen_prompt_once_for_one_token():
    fake = FakeServer(drop_posts=1)
    drops = serve(fake, lambda url: fill(url, lambda name: f"prompt {name}", "run", requests=10, concurrency=3))
    assert drops.retried == 1 and drops.lost == 0
    assert sorted(p for p, _ in fake.posts) == sorted(f"prompt run/fill{i}" for i in range(10))
    assert {n for _, n in fake.posts} == {1}


def test_a_connection_per_request_even_when_the_server_keeps_them_alive():
    fake = FakeServer()
    res = run_round(fake)
    assert fake.requests == REQUESTS
    assert fake.connections == REQUESTS  # never reused: an idle one the peer closes cannot be picked up
    assert res["tokens"] == (SHAPE.single_out, SHAPE.concurrency * SHAPE.conc_out)
    assert res["drops"].retried == res["drops"].lost == 0
    assert all(res[k] > 0 for k in ("single", "ttft", "ttft_warm", "conc"))


def test_a_server_closing_every_connection_after_its_response_completes_the_round():
    res = run_round(FakeServer(close_after_response=True))
    assert res["tokens"] == (SHAPE.single_out, SHAPE.concurrency * SHAPE.conc_out)
    assert res["drops"].retried == 0


def test_a_request_dropped_once_is_retried_and_the_round_completes():
    fake = FakeServer(drop_posts=1)
    res = run_round(fake)
    assert res["drops"].retried == 1 and res["drops"].lost == 0
    assert "RemoteProtocolError" in res["drops"].errors[0]
    assert fake.requests == REQUESTS + 1
    assert res["tokens"] == (SHAPE.single_out, SHAPE.concurrency * SHAPE.conc_out)


def test_requests_dropped_twice_are_reported_not_raised():
    # warm-up: dropped, retried, dropped again (lost); single: dropped (retried), then answered
    res = run_round(FakeServer(drop_posts=3))
    assert res["drops"].lost == 1 and res["drops"].retried == 2
    assert res["tokens"][0] == SHAPE.single_out and res["single"] > 0


def test_a_refused_request_is_reported_not_retried():
    fake = FakeServer(refuse_posts=2)  # the warm-up and the single stream
    res = run_round(fake)
    assert fake.requests == REQUESTS
    assert res["drops"].lost == 2 and res["drops"].retried == 0
    assert "HTTP 429" in res["drops"].errors[0]
    assert math.isnan(res["single"]) and res["ttft_warm"] > 0 and res["conc"] > 0


def test_every_request_dropped_gives_a_round_of_nans():
    res = run_round(FakeServer(drop_posts=10**6))
    assert res["drops"].lost == 1 + 1 + 1 + SHAPE.concurrency
    assert all(math.isnan(res[k]) for k in ("single", "ttft", "ttft_warm", "conc"))


def test_tree_rss_sums_the_children():
    child = subprocess.Popen([sys.executable, "-c", "import time; x = bytearray(64 << 20); time.sleep(60)"])
    try:
        while tree_rss_bytes(child.pid) < 64 << 20:  # until the child has filled its buffer
            assert child.poll() is None
            time.sleep(0.01)
        assert child.pid in tree_pids(os.getpid())
        assert tree_rss_bytes(os.getpid()) - rss_bytes() >= 60 << 20
    finally:
        child.kill()
        child.wait()


def test_a_missing_llama_server_says_how_to_build_it(tmp_path, monkeypatch):
    monkeypatch.setenv("FLUIDPD_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path / "llama.cpp"
    with pytest.raises(FileNotFoundError, match=r"scripts/install_llama_cpp\.sh"):
        llama_server_binary()
