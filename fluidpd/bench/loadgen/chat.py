"""One streamed chat completion: its token times, the server's usage and the answer's text."""

from __future__ import annotations

from fluidpd.bench.loadgen.client import stream_into
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
    retries: int = 0,
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
    await stream_into(client, f"{base}/v1/chat/completions", body, t0, res, "cancelled", text, retries)
    return "".join(text)
