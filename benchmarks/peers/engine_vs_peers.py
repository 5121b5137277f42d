"""Our server against any OpenAI-compatible peer on the same machine and model: decode speed, TTFT, throughput, memory.

Over HTTP: single-stream decode tok/s (one streamed completion of a 128-token prompt, 64 tokens;
(tokens - 1) over the time from the first token to the last), TTFT of that prompt cold (a prompt no
server has seen: every request of every round starts differently, so neither prefix cache hits) and
warm (the same prompt again), output tok/s of 8 concurrent streams (128 in, 32 out each), and the
resident memory (VmRSS summed over the process tree) of each server this script started, after each
round and once more at the end, after 72 more unseen 128-token prompts (9,216 tokens: every block of an
8,192-token KV cache used: neither server's untouched KV pages are resident). Rounds interleave the servers;
medians of `--rounds`. Without `--url` it starts `fluidpd serve --workers 1`;
`--peer llama.cpp` starts llama.cpp's server (built by scripts/install_llama_cpp.sh) on the same GGUF
with `-t <cores> -np 8 -c 8192 --cont-batching` (and prints the flags it was built with); `--peer-url`
measures a peer already running. A peer that cannot start (no binary, killed by a signal such as SIGILL,
never ready) is one line saying why; fluidpd is measured alone and the exit status is 1.
Connections are never kept alive and a dropped request is retried once (dropped twice or refused:
reported). The fluidpd it starts admits every request (`--admit-ttft-factor 0`), as llama.cpp does.
Greedy, `ignore_eos` (servers that ignore it may stop early: their token counts are printed). Writes the
plot (`--plot`) and the medians and every round's figures as JSON (`--json`; `scripts/make_figures.py
--capture peers` keeps a run's in docs/results/ and draws the docs' figure from it).

    .venv/bin/python benchmarks/peers/engine_vs_peers.py [--url URL] [--peer llama.cpp | --peer-url URL] [--rounds 3]
        [--serve-args "--quantization gguf-q8"]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import shlex
import signal
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from functools import cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))  # engine_common
from engine_common import progress

from fluidpd.bench.peers.client import RoundShape, fill, measure
from fluidpd.bench.peers.llamacpp import REBUILD_HINT, describe_build, llama_server_binary, llama_server_cmd
from fluidpd.bench.peers.plot import plot_medians
from fluidpd.bench.peers.process import SERVE, ServerProcess, ServerStartError, free_port
from fluidpd.bench.peers.proctree import tree_rss_bytes
from fluidpd.engine.loaders import smollm2_gguf
from fluidpd.engine.tokenizer import Tokenizer

PROMPT_TOKENS = 128
SHAPE = RoundShape(single_out=64, concurrency=8, conc_out=32)
METRICS = ("single", "ttft", "ttft_warm", "conc", "rss")
FILL_PROMPTS = 72  # x PROMPT_TOKENS = 9,216 > the 8,192 tokens of KV both servers hold
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "serving", "engineers",
         "measure", "tokens", "per", "second"]  # fmt: skip
LOGS = Path(tempfile.gettempdir())


@cache
def tokenizer() -> Tokenizer:
    return Tokenizer.load(smollm2_gguf())


def prompt_text(name: str, tokens: int = PROMPT_TOKENS) -> str:
    """A text of `tokens` SmolLM2 tokens (our tokenizer; the peers serve the same model), random words
    seeded by `name`: different names differ from their first words on, so no prefix cache hits."""
    rng = random.Random(name)
    words = " ".join(rng.choice(WORDS) for _ in range(tokens * 2))
    return tokenizer().decode(tokenizer().encode(words, add_special_tokens=False)[:tokens])


def ours_server(extra: list[str]) -> ServerProcess:
    port = free_port()
    cmd = [
        *SERVE,
        "--workers",
        "1",
        "--port",
        str(port),
        "--admit-ttft-factor",  # admit all, as llama.cpp does: a busy host must slow it, not make it refuse
        "0",
        "--log-level",
        "warning",
        *extra,
    ]
    return ServerProcess("fluidpd serve", cmd, f"http://127.0.0.1:{port}", LOGS / "fluidpd-engine-vs-peers.log")


def llamacpp_server(threads: int) -> ServerProcess:
    port = free_port()
    cmd = llama_server_cmd(llama_server_binary(), smollm2_gguf(), port, threads)
    return ServerProcess("llama.cpp server", cmd, f"http://127.0.0.1:{port}", LOGS / "llamacpp-engine-vs-peers.log")


def rss_gb(procs: dict[str, ServerProcess], name: str) -> float:
    """VmRSS of the process tree of a server this script started (NaN for one it did not)."""
    return tree_rss_bytes(procs[name].pid) / 1e9 if name in procs else math.nan


def _median(xs: list[float]) -> float:
    ok = [x for x in xs if not math.isnan(x)]
    return statistics.median(ok) if ok else math.nan


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b and not (math.isnan(a) or math.isnan(b)) else "n/a"


def write_json(path: str, med: dict, results: dict[str, list[dict]], rounds: int, peer: str | None) -> None:
    """The medians and every round's figures (what the docs' figure is drawn from), with the peer's build."""
    per_round = {n: [{k: x[k] for k in METRICS} for x in rs] for n, rs in results.items()}
    lost = {n: sum(x["drops"].lost for x in rs) for n, rs in results.items()}
    out = {"rounds": rounds, "prompt_tokens": PROMPT_TOKENS, "concurrency": SHAPE.concurrency, "peer": peer,
           "peer_build": describe_build() if peer == "llama.cpp" else None, "medians": med,
           "per_round": per_round, "lost_requests": lost}  # fmt: skip
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    Path(path).write_text(json.dumps(out, indent=1) + "\n")
    print(f"results: {path}")


