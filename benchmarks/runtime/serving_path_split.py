"""Where a served token's time goes between the engine step and the SSE bytes, and resident memory.

`fluidpd serve --workers 1` (process backend, default threads) in this process (uvicorn on a
thread, as BackgroundServer runs it), a client in its own process streaming /v1/completions
(`return_token_ids`, so every token is one SSE chunk), for one stream (128-token prompt, 64 out)
and 8 streams (32 out each). Every stage is time-stamped on one clock (CLOCK_MONOTONIC: the
worker's, the server's and the client's `perf_counter` agree), medians over tokens:

  critical path (between two engine steps; it sets tokens/s):
    engine step        the worker's run_step (StepResult.step_s)
    IPC out            run_step submitted here -> running in the worker (pickle, sender thread, pipe, worker queue)
    IPC back           step done in the worker -> its reply decoded here (pickle, pipe, reader thread)
    loop wake          reply decoded -> its handler running on the event loop (call_soon_threadsafe)
    World + policy     the step's handler: tokens to streams, World bookkeeping, the policy, the next plan
  delivery (after the step, beside the next one):
    stream wake        token event queued -> the SSE generator has it
    detokenise         ChoiceOutput.add
    JSON/SSE encode    the chunk's `data:` line
    HTTP               the line yielded -> the client has it

The engine reference is an engine in this process (same threads) decoding the same prompts by
`run_step`, in the same run. Resident memory: a real `fluidpd serve --workers 1` process and its
worker (VmRSS after one request). Headline: served ms/token vs engine ms/token (one stream).

    .venv/bin/python benchmarks/runtime/serving_path_split.py [--rounds 3] [--plot results/serving_path_split.png]
"""

from __future__ import annotations

import argparse
import functools
import http.client
import itertools
import json
import multiprocessing as mp
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from statistics import median

import torch

from fluidpd.bench.peers.process import SERVE
from fluidpd.core.memory import rss_bytes
from fluidpd.engine.config import EngineConfig
from fluidpd.engine.engine import LLMEngine, load_model
from fluidpd.engine.plan import PrefillChunk, StepPlan
from fluidpd.engine.sampling import SamplingParams

CONFIG = EngineConfig()  # what `fluidpd serve` runs by default
LOADS = {"1 stream": (1, 64), "8 streams": (8, 32)}
PROMPT = 128
CRITICAL = ("engine step", "IPC out", "IPC back", "loop wake", "World + policy")
DELIVERY = ("stream wake", "detokenise", "JSON/SSE encode", "HTTP")


def prompt(seed: int) -> list[int]:
    return [1000 + (seed * 7919 + i * 104729) % 40000 for i in range(PROMPT)]


# --------------------------------------------------------------------------- worker side (spawned)
def traced_run_worker(conn, worker_id, config, options) -> None:
    """The process backend's worker entry point, with each run_step stamped (start, end)."""
    from fluidpd.runtime import worker_main

    orig = worker_main.EngineService.run_step

    def run_step(self, plan):
        t0 = time.perf_counter()
        res = orig(self, plan)
        res.trace = (getattr(plan, "t_submit", None), t0, time.perf_counter())
        return res

    worker_main.EngineService.run_step = run_step
    worker_main.run_worker(conn, worker_id, config, options)


# --------------------------------------------------------------------------- server side
class Tracer:
    """Stamps on the serving path of this process (patched in; nothing of it ships)."""

    def __init__(self) -> None:
        self.steps: list[dict] = []  # one per decode step: its stamps
        self.events: dict[int, dict] = {}  # id(TokenEvent) -> stamps, until the SSE generator takes it
        self.chunks: dict[str, list[dict]] = {}  # request id -> its chunks' stamps, in order
        self.current: dict | None = None  # the step whose handler runs now

    def install(self) -> None:
        from fluidpd.runtime import cluster, pipe_calls, process, streams
        from fluidpd.server import generation, output

        tr = self
        process.worker_entry = traced_run_worker
        orig_decode = pipe_calls.decode  # the replies' read loop

        def decode(data):
            msg = orig_decode(data)
            value = getattr(msg, "value", None)
            if hasattr(value, "trace"):
                value.t_recv = time.perf_counter()
            return msg

        pipe_calls.decode = decode
        orig_submit = process.ProcessWorker.submit

        def submit(self, method, *args, **kwargs):
            if method == "run_step":
                args[0].t_submit = time.perf_counter()
            return orig_submit(self, method, *args, **kwargs)

        process.ProcessWorker.submit = submit
        orig_stepped = cluster.RuntimeCluster._stepped

        def stepped(self, w, plan, fut, shape, busy):
            t = time.perf_counter()
            res = fut.result() if fut.exception() is None else None
            rec = None
            if res is not None and hasattr(res, "trace") and not plan.chunks:
                sub, start, end = res.trace
                rec = {"submit": sub, "start": start, "end": end, "step_s": res.step_s}
                rec.update(recv=res.t_recv, loop=t, batch=len(res.outputs))
            tr.current = rec
            orig_stepped(self, w, plan, fut, shape, busy)
            tr.current = None
            if rec is not None:
                rec["done"] = time.perf_counter()
                tr.steps.append(rec)

        cluster.RuntimeCluster._stepped = stepped
        orig_put = streams.Stream.put

        def put(self, event):
            if tr.current is not None and event.token_ids:
                tr.events[id(event)] = {"step": tr.current, "put": time.perf_counter()}
            orig_put(self, event)

        streams.Stream.put = put
        orig_add = output.ChoiceOutput.add

        def add(self, event):
            t = time.perf_counter()
            delta = orig_add(self, event)
            rec = tr.events.pop(id(event), None)
            if rec is not None:
                rec.update(got=t, detok=time.perf_counter())
            self.trace = rec
            return delta

        output.ChoiceOutput.add = add
        orig_chunk = generation._Reply.chunk

        def chunk(self, *args, **kwargs):
            line = orig_chunk(self, *args, **kwargs)
            rec = getattr(self.out, "trace", None)
            self.out.trace = None
            tr.chunks.setdefault(self.rid, []).append(dict(rec or {}, encoded=time.perf_counter()))
            return line

        generation._Reply.chunk = chunk

    def reset(self) -> None:
        self.steps.clear()
        self.events.clear()
        self.chunks.clear()


