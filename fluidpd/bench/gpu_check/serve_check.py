"""serve: `fluidpd serve --device D` as a subprocess, in-process workers sharing the device (and one copy of
the weights), one streamed completion through a forced role switch that migrates its live decode.

Three workers (1 prefill, 2 decode): the fewest in which an admin switch is allowed at all. With two, each
is the last of its role and `POST /v1/admin/workers/{id}/role` answers 409. After the first tokens, the
decode worker running the request is switched to prefill: its drain migrates the request's KV to the other
decode worker mid-stream. The streamed token ids must be exactly the same request's answered again after
the switch (greedy, not streamed): none lost, none repeated. The output is long enough for the migration
(a request that would finish within FluidRole's `drain_finish_s` on its worker finishes in place)."""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from fluidpd.bench.gpu_check.context import CheckContext
from fluidpd.bench.gpu_check.synthetic import write_checkpoint
from fluidpd.bench.peers.process import free_port

WORKERS = 3
PROMPT = "A fox jumps"  # under one KV block (16 tokens): the reference is no prefix-cache hit, computed as the stream
SWITCH_AFTER = 4  # tokens streamed before the switch
DECODE_AFTER_SWITCH_S = 1.5  # the output is sized so the request decodes this long after the switch
LOG = "serve_check.log"


def check(ctx: CheckContext) -> dict:
    shape = "tiny" if ctx.tiny else "llama-3.1-8b"
    model = write_checkpoint(ctx.work / shape, shape, device=ctx.device)
    ctx.release_device()  # the server's process needs the weights, three workers' KV, the profile's activations
    port, log = free_port(), ctx.work / LOG
    t0 = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(
            serve_command(ctx, model, port), stdout=out, stderr=subprocess.STDOUT, env=_env(), cwd=ctx.work
        )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(base, proc, ctx, log)
        startup_s = time.monotonic() - t0
        with httpx.Client(base_url=base, timeout=max(30.0, min(120.0, ctx.left_s()))) as client:
            result = _exercise(client, ctx)
        return {"startup_s": round(startup_s, 1), **result, "server_says": _said(log)}
    except Exception as exc:  # the server's log says why, and ctx.work does not come back
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "log_tail": _tail(log)}
    finally:
        _stop(proc)


def serve_command(ctx: CheckContext, model: Path, port: int) -> list[str]:
    """`fluidpd serve` on the written model (its tokenizer with it), bfloat16 on a GPU, the policy's own
    switches off (only the admin's), its drain never rolled back, every request admitted."""
    return [
        *(sys.executable, "-m", "fluidpd.cli", "serve", "--model", str(model), "--device", ctx.device),
        *("--dtype", "bfloat16" if ctx.on_gpu else "auto", "--max-model-len", "2048"),
        *("--backend", "inprocess", "--workers", str(WORKERS), "--policy", "fluidpd", "--prefill-workers", "1"),
        *("--tau-persist-s", "1e9", "--drain-timeout-s", "0", "--admit-ttft-factor", "0"),
        *("--port", str(port), "--log-level", "warning", "--shutdown-timeout-s", "2"),
    ]


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")  # PYTHONPATH (the wheel bundle) and CUDA_VISIBLE_DEVICES pass on
    here = str(Path(__file__).resolve().parents[3])  # this checkout: the subprocess imports the same fluidpd
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), here) if p)
    return env


def _wait_ready(base: str, proc: subprocess.Popen, ctx: CheckContext, log: Path) -> None:
    """Until /health answers 200 (the model loaded, the workers started and profiled)."""
    deadline = time.monotonic() + max(10.0, ctx.left_s() - 30.0)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"fluidpd serve exited with {proc.returncode} before it answered")
        try:
            if httpx.get(f"{base}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise TimeoutError(f"fluidpd serve did not answer /health within the budget (log {log})")


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM (a drain of 2 s), then SIGKILL if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _tail(log: Path, chars: int = 4000) -> str:
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def _said(log: Path) -> list[str]:
    """The server's startup lines (load, profile, workers)."""
    return [line for line in _tail(log, 20000).splitlines() if line.startswith("fluidpd")][-8:]


class _Stream(threading.Thread):
    """One streamed completion read on its own thread: token ids and when each chunk of them came."""

    def __init__(self, client: httpx.Client, body: dict) -> None:
        super().__init__(name="serve-check-stream", daemon=True)
        self.client, self.body = client, body
        self.ids: list[int] = []
        self.times: list[float] = []  # per chunk of tokens, since the request was sent
        self.text, self.rid, self.finish = "", "", None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            t0 = time.perf_counter()
            with self.client.stream("POST", "/v1/completions", json=self.body) as r:
                if r.status_code != 200:
                    raise RuntimeError(f"HTTP {r.status_code}: {r.read().decode(errors='replace')[:500]}")
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        self._chunk(json.loads(line[6:]), time.perf_counter() - t0)
        except BaseException as exc:  # noqa: BLE001 - reported by the check
            self.error = exc

    def _chunk(self, chunk: dict, t: float) -> None:
        self.rid = chunk.get("id", self.rid)
        for ch in chunk.get("choices", []):
            ids = ch.get("token_ids") or []
            if ids:
                self.ids += ids
                self.times.append(t)
            self.text += ch.get("text") or ""
            self.finish = ch.get("finish_reason") or self.finish


def _exercise(client: httpx.Client, ctx: CheckContext) -> dict:
    """The stream, the switch under it, the reference; what each showed."""
    state = _get(client, "/v1/admin/cluster")
    model, step_s = state["model"], state["profile"]["decode_step_s"]
    max_tokens = min(1024, max(64, SWITCH_AFTER + math.ceil(DECODE_AFTER_SWITCH_S / max(step_s, 1e-4))))
    body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0}
    body |= {"ignore_eos": True, "return_token_ids": True}
    stream = _Stream(client, body | {"stream": True})
    stream.start()
    switch = _switch_under(client, stream, ctx)
    stream.join(timeout=max(1.0, ctx.left_s() - 10.0))
    if stream.is_alive() or stream.error is not None:
        raise RuntimeError(f"the stream did not end: {stream.error!r}")
    ref = client.post("/v1/completions", json=body)
    ref.raise_for_status()
    choice = ref.json()["choices"][0]
    trace = _get(client, f"/v1/admin/traces/{stream.rid}")
    switch |= _moves(trace, switch.get("worker"))
    prompt_tokens = ref.json()["usage"]["prompt_tokens"]
    return _verdict(stream, choice, switch, max_tokens) | {"prompt_tokens": prompt_tokens, "decode_step_s": step_s}


