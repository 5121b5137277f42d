"""Open-loop load generator: replay a trace against a running server's streaming completions API.

Every request of the (rate-scaled, windowed) trace is sent at its own timestamp, whatever the
server is doing, with a prompt of exactly the trace's prompt length (token ids cut from the
shipped corpus, tokenized by the server's own /tokenize) and max_tokens = the trace's output
length with ignore_eos, so the server generates exactly that many tokens. The client records
the time to first token and every inter-token gap, and aggregates them the way the simulator
does (fluidpd.core.metrics.MetricsCollector), so the rows compare with `fluidpd simulate`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import json
import math
import sys
import time
import urllib.parse
from dataclasses import dataclass, field

import numpy as np

from fluidpd.bench.corpus import PromptMaker, load_corpus
from fluidpd.core.knobs import knob
from fluidpd.core.metrics import MetricsCollector, Slo
from fluidpd.core.request import Request
from fluidpd.workload.trace import Trace

LOOPBACK_NAMES = ("localhost",)


def check_loopback(url: str) -> str:
    """The base URL (no trailing /v1) of a loopback server; ValueError for any other target."""
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    host = u.hostname.lower()
    ok = host in LOOPBACK_NAMES or host.endswith(".localhost")
    if not ok:
        try:
            ok = ipaddress.ip_address(host).is_loopback
        except ValueError:
            ok = False
    if not ok:
        raise ValueError(
            f"refusing to send load to {host!r}: fluidpd bench only targets loopback servers "
            f"(127.0.0.0/8, ::1, localhost)"
        )
    path = u.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return urllib.parse.urlunsplit((u.scheme, u.netloc, path, "", "")).rstrip("/")


@dataclass(slots=True)
class BenchRequest:
    index: int
    arrival_s: float  # offset from the start of the run
    prompt_ids: list[int]
    max_tokens: int


@dataclass(slots=True)
class BenchResult:
    index: int
    prompt_len: int
    max_tokens: int
    send_s: float = math.nan
    token_s: list[float] = field(default_factory=list)  # arrival time of every token
    finish_s: float = math.nan
    finish_reason: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.finish_reason is not None and bool(self.token_s)


@dataclass
class Plan:
    requests: list[BenchRequest]
    clipped_prompts: int = 0
    clipped_outputs: int = 0


def plan_requests(trace: Trace, corpus_ids: list[int], max_model_len: int | None, seed: int = 0) -> Plan:
    """Prompts and output lengths of every request, clipped so prompt + output <= max_model_len."""
    maker = PromptMaker(corpus_ids, seed)
    plan = Plan([])
    for i, (t, p, o) in enumerate(zip(trace.arrival_s, trace.prompt_len, trace.output_len)):
        p, o = int(p), max(int(o), 1)
        if max_model_len:
            if o > max_model_len - 1:
                o = max(max_model_len - 1, 1)
                plan.clipped_outputs += 1
            if p + o > max_model_len:
                p = max(max_model_len - o, 1)
                plan.clipped_prompts += 1
        plan.requests.append(BenchRequest(i, float(t), maker.make(p), o))
    return plan


# ---------------------------------------------------------------------- talking to the server


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
    client, base: str, model: str, req: BenchRequest, t0: float, res: BenchResult, temperature: float = 0.0
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
    res.send_s = time.perf_counter() - t0
    try:
        async with client.stream("POST", f"{base}/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                res.error = f"HTTP {resp.status_code}: {_message(text)}"
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter() - t0
                obj = json.loads(data)
                if "error" in obj:
                    res.error = _message(data)
                    res.finish_s = now
                    return
                usage = obj.get("usage")
                for choice in obj.get("choices") or []:
                    ids = choice.get("token_ids")
                    n = len(ids) if ids is not None else (1 if choice.get("text") else 0)
                    res.token_s.extend([now] * n)
                    if choice.get("finish_reason"):
                        res.finish_reason = choice["finish_reason"]
                        res.finish_s = now
                if usage and usage.get("completion_tokens", 0) > len(res.token_s) and res.token_s:
                    # chunks without token ids: the rest came with the last one
                    res.token_s.extend([res.token_s[-1]] * (usage["completion_tokens"] - len(res.token_s)))
    except asyncio.CancelledError:
        res.error = res.error or "not finished before the drain timeout"
        raise
    except Exception as exc:  # noqa: BLE001 - every failure is a miss, reported
        res.error = f"{type(exc).__name__}: {exc}"
    if res.error is None and res.finish_reason is None:
        res.error = "stream ended without a finish_reason"


def _message(text: str) -> str:
    try:
        err = json.loads(text).get("error")
        return err.get("message", str(err)) if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        return text[:200]


async def replay(
    client,
    base: str,
    model: str,
    requests: list[BenchRequest],
    *,
    drain_timeout_s: float = 300.0,
    progress: bool = True,
    temperature: float = 0.0,
) -> tuple[list[BenchResult], float]:
    """Send every request at its arrival offset (open loop); results and the run's wall time."""
    from tqdm import tqdm

    results = [BenchResult(r.index, len(r.prompt_ids), r.max_tokens) for r in requests]
    bar = tqdm(
        total=len(requests),
        desc="bench",
        unit="req",
        file=sys.stderr,
        disable=not progress,
        mininterval=0.5,
        dynamic_ncols=True,
    )
    t0 = time.perf_counter()

    async def run(req: BenchRequest, res: BenchResult) -> None:
        delay = t0 + req.arrival_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        try:
            await send_one(client, base, model, req, t0, res, temperature)
        finally:
            bar.update(1)
            bar.set_postfix_str(f"failed={sum(1 for r in results if r.error)}", refresh=False)

    tasks = [asyncio.create_task(run(q, r)) for q, r in zip(requests, results)]
    horizon = (requests[-1].arrival_s if requests else 0.0) + drain_timeout_s
    try:
        _, pending = await asyncio.wait(tasks, timeout=horizon) if tasks else (set(), set())
        for t in pending:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        bar.close()
    for r in results:
        if r.error is None and r.finish_reason is None:
            r.error = "not finished before the drain timeout"
    return results, time.perf_counter() - t0