def _stop_on_sigterm(*_: object) -> None:
    raise SystemExit(143)  # unwinds the ExitStack, which stops the servers


def start_servers(stack: ExitStack, wanted: list[tuple[str, ServerProcess]]) -> dict[str, ServerProcess]:
    """Start each server inside `stack` (stopped when it closes); a peer that cannot start is one line on
    stdout and left out. Our own server not starting ends the benchmark (SystemExit 1), without a traceback."""
    started = {}
    for name, server in progress(wanted, "starting servers"):
        try:
            stack.enter_context(server)
        except (ServerStartError, OSError) as exc:
            why = exc.reason if isinstance(exc, ServerStartError) else f"{type(exc).__name__}: {exc}"
            log = f" (log {server.log_path})" if isinstance(exc, ServerStartError) else ""
            if name == "fluidpd":
                sys.exit(f"error: fluidpd serve could not start: {why}{log}")
            print(f"peer {name} could not start: {why} — {REBUILD_HINT}{log}", flush=True)
            continue
        started[name] = server
    return started


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="our server (default: start `fluidpd serve --workers 1`)")
    peer = ap.add_mutually_exclusive_group()
    peer.add_argument("--peer", choices=["llama.cpp"], help="start this peer on the same GGUF")
    peer.add_argument("--peer-url", help="any OpenAI-compatible server of the same model, already running")
    ap.add_argument("--peer-threads", type=int, default=len(os.sched_getaffinity(0)), help="default: the cores")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--serve-args", default="", help='more flags for our server, e.g. "--quantization gguf-q8"')
    ap.add_argument("--plot", default="results/engine_vs_peers.png")
    ap.add_argument("--json", default="results/engine_vs_peers.json", help="the medians and rounds (docs/results/)")
    args = ap.parse_args()
    if args.rounds < 1 or args.peer_threads < 1:
        ap.error("--rounds and --peer-threads must be at least 1")
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    peer_name = args.peer or "peer"
    run = f"{time.time_ns()}"  # prompts unseen even by a long-lived --url server that served an earlier run
    peer_failed = False
    with ExitStack() as stack:
        wanted: list[tuple[str, ServerProcess]] = []
        if args.peer == "llama.cpp":
            try:
                wanted.append((peer_name, llamacpp_server(args.peer_threads)))
                print(f"llama.cpp build: {describe_build()}")
            except FileNotFoundError as exc:
                print(f"peer {peer_name} could not start: {exc}", flush=True)
                peer_failed = True
        if not args.url:
            wanted.append(("fluidpd", ours_server(shlex.split(args.serve_args))))
        procs = start_servers(stack, wanted)
        peer_failed = peer_failed or bool(args.peer and peer_name not in procs)
        servers = {"fluidpd": args.url or procs["fluidpd"].url}
        if args.peer_url:
            servers[peer_name] = args.peer_url
        elif args.peer and not peer_failed:
            servers[peer_name] = procs[peer_name].url
        results: dict[str, list[dict]] = {name: [] for name in servers}
        for r in progress(range(args.rounds), "rounds"):
            for name, url in servers.items():  # interleaved: noise hits both alike
                res = asyncio.run(measure(url, prompt_text, f"{run}/{name}/{r}", SHAPE))
                res["rss"] = rss_gb(procs, name)
                results[name].append(res)
        full = dict.fromkeys(servers, math.nan)
        for name in progress([n for n in servers if n in procs], "cycling KV"):  # only where RSS is measured
            fill_drops = asyncio.run(fill(servers[name], prompt_text, f"{run}/{name}", FILL_PROMPTS))
            full[name] = rss_gb(procs, name)
            if fill_drops.lost:
                print(f"  {name}: {fill_drops.lost} of the KV-cycling requests lost: {fill_drops.errors[-1]}")
    med = {n: {k: _median([x[k] for x in rs]) for k in METRICS} | {"rss_full": full[n]} for n, rs in results.items()}
    print(f"{'server':10} {'single tok/s':>12} {'TTFT cold s':>12} {'TTFT warm s':>12} "
          f"{f'conc-{SHAPE.concurrency} tok/s':>13} {'RSS GB':>7} {'full KV':>7}  "
          "tokens/round  retried/lost requests")  # fmt: skip
    for n, m in med.items():
        retried = sum(x["drops"].retried for x in results[n])
        lost = sum(x["drops"].lost for x in results[n])
        print(f"{n:10} {m['single']:12.1f} {m['ttft']:12.3f} {m['ttft_warm']:12.3f} {m['conc']:13.1f} "
              f"{m['rss']:7.3f} {m['rss_full']:7.3f}  {results[n][-1]['tokens']!s:12}  {retried}/{lost}")  # fmt: skip
        for err in sorted({e for x in results[n] for e in x["drops"].errors}):
            print(f"  {n} dropped or refused: {err}")
    title = "engine_vs_peers (medians over rounds; lower is better for TTFT and RSS)"
    print(f"plot: {plot_medians(med, args.plot, SHAPE.concurrency, title)}")
    write_json(args.json, med, results, args.rounds, args.peer if peer_name in med else None)
    ours, other = med["fluidpd"], med.get(peer_name)
    if other is None:
        print(f"engine_vs_peers: fluidpd alone: single-stream {ours['single']:.1f} tok/s, TTFT cold "
              f"{ours['ttft']:.3f} s, concurrency-{SHAPE.concurrency} {ours['conc']:.1f} tok/s")  # fmt: skip
        if peer_failed:
            print(f"engine_vs_peers: peer {peer_name} could not start (see above): no side-by-side figures")
        return 1 if peer_failed else 0
    print(
        f"engine_vs_peers: fluidpd / {peer_name} (medians of {args.rounds} rounds): single-stream "
        f"{_ratio(ours['single'], other['single'])}, TTFT cold {_ratio(ours['ttft'], other['ttft'])}, "
        f"TTFT warm {_ratio(ours['ttft_warm'], other['ttft_warm'])}, concurrency-{SHAPE.concurrency} "
        f"{_ratio(ours['conc'], other['conc'])}, RSS {_ratio(ours['rss'], other['rss'])} "
        f"({ours['rss']:.3f} vs {other['rss']:.3f} GB; KV cycled {ours['rss_full']:.3f} vs {other['rss_full']:.3f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
