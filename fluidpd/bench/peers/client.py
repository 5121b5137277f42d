"""One round of the side-by-side against one server: single-stream decode tok/s, TTFT of an unseen and of
a just-seen prompt, and output tok/s of concurrent streams, over connections that are never kept alive
(a peer may close an idle one under the client), each request retried once if the server drops it."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

DROPPED = (httpx.RemoteProtocolError, httpx.NetworkError)  # closed without (all of) a response
NAN = math.nan


@dataclass(frozen=True)
class RoundShape:
    """Prompt and output lengths of a round (prompt length is the prompt function's business)."""

    single_out: int = 64
    concurrency: int = 8
    conc_out: int = 32


class Refused(RuntimeError):
    """The server answered with an error status (a 429 of admission control, say): reported, not retried."""


@dataclass
class Drops:
    """Requests the server dropped or refused: retried ones, and those lost (dropped twice, or refused),
    which are reported and left out of the round."""

    retried: int = 0
    lost: int = 0
    errors: list[str] = field(default_factory=list)


def new_client(url: str, timeout_s: float = 600.0) -> httpx.AsyncClient:
    """A client that opens a connection per request: no idle connection for the server to close under it."""
    return httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=httpx.Limits(max_keepalive_connections=0))


async def stream_once(client: httpx.AsyncClient, model: str, text: str, max_tokens: int) -> dict:
    """One streamed greedy completion: TTFT, decode tok/s ((tokens - 1) from first to last token), tokens."""
    body = {"model": model, "prompt": text, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    body |= {"ignore_eos": True, "stream_options": {"include_usage": True}}
    t0, times, usage = time.perf_counter(), [], None
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise Refused(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line.strip() == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
            if any(c.get("text") for c in event.get("choices") or ()):
                times.append(time.perf_counter())
    if not times:
        raise RuntimeError(f"the server streamed no text for a {max_tokens}-token completion")
    n = (usage or {}).get("completion_tokens") or len(times)
    span = times[-1] - times[0]
    decode = (n - 1) / span if n > 1 and span > 0 else NAN
    return {"ttft": times[0] - t0, "decode": decode, "tokens": n, "end": times[-1]}


async def stream(client: httpx.AsyncClient, model: str, text: str, max_tokens: int, drops: Drops) -> dict | None:
    """`stream_once`, tried a second time if the server drops it; None (counted in `drops`) if it drops both
    or refuses it."""
    for attempt in range(2):
        try:
            return await stream_once(client, model, text, max_tokens)
        except DROPPED as exc:
            drops.errors.append(f"{type(exc).__name__}: {exc}")
            if attempt == 0:
                drops.retried += 1
        except Refused as exc:
            drops.errors.append(str(exc))
            break
    drops.lost += 1
    return None


async def model_id(client: httpx.AsyncClient, drops: Drops) -> str:
    for attempt in range(2):
        try:
            r = await client.get("/v1/models")
            r.raise_for_status()
            return r.json()["data"][0]["id"]
        except DROPPED as exc:
            drops.errors.append(f"{type(exc).__name__}: {exc}")
            if attempt == 0:
                drops.retried += 1
    raise RuntimeError(f"{client.base_url} dropped /v1/models twice: {drops.errors[-1]}")


async def measure(url: str, prompt: Callable[[str], str], key: str, shape: RoundShape = RoundShape()) -> dict:
    """One round. `prompt(name)` gives a text no server has seen for each new name (`key` makes names unique
    per round), so `ttft` is cold for a prefix cache; `ttft_warm` sends the single-stream prompt again."""
    drops = Drops()
    async with new_client(url) as client:
        model = await model_id(client, drops)
        await stream(client, model, prompt(f"{key}/warmup"), 4, drops)  # first-request costs are not measured
        text = prompt(f"{key}/single")
        one = await stream(client, model, text, shape.single_out, drops)
        again = await stream(client, model, text, 1, drops)
        texts = [prompt(f"{key}/conc{i}") for i in range(shape.concurrency)]  # made before the clock starts
        t0 = time.perf_counter()
        many = await asyncio.gather(*(stream(client, model, t, shape.conc_out, drops) for t in texts))
    done = [r for r in many if r is not None]
    conc = sum(r["tokens"] for r in done) / (max(r["end"] for r in done) - t0) if len(done) == len(many) else NAN
    return {"single": one["decode"] if one else NAN, "ttft": one["ttft"] if one else NAN,
            "ttft_warm": again["ttft"] if again else NAN, "conc": conc,
            "tokens": (one["tokens"] if one else 0, sum(r["tokens"] for r in done)), "drops": drops}  # fmt: skip


async def fill(url: str, prompt: Callable[[str], str], key: str, requests: int, concurrency: int = 8) -> Drops:
    """`requests` unseen prompts, one output token each, `concurrency` at a time: enough of them cycle a
    server's whole KV cache through use, so its resident memory afterwards is what it holds for good."""
    drops, names = Drops(), iter(range(requests))
    async with new_client(url) as client:
        model = await model_id(client, drops)

        async def lane() -> None:
            for i in names:
                await stream(client, model, prompt(f"{key}/fill{i}"), 1, drops)

        await asyncio.gather(*(lane() for _ in range(concurrency)))
    return drops