def _get(client: httpx.Client, path: str) -> dict:
    r = client.get(path)
    r.raise_for_status()
    return r.json()


def _switch_under(client: httpx.Client, stream: _Stream, ctx: CheckContext) -> dict:
    """Once SWITCH_AFTER tokens streamed: switch the decode worker running the request to prefill, then
    wait until the transition is done. What the cluster reported."""
    deadline = time.monotonic() + max(5.0, ctx.left_s() - 20.0)
    while len(stream.ids) < SWITCH_AFTER and stream.is_alive() and time.monotonic() < deadline:
        time.sleep(0.002)
    if not stream.is_alive():
        return {"error": f"the stream ended ({len(stream.ids)} tokens, {stream.error!r}) before the switch"}
    while time.monotonic() < deadline:
        state = _get(client, "/v1/admin/cluster")
        busy = [w["id"] for w in state["workers"] if w["role"] == "decode" and w["decoding"]]
        if busy:
            break
        time.sleep(0.01)
    else:
        return {"error": "no decode worker was decoding the request"}
    before, wid, at = state["kv_moves"], busy[0], len(stream.ids)
    r = client.post(f"/v1/admin/workers/{wid}/role", json={"role": "prefill"})
    if r.status_code != 200:
        return {"worker": wid, "error": f"switch refused: HTTP {r.status_code} {r.text[:300]}"}
    while time.monotonic() < deadline:
        state = _get(client, "/v1/admin/cluster")
        t = state["transitions"][-1] if state["transitions"] else None
        if t is not None and t["worker"] == wid and t["to"] == "prefill" and t["done"]:
            moved = {k: state["kv_moves"][k] - before[k] for k in ("tokens", "bytes")}
            roles = [w["role"] for w in state["workers"]]
            return {"worker": wid, "at_token": at, "transition": t, "kv_moved": moved, "roles": roles}
        time.sleep(0.02)
    return {"worker": wid, "at_token": at, "error": "the transition did not finish in time"}


def _moves(trace: dict, wid: int | None) -> dict:
    """The request's migration and where it decoded, as its trace tells."""
    events = trace.get("events", [])
    migrations = [e for e in events if e["kind"] == "kv_transfer" and e.get("class") == "migration"]
    return {
        "migration": migrations[0] if migrations else None,
        "decoded_on": [e["worker"] for e in events if e["kind"] == "decode"],
        "saw_switch": any(e["kind"] == "role_switch" and e.get("worker") == wid for e in events),
    }


def _verdict(stream: _Stream, choice: dict, switch: dict, max_tokens: int) -> dict:
    """The record: ok when the switch completed and migrated the request, and the stream ended at its
    length with exactly the reference's tokens."""
    ref_ids = choice.get("token_ids") or []
    problems = [switch["error"]] if "error" in switch else []
    if not switch.get("migration") or switch.get("kv_moved", {}).get("tokens", 0) <= 0:
        problems.append("the request's KV was not migrated (it finished on the switching worker)")
    if stream.finish != "length" or len(stream.ids) != max_tokens:
        problems.append(f"stream: {len(stream.ids)} of {max_tokens} tokens, finish_reason {stream.finish!r}")
    equal = stream.ids == ref_ids and stream.text == choice.get("text")
    if not equal:
        same = [a == b for a, b in zip(stream.ids, ref_ids)]
        first = same.index(False) if False in same else len(same)
        problems.append(f"streamed tokens differ from the reference's from token {first}: {len(ref_ids)} there")
    gaps = [b - a for a, b in zip(stream.times, stream.times[1:])]
    return {
        "ok": not problems,
        "problems": problems,
        "tokens": len(stream.ids),
        "switch": switch,
        "equal": equal,
        "ttft_s": round(stream.times[0], 4) if stream.times else None,
        "tbt_p50_s": round(statistics.median(gaps), 5) if gaps else None,
        "tbt_max_s": round(max(gaps), 4) if gaps else None,  # the migration's stall, if any
    }
