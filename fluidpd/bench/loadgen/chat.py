"""One streamed chat completion: its token times, the server's usage and the answer's text."""

from __future__ import annotations

import asyncio
import time

from fluidpd.bench.loadgen.client import _message, _record
from fluidpd.bench.loadgen.requests import BenchResult


async def send_chat(
    client,
    base: str,
    model: str,
    messages: list[dict[str, str]],
    max_tokens: int,
    t0: float,
    res: BenchResult,
    *,
    temperature: float = 0.0,
    ignore_eos: bool = True,
) -> str:
    """Stream one chat completion of `messages`; fills `res` (times relative to t0), returns the answer."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,  # vLLM's extension: every token's arrival, not only those that end a word
    }
    if ignore_eos:
        body["ignore_eos"] = True
    text: list[str] = []
    res.send_s = time.perf_counter() - t0
    try:
        async with client.stream("POST", f"{base}/v1/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                err = (await resp.aread()).decode(errors="replace")
                res.error = f"HTTP {resp.status_code}: {_message(err)}"
                return ""
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]" or not _record(data, time.perf_counter() - t0, res, text):
                    break
    except asyncio.CancelledError:
        res.error = res.error or "cancelled"
        raise
    except Exception as exc:  # noqa: BLE001 - every failure is a miss, reported
        res.error = f"{type(exc).__name__}: {exc}"
    if res.error is None and res.finish_reason is None:
        res.error = "stream ended without a finish_reason"
    return "".join(text)