def client(url: str, streams: int, max_tokens: int, seed: int, conn) -> None:  # in a spawned process
    """Stream `streams` completions at once; each chunk's arrival time and request id."""
    host, port = url.split("//")[1].split(":")

    def one(i: int, out: list) -> None:
        c = http.client.HTTPConnection(host, int(port))
        body = {
            "prompt": prompt(seed + i),
            "max_tokens": max_tokens,
            "stream": True,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = c.getresponse()
        while line := resp.readline():
            t = time.perf_counter()
            if line.startswith(b"data: {"):
                obj = json.loads(line[6:])
                out.append((obj["id"], len(obj["choices"][0].get("token_ids") or []), t))
        c.close()

    results: list[list] = [[] for _ in range(streams)]
    threads = [threading.Thread(target=one, args=(i, results[i])) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    conn.send(results)


def served_split(url: str, tracer: Tracer, streams: int, max_tokens: int, seed: int) -> dict[str, float]:
    """One load through the server: each stage's median ms (per step; delivery per token) and ms/token."""
    tracer.reset()
    parent, child = mp.get_context("spawn").Pipe()
    p = mp.get_context("spawn").Process(target=client, args=(url, streams, max_tokens, seed, child))
    p.start()
    results = parent.recv()
    p.join()
    arrivals = {}
    for res in results:
        rows = [r for r in res if r[1] > 0]
        arrivals[rows[0][0]] = [t for _, _, t in rows]
    per_token = [b - a for ts in arrivals.values() for a, b in itertools.pairwise(ts[1:])]  # decode tokens
    steps = tracer.steps[2:]  # the first decode steps warm up
    nxt = {id(a): b for a, b in itertools.pairwise(tracer.steps)}
    crit: dict[str, list[float]] = {k: [] for k in CRITICAL}
    for s in steps:
        crit["engine step"].append(s["step_s"])
        crit["IPC out"].append(s["start"] - s["submit"])
        crit["IPC back"].append(s["recv"] - s["end"])
        crit["loop wake"].append(s["loop"] - s["recv"])
        crit["World + policy"].append(s["done"] - s["loop"])
    gaps = [b["start"] - a["end"] for a in steps if (b := nxt.get(id(a))) is not None]
    deliv: dict[str, list[float]] = {k: [] for k in DELIVERY}
    for rid, chunks in tracer.chunks.items():
        for ch, t_client in zip(chunks, arrivals.get(rid, [])):
            if "got" not in ch:
                continue
            deliv["stream wake"].append(ch["got"] - ch["put"])
            deliv["detokenise"].append(ch["detok"] - ch["got"])
            deliv["JSON/SSE encode"].append(ch["encoded"] - ch["detok"])
            deliv["HTTP"].append(t_client - ch["encoded"])
    out = {k: median(v) * 1e3 for k, v in {**crit, **deliv}.items() if v}
    out["worker idle between steps"] = median(gaps) * 1e3
    out["served ms/token"] = median(per_token) * 1e3
    return out


def engine_ms(engine: LLMEngine, streams: int, max_tokens: int, seed: int) -> float:
    """Median decode step of a bare engine on the same prompts (per-stream ms/token)."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    rids = [engine.add_request(prompt(seed + i), params) for i in range(streams)]
    engine.run_step(StepPlan(prefills=[PrefillChunk(r, PROMPT) for r in rids]))
    times = []
    for _ in range(max_tokens - 1):
        t0 = time.perf_counter()
        engine.run_step(StepPlan(decodes=list(rids)))
        times.append(time.perf_counter() - t0)
    for r in rids:
        engine.abort(r)
    return median(times[2:]) * 1e3


def serve_memory() -> dict[str, float]:
    """VmRSS (GB) of a real `fluidpd serve --workers 1` and its worker, after one request."""
    port = 18000 + os.getpid() % 1000
    cmd = [*SERVE, "--workers", "1", "--port", str(port), "--threads", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log: list[str] = []
    reader = threading.Thread(target=lambda: log.extend(ln.rstrip() for ln in proc.stderr), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError("fluidpd serve did not start:\n" + "\n".join(log))
            try:
                c = http.client.HTTPConnection("127.0.0.1", port)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                time.sleep(0.5)
        c = http.client.HTTPConnection("127.0.0.1", port)
        c.request("POST", "/v1/completions", json.dumps({"prompt": "Hello", "max_tokens": 16}), {})
        c.getresponse().read()
        kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        worker = sum(rss_bytes(k) for k in kids)
        weights = next((ln for ln in log if "weights" in ln), "")
        return {"server": rss_bytes(proc.pid) / 1e9, "worker": worker / 1e9, "log": weights}  # type: ignore[dict-item]
    finally:
        proc.terminate()
        proc.wait(30)


def plot(rows: dict[str, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    steps = ", ".join(f"{k} {r['engine step']:.0f} ms" for k, r in rows.items())
    panels = (
        (axes[0], CRITICAL[1:], f"between two steps\n(engine step: {steps})"),
        (axes[1], DELIVERY, "step -> client"),
    )
    for ax, stages, title in panels:
        x = range(len(rows))
        bottom = [0.0] * len(rows)
        for st in stages:
            vals = [r.get(st, 0.0) for r in rows.values()]
            ax.bar(x, vals, bottom=bottom, label=st)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_xticks(list(x), list(rows))
        ax.set_ylabel("ms (median)")
        ax.set_title(title)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle("fluidpd serve --workers 1: the serving path per token")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    from fluidpd.runtime.build import build_coordinator
    from fluidpd.runtime.config import RuntimeConfig
    from fluidpd.server.app import build_app
    from fluidpd.server.background import BackgroundServer

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--plot", type=Path, default=Path("results/serving_path_split.png"))
    ap.add_argument("--threads", type=int, default=0, help="torch threads of the worker (0: the default)")
    ap.add_argument("--no-memory", action="store_true", help="skip the resident-memory measurement")
    args = ap.parse_args()
    mem = None if args.no_memory else serve_memory()
    runtime = RuntimeConfig(workers=1, admit_ttft_factor=0.0, threads=args.threads, profile_cache=False)
    threads = runtime.worker_threads
    tracer = Tracer()
    tracer.install()
    coord = build_coordinator(CONFIG, runtime, log=lambda m: None)
    torch.set_num_threads(threads)
    model, tok = load_model(CONFIG)
    engine = LLMEngine(CONFIG, model=model, tokenizer=tok)
    res: dict[str, list[dict[str, float]]] = {k: [] for k in LOADS}
    eng: dict[str, list[float]] = {k: [] for k in LOADS}
    with BackgroundServer(build_app(coord)) as srv:
        for r in range(args.rounds):
            for load, (n, out) in LOADS.items():
                eng[load].append(engine_ms(engine, n, out, 100 * r))
                res[load].append(served_split(srv.url, tracer, n, out, 100 * r))
                print(f"round {r} {load}: engine {eng[load][-1]:.2f} ms/step, {res[load][-1]}", file=sys.stderr)
    rows = {}
    for load in LOADS:
        keys = functools.reduce(lambda a, b: a & b.keys(), res[load], set(res[load][0]))
        row = {k: median(x[k] for x in res[load]) for k in res[load][0] if k in keys}
        row["engine ms/token (bare)"] = median(eng[load])
        rows[load] = row
        print(f"{load} ({threads} torch threads per worker; medians of {args.rounds} rounds):")
        for k, v in row.items():
            print(f"  {k:28s} {v:7.2f} ms")
    if mem is not None:
        print(f"resident memory: server {mem['server']:.2f} GB + worker {mem['worker']:.2f} GB")
        print(f"  ({mem['log']})")
    plot(rows, args.plot)
    one = rows["1 stream"]
    print(f"wrote {args.plot}", file=sys.stderr)
    print(
        f"headline: served {one['served ms/token']:.1f} ms/token vs engine {one['engine ms/token (bare)']:.1f} "
        f"ms/token one stream ({one['served ms/token'] / one['engine ms/token (bare)']:.2f}x); 8 streams "
        f"{rows['8 streams']['served ms/token'] / rows['8 streams']['engine ms/token (bare)']:.2f}x"
        + ("" if mem is None else f"; resident server + worker {mem['server'] + mem['worker']:.2f} GB")
    )


if __name__ == "__main__":
    main()
