"""Talking to the server: its model and limits, its tokenizer, and one streamed completion."""

from __future__ import annotations

import asyncio
import json
import time

from fluidpd.bench.loadgen.requests import BenchRequest, BenchResult


async def server_info(client, base: str) -> dict:
    """Model name and max_model_len from /v1/models; policy from /v1/admin/cluster when there is one."""
    r = await client.get(f"{base}/v1/models")
    r.raise_for_status()
    data = r.json().get("data") or []
    if not data:
        raise ValueError(f"{base}/v1/models lists no model")
    info = {"model": data[0]["id"], "max_model_len": data[0].get("max_model_len"), "policy": None}
    try:
        c = await client.get(f"{base}/v1/admin/cluster")
        if c.status_code == 200:
            state = c.json()
            info["policy"] = state.get("policy")
            info["workers"] = len(state.get("workers") or [])
    except Exception:  # noqa: BLE001 - optional
        pass
    return info


async def tokenize(client, base: str, model: str, text: str) -> tuple[list[int], int | None]:
    r = await client.post(f"{base}/tokenize", json={"model": model, "prompt": text, "add_special_tokens": False})
    r.raise_for_status()
    body = r.json()
    return list(body["tokens"]), body.get("max_model_len")


async def send_one(
    client,
    base: str,
    model: str,
    req: BenchRequest,
    t0: float,
    res: BenchResult,
    temperature: float = 0.0,
    retries: int = 0,
) -> None:
    """Stream one completion; fills `res` (times relative to t0)."""
    body = {
        "model": model,
        "prompt": req.prompt_ids,
        "max_tokens": req.max_tokens,
        "temperature": temperature,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    url = f"{base}/v1/completions"
    await stream_into(client, url, body, t0, res, "not finished before the drain timeout", retries=retries)


MAX_RETRY_WAIT_S = 60.0  # as OpenAI's clients: a longer Retry-After is not waited for


async def stream_into(
    client,
    url: str,
    body: dict,
    t0: float,
    res: BenchResult,
    cancelled: str,
    text: list[str] | None = None,
    retries: int = 0,
) -> None:
    """POST one streamed request; its chunks fill `res` (times relative to t0; the text into `text`).
    A 429 is sent again after its Retry-After, up to `retries` times (as OpenAI's clients do): `res`
    keeps the first send's time, so the wait counts in its TTFT. Every failure is recorded in `res`,
    a cancellation as `cancelled`."""
    res.send_s = time.perf_counter() - t0
    try:
        while True:
            async with client.stream("POST", url, json=body) as resp:
                if resp.status_code != 200:
                    err = (await resp.aread()).decode(errors="replace")
                    wait = _retry_after(resp) if resp.status_code == 429 and res.retries < retries else None
                    if wait is None:
                        res.error = f"HTTP {resp.status_code}: {_message(err)}"
                        return
                else:
                    async for line in resp.aiter_lines():
                        if not line.startswith("data:"):
                            continue
                        data = line[5:].strip()
                        if data == "[DONE]" or not _record(data, time.perf_counter() - t0, res, text):
                            break
                    break
            res.retries += 1
            await asyncio.sleep(wait)
    except asyncio.CancelledError:
        res.error = res.error or cancelled
        raise
    except Exception as exc:  # noqa: BLE001 - every failure is a miss, reported
        res.error = f"{type(exc).__name__}: {exc}"
    if res.error is None and res.finish_reason is None:
        res.error = "stream ended without a finish_reason"


def _retry_after(resp) -> float | None:
    """Seconds a 429 asks to wait (1 when it does not say), None when that is too long to wait."""
    try:
        wait = float(resp.headers.get("Retry-After", "1"))
    except ValueError:
        wait = 1.0
    return wait if 0 <= wait <= MAX_RETRY_WAIT_S else None


def http_client():
    """The load generator's HTTP client: unbounded connections, no read timeout (a drain timeout bounds a run)."""
    import httpx

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(None, connect=30.0), trust_env=False)


def _record(data: str, now: float, res: BenchResult, text: list[str] | None = None) -> bool:
    """One streamed chunk into `res` (its tokens arrived at `now`; chat or completion chunks, their text
    appended to `text`); False when it is an error."""
    obj = json.loads(data)
    if "error" in obj:
        res.error = _message(data)
        res.finish_s = now
        return False
    usage = obj.get("usage")
    for choice in obj.get("choices") or []:
        piece = choice.get("text") or (choice.get("delta") or {}).get("content")
        if piece and text is not None:
            text.append(piece)
        ids = choice.get("token_ids")
        if ids:
            res.output_ids.extend(ids)
        n = len(ids) if ids is not None else (1 if piece else 0)
        res.token_s.extend([now] * n)
        if choice.get("finish_reason"):
            res.finish_reason = choice["finish_reason"]
            res.finish_s = now
    if usage:
        record_usage(usage, res)
        if usage.get("completion_tokens", 0) > len(res.token_s) and res.token_s:
            # chunks without token ids: the rest came with the last one
            res.token_s.extend([res.token_s[-1]] * (usage["completion_tokens"] - len(res.token_s)))
    return True


def record_usage(usage: dict, res: BenchResult) -> None:
    """The server's prompt tokens and cached prompt tokens (OpenAI's
    usage.prompt_tokens_details.cached_tokens; a server that reports none has cached 0)."""
    if usage.get("prompt_tokens") is not None:
        res.usage_prompt_tokens = int(usage["prompt_tokens"])
    details = usage.get("prompt_tokens_details") or {}
    res.cached_tokens = int(details.get("cached_tokens") or 0)


def _message(text: str) -> str:
    try:
        err = json.loads(text).get("error")
        return err.get("message", str(err)) if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        return text[:200]
