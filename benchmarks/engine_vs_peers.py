"""Our server against any OpenAI-compatible peer on the same machine and model: decode speed, TTFT, throughput.

Over HTTP only, so it installs nothing and measures whatever serves the API (llama.cpp's server,
vLLM's CPU build, another fluidpd): single-stream decode tok/s (one streamed completion of a
128-token prompt, 64 tokens; (tokens - 1) over the time from the first token to the last), TTFT of
that prompt, and output tok/s of 8 concurrent streams (128 in, 32 out each). Rounds interleave the
servers; medians of `--rounds`. Without `--url` it starts `fluidpd serve --workers 1` itself.
Greedy, `ignore_eos` (servers that ignore it may stop early: their token counts are printed).

    .venv/bin/python benchmarks/engine_vs_peers.py [--url URL] [--peer-url URL] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from engine_common import progress

from fluidpd.engine.loaders import smollm2_gguf
from fluidpd.engine.tokenizer import Tokenizer

PROMPT_TOKENS, SINGLE_OUT, CONC, CONC_OUT = 128, 64, 8, 32
TOKENIZER = Tokenizer.load(smollm2_gguf())
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "serving",
    "engineers",
    "measure",
    "tokens",
    "per",
    "second",
]


def prompt_text(seed: int, tokens: int = PROMPT_TOKENS) -> str:
    """A text of `tokens` SmolLM2 tokens (our tokenizer; the peers serve the same model)."""
    words = [WORDS[(seed * 7 + i * 3) % len(WORDS)] for i in range(tokens * 2)]
    return TOKENIZER.decode(TOKENIZER.encode(" ".join(words), add_special_tokens=False)[:tokens])


async def stream(client: httpx.AsyncClient, model: str, text: str, max_tokens: int) -> dict:
    body = {"model": model, "prompt": text, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    body |= {"ignore_eos": True, "stream_options": {"include_usage": True}}
    t0, times, usage = time.perf_counter(), [], None
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line.strip() == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
            if any(c.get("text") for c in event.get("choices") or ()):
                times.append(time.perf_counter())
    n = (usage or {}).get("completion_tokens") or len(times)
    return {"ttft": times[0] - t0, "decode": (n - 1) / (times[-1] - times[0]) if n > 1 else 0.0, "tokens": n,
            "end": times[-1]}  # fmt: skip


async def measure(url: str, seed: int) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        await stream(client, model, prompt_text(seed + 99), 4)  # warm: first-request costs are not measured
        one = await stream(client, model, prompt_text(seed), SINGLE_OUT)
        t0 = time.perf_counter()
        many = await asyncio.gather(*(stream(client, model, prompt_text(seed + i + 1), CONC_OUT) for i in range(CONC)))
        wall = max(r["end"] for r in many) - t0
    return {"single": one["decode"], "ttft": one["ttft"], "conc": sum(r["tokens"] for r in many) / wall,
            "tokens": (one["tokens"], sum(r["tokens"] for r in many))}  # fmt: skip


def start_ours() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(os.path.join(tempfile.gettempdir(), "fluidpd-engine-vs-peers.log"), "w")  # noqa: SIM115
    cmd = [
        sys.executable,
        "-m",
        "fluidpd.cli",
        "serve",
        "--workers",
        "1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(1200):
        if proc.poll() is not None:
            raise RuntimeError(f"fluidpd serve exited ({proc.returncode}); see {log.name}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    proc.kill()
    raise TimeoutError("fluidpd serve did not become healthy")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="our server (default: start `fluidpd serve --workers 1`)")
    ap.add_argument("--peer-url", help="any OpenAI-compatible server of the same model")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    proc, url = (None, args.url) if args.url else start_ours()
    servers = {"ours": url} | ({"peer": args.peer_url} if args.peer_url else {})
    results: dict[str, list[dict]] = {name: [] for name in servers}
    try:
        for r in progress(range(args.rounds), "rounds"):
            for name, u in servers.items():  # interleaved: noise hits both alike
                results[name].append(asyncio.run(measure(u, seed=r * 17)))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    med = {n: {k: statistics.median(x[k] for x in rs) for k in ("single", "ttft", "conc")} for n, rs in results.items()}
    print(f"{'server':6} {'single-stream tok/s':>20} {'TTFT 128 tok (s)':>17} {'conc-8 out tok/s':>17}  tokens/round")
    for n, m in med.items():
        print(f"{n:6} {m['single']:20.1f} {m['ttft']:17.3f} {m['conc']:17.1f}  {results[n][-1]['tokens']}")
    peer = med.get("peer")
    p_single, p_conc = (f"{peer['single']:.1f}", f"{peer['conc']:.1f}") if peer else ("n/a", "n/a")
    print(
        f"engine_vs_peers: single-stream ours {med['ours']['single']:.1f} tok/s peer {p_single} tok/s; "
        f"concurrency-8 ours {med['ours']['conc']:.1f} tok/s peer {p_conc} tok/s"
    )


if __name__ == "__main__":
    main()
