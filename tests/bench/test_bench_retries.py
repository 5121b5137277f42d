"""`fluidpd bench --retries`: a 429 is sent again after its Retry-After, as OpenAI's clients do, and its
TTFT counts from the first send; past the retries, or for a Retry-After too long to wait, it fails.
Against a fake server that refuses a set number of POSTs first (the client is what is tested)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import pytest

from fluidpd.bench.loadgen.client import http_client, send_one
from fluidpd.bench.loadgen.requests import BenchRequest, BenchResult

pytest.importorskip("httpx")


@dataclass
class Refusing:
    """Answers the first `refuse` POSTs 429 with `retry_after`, then streams `tokens` tokens."""

    refuse: int
    retry_after: str = "0"
    tokens: int = 3
    posts: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            await reader.readexactly(length)
            self.posts += 1
            if self.posts <= self.refuse:
                body = json.dumps({"error": {"message": "the server is overloaded", "code": "rate_limit_exceeded"}})
                writer.write(
                    b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nRetry-After: %s\r\n"
                    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                    % (self.retry_after.encode(), len(body), body.encode())
                )
            else:
                events = [{"choices": [{"text": f" t{i}", "token_ids": [i]}]} for i in range(self.tokens)]
                events[-1]["choices"][0]["finish_reason"] = "length"
                data = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n"
                    b"Connection: close\r\n\r\n%s" % (len(data), data.encode())
                )
            await writer.drain()
        finally:
            writer.close()


def send(server: Refusing, retries: int) -> BenchResult:
    async def scenario() -> BenchResult:
        srv = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        res = BenchResult(0, 2, 3)
        try:
            async with http_client() as client:
                req = BenchRequest(0, 0.0, [1, 2], 3)
                await send_one(
                    client, f"http://127.0.0.1:{port}", "fake", req, time.perf_counter(), res, retries=retries
                )
        finally:
            srv.close()
            await srv.wait_closed()
        return res

    return asyncio.run(scenario())


def test_a_429_is_sent_again_and_its_ttft_counts_from_the_first_send():
    server = Refusing(refuse=2, retry_after="1")
    res = send(server, retries=2)
    assert res.ok and res.retries == 2 and server.posts == 3
    assert res.output_ids == [0, 1, 2]
    assert res.token_s[0] - res.send_s >= 2.0  # the two Retry-After waits are in its TTFT


def test_past_its_retries_a_429_is_a_failure_with_the_servers_message():
    server = Refusing(refuse=3)
    res = send(server, retries=2)
    assert not res.ok and res.retries == 2 and server.posts == 3
    assert res.error == "HTTP 429: the server is overloaded"


def test_without_retries_or_with_a_retry_after_too_long_to_wait_a_429_fails_at_once():
    assert send(Refusing(refuse=1), retries=0).error == "HTTP 429: the server is overloaded"
    server = Refusing(refuse=1, retry_after="3600")
    res = send(server, retries=2)
    assert res.retries == 0 and server.posts == 1 and res.error.startswith("HTTP 429")