# ---------------------------------------------------------------------- aggregates


def summarize(results: list[BenchResult], slo: Slo, policy: str) -> dict:
    """The `fluidpd simulate` row for these results (failed requests count as misses)."""
    mc = collect(results, slo)
    row = {"policy": policy, **mc.summary(len(results))}
    row["failed"] = mc.rejected
    return row


def collect(results: list[BenchResult], slo: Slo) -> MetricsCollector:
    """The results as the simulator's metrics (TTFT per request, every gap); failed ones as rejected."""
    mc = MetricsCollector(slo)
    failed = 0
    for r in results:
        if not r.ok:
            failed += 1
            continue
        req = Request(r.index, r.send_s, r.prompt_len, len(r.token_s))
        times = r.token_s
        req.generated = len(times)
        req.first_token_s, req.last_token_s, req.finish_s = times[0], times[-1], max(r.finish_s, times[-1])
        for a, b in itertools.pairwise(times):
            mc.on_gap(b - a)
            req.add_gap(b - a, slo.tbt_s)
        mc.on_finish(req)
    mc.rejected = failed
    return mc


def error_counts(results: list[BenchResult]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in results:
        if r.error:
            out[r.error] = out.get(r.error, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


@dataclass
class BenchConfig:
    """One replay: the server, the trace, the SLOs and how requests are made."""

    url: str
    trace: Trace
    slo: Slo
    trace_name: str = ""
    model: str | None = knob(None, "model name to send (default: the server's)")
    max_model_len: int | None = knob(None, "clip prompt + output to this (default: the server's)")
    seed: int = knob(0, "trace loading and prompt offsets")
    drain_timeout_s: float = knob(
        300.0, "seconds after the last arrival before unfinished requests count as failed", flag="--drain-timeout"
    )
    progress: bool = knob(True, "show a progress bar")
    temperature: float = 0.0
    tokenizer: str | None = knob(
        None, "local tokenizer source ('smollm2', a .gguf, a dir) if the server has no /tokenize"
    )

    def __post_init__(self) -> None:
        if not self.drain_timeout_s > 0:
            raise ValueError(f"drain_timeout_s must be > 0, got {self.drain_timeout_s}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")


async def run_bench(cfg: BenchConfig) -> tuple[dict, list[BenchResult]]:
    """Replay cfg.trace against cfg.url; (row, per-request results)."""
    import httpx

    base = check_loopback(cfg.url)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    timeout = httpx.Timeout(None, connect=30.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        info = await server_info(client, base)
        model = cfg.model or info["model"]
        text = load_corpus()
        if cfg.tokenizer:
            ids, mml = _local_tokenize(cfg.tokenizer, text), None
        else:
            try:
                ids, mml = await tokenize(client, base, model, text)
            except httpx.HTTPStatusError as exc:
                raise ValueError(
                    f"the server cannot tokenize ({exc.response.status_code} from /tokenize); "
                    f"pass --tokenizer with the served model's tokenizer"
                ) from None
        max_len = cfg.max_model_len or info.get("max_model_len") or mml
        plan = plan_requests(cfg.trace, ids, max_len, cfg.seed)
        results, wall = await replay(
            client,
            base,
            model,
            plan.requests,
            drain_timeout_s=cfg.drain_timeout_s,
            progress=cfg.progress,
            temperature=cfg.temperature,
        )
    row = summarize(results, cfg.slo, info.get("policy") or "server")
    sent = [r.send_s for r in results if not math.isnan(r.send_s)]
    lag = [r.send_s - q.arrival_s for r, q in zip(results, plan.requests) if not math.isnan(r.send_s)]
    row.update(
        {
            "wall_s": wall,
            "clipped_prompts": plan.clipped_prompts,
            "clipped_outputs": plan.clipped_outputs,
            "max_model_len": max_len,
            "model": model,
            "trace": cfg.trace_name or cfg.trace.name,
            "offered_rate_rps": len(sent) / cfg.trace.duration_s if cfg.trace.duration_s > 0 else float(len(sent)),
            "max_send_lag_s": float(np.max(lag)) if lag else 0.0,
            "errors": error_counts(results),
        }
    )
    return row, results


def _local_tokenize(source: str, text: str) -> list[int]:
    from fluidpd.engine.tokenizer import Tokenizer

    if source == "smollm2":
        from fluidpd.engine.loaders import smollm2_gguf

        source = smollm2_gguf()
    return Tokenizer.load(source).encode(text, add_special_tokens=False)
