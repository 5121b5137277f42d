"""`make figures`: the docs' figures, regenerated from the simulated experiments and from the committed
real-engine results, and copied into docs/images/ under stable names.

Simulated figures (deterministic: every simulation is seeded) come from runs into a scratch directory
(`--scratch`, default a temporary one), two at a time, with a progress bar; each run's output goes to
its log there:

    table1       fluidpd experiment table1 --quick              headline bars, envelope, attainment vs rate, timelines
    kv           fluidpd experiment kv --quick                  envelope, hit rate against the oracle per workload
    host_tier    benchmarks/simulation/sim_host_tier.py         hit rate against the host tier's size
    claude_code  benchmarks/simulation/sim_kv_claude_code.py's goodput grid (48..128 sessions, two 900 s
                 windows pooled, every system), drawn here: joint attainment against concurrent sessions

`fluidpd experiment scale` takes 11 minutes in the form the docs quote (1,024 GPUs); its figure
(docs/images/scale.png) is regenerated only with `--scale`.

Real-engine figures are drawn from JSON results committed under docs/results/ (each with its date,
this host's speeds and CPU model), without rerunning the benchmark; `--capture NAME` reruns one and
rewrites its JSON (minutes, the real engine on this machine):

    fluidtoken   benchmarks/runtime/runtime_fluidtoken.py (static-pd vs fluidtoken under a prefill burst)
    top          one `fluidpd top` frame of a real 3-worker fluidpd server under load (two /v1/admin/cluster
                 answers a second apart; the frame is rendered from them by fluidpd.cli.top_view)
    kv_tier      benchmarks/runtime/kv_tier.py --quick (turn-2+ TTFT with the node-shared KV store and without)
    table1       benchmarks/runtime/runtime_table1.py (chunked, static-pd, fluidpd through the real server;
                 18 min on a quiet 2-core host: run it alone)
    peers        benchmarks/peers/engine_vs_peers.py --peer llama.cpp (needs scripts/install_llama_cpp.sh's build)

Every PNG copied is at most 150 KB (over that it is quantised to a 256-colour palette with Pillow).

    .venv/bin/python scripts/make_figures.py [--list] [--only PART...] [--scratch DIR] [--scale]
    .venv/bin/python scripts/make_figures.py --capture fluidtoken|top|kv_tier|table1|peers
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"
RESULTS = ROOT / "docs" / "results"
MAX_BYTES = 150_000
PY = sys.executable
FLUIDPD = [PY, "-m", "fluidpd.cli"]

# Claude Code sessions: sim_kv_claude_code.py --goodput's grid and windows
CC_GRID = (48.0, 64.0, 80.0, 96.0, 112.0, 128.0)
CC_WINDOWS = (3600.0, 4500.0)

# part -> command (run from the repository root; {out} is the part's scratch directory)
PARTS: dict[str, list[str]] = {
    "table1": [*FLUIDPD, "experiment", "table1", "--quick", "--out", "{out}"],
    "kv": [*FLUIDPD, "experiment", "kv", "--quick", "--out", "{out}"],
    "host_tier": [PY, "benchmarks/simulation/sim_host_tier.py", "--out", "{out}"],
    **{
        f"claude_code_{w:g}": [PY, __file__, "--claude-code-window", f"{w:g}", "--claude-code-out", "{out}"]
        for w in CC_WINDOWS
    },
    "scale": [*FLUIDPD, "experiment", "scale", "--window", "60", "--out", "{out}"],
}
OPTIONAL = {"scale"}  # run only with --scale

# docs/images/NAME <- (part, file in its scratch directory)
COPIES: dict[str, tuple[str, str]] = {
    "table1_headline.png": ("table1", "headline.png"),
    "table1_envelope.png": ("table1", "envelope.png"),
    "table1_attainment_azure_code.png": ("table1", "attainment_vs_rate_azure_code.png"),
    "table1_attainment_azure_conv.png": ("table1", "attainment_vs_rate_azure_conv.png"),
    "table1_attainment_phase_shift.png": ("table1", "attainment_vs_rate_phase_shift.png"),
    "fluidpd_phase_shift_timeline.png": ("table1", "fluidpd_phase_shift_timeline.png"),
    "kv_envelope.png": ("kv", "envelope.png"),
    "kv_hit_rate_claude_code.png": ("kv", "hit_rate_claude_code.png"),
    "kv_hit_rate_mooncake_conv.png": ("kv", "hit_rate_mooncake_conv.png"),
    "kv_hit_rate_hot_prefix.png": ("kv", "hit_rate_hot_prefix.png"),
    "host_tier.png": ("host_tier", "sim_host_tier.png"),
    "scale.png": ("scale", "scale.png"),
}

# docs/images/NAME <- a drawing function over docs/results/FILE (no benchmark rerun)
DRAWN_FROM_RESULTS = {
    "claude_code_sessions.png": "claude_code",  # drawn from the claude_code parts' JSON (scratch)
    "runtime_fluidtoken_burst.png": "runtime_fluidtoken.json",
    "top_frame.png": "top_frame.json",
    "kv_tier_turn2_cdf.png": "kv_tier.json",
    "runtime_table1.png": "runtime_table1.json",
    "engine_vs_llamacpp.png": "engine_vs_peers.json",
}


# ---------------------------------------------------------------------------- the simulated parts


def claude_code_window(window: float, out: Path) -> None:
    """sim_kv_claude_code.py's goodput grid on one window: every system at every concurrency (JSON)."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "simulation"))
    from sim_kv_claude_code import SYSTEMS, run
    from tqdm import tqdm

    rows = []
    for c in tqdm(CC_GRID, desc=f"claude code window {window:g}", file=sys.stderr):
        for system in SYSTEMS:
            r = run(c, system, window)
            keep = ("requests", "attainment", "strict_attainment", "role_switches", "prefix_cache_hit_rate")
            rows.append({"concurrency": c, "system": system, "window_s": window, **{k: r[k] for k in keep}})
    out.mkdir(parents=True, exist_ok=True)
    (out / "claude_code.json").write_text(json.dumps({"window_s": window, "rows": rows}, indent=1) + "\n")


def run_parts(names: list[str], scratch: Path, jobs: int) -> dict[str, float]:
    """Each part's command into scratch/NAME (log: scratch/NAME.log), `jobs` at a time; seconds each."""
    from tqdm import tqdm

    def one(name: str) -> float:
        out = scratch / name
        cmd = [a.replace("{out}", str(out)) for a in PARTS[name]]
        t0 = time.perf_counter()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
        with open(scratch / f"{name}.log", "w") as log:
            rc = subprocess.call(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
        if rc:
            raise RuntimeError(f"{name} failed ({rc}): see {scratch / name}.log")
        return time.perf_counter() - t0

    took: dict[str, float] = {}
    bar = tqdm(total=len(names), desc="figures", unit="part", file=sys.stderr)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(one, n): n for n in names}
        bar.set_postfix_str("running " + ", ".join(names[:jobs]))
        for f in as_completed(futures):
            name = futures[f]
            took[name] = f.result()
            bar.update()
            bar.set_postfix_str(f"{name} done in {took[name]:.0f} s")
            left = [n for n in names if n not in took]
            if left:
                bar.write(f"  {name}: {took[name]:.0f} s; left: {', '.join(left)}")
    bar.close()
    return took


# ---------------------------------------------------------------------------- drawing


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path, **kw) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=kw.pop("dpi", 100), **kw)
    _plt().close(fig)
    return path


def draw_claude_code(parts: list[Path], path: Path) -> Path:
    """Joint attainment over both windows pooled against concurrent sessions, one line per system."""
    rows = [r for p in parts for r in json.loads((p / "claude_code.json").read_text())["rows"]]
    systems = list(dict.fromkeys(r["system"] for r in rows))
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for system in systems:
        ys = []
        for c in CC_GRID:
            rs = [r for r in rows if r["system"] == system and r["concurrency"] == c]
            n = sum(r["requests"] for r in rs)
            ys.append(100 * sum(r["attainment"] * r["requests"] for r in rs) / max(1, n))
        fluid = system.startswith("fluidpd")
        ax.plot(CC_GRID, ys, marker="o", lw=2.2 if fluid else 1.0, ls="-" if fluid else "--", label=system)
    ax.axhline(90, color="k", lw=1, ls=":", label="90% (goodput threshold)")
    ax.set_xlabel("concurrent Claude Code sessions (closed loop)")
    ax.set_ylabel("joint SLO attainment (%)")
    ax.set_xticks(CC_GRID)
    ax.set_title(
        "Claude Code sessions, 8 x H100 Llama-3.1-8B BF16, SLO 5 s / 50 ms, P/D from 2P:6D\n"
        "two 900 s windows pooled ([3600, 4500) and [4500, 5400) s)",
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="lower left")
    return _save(fig, path)


def draw_fluidtoken(result: dict, path: Path) -> Path:
    """The burst's TTFT and the running decodes' gaps, static-pd vs fluidtoken, from the committed JSON."""
    plt = _plt()
    runs = result["runs"]
    systems = list(runs)
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.8))
    x = range(len(systems))
    for ax, keys, scale, unit, slo in (
        (a, ("ttft_p50", "ttft_p99"), 1.0, "s", result["slo_ttft_s"]),
        (b, ("decode_gap_p50", "decode_gap_p99"), 1e3, "ms", result["slo_tbt_s"] * 1e3),
    ):
        w = 0.38
        for i, k in enumerate(keys):
            vals = [runs[s][k] * scale for s in systems]
            bars = ax.bar([j + (i - 0.5) * w for j in x], vals, w, label=k.rsplit("_", 1)[1])
            ax.bar_label(bars, fmt="%.2f" if scale == 1 else "%.0f", fontsize=8)
        ax.axhline(slo, color="k", ls=":", lw=1, label=f"SLO {slo:g} {unit}")
        ax.set_xticks(list(x), systems)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    a.set_ylabel("burst TTFT (s)")
    a.set_title(f"the burst: {result['burst']} x {result['burst_len']}-token prompts", fontsize=10)
    b.set_ylabel("running decodes' inter-token gap (ms)")
    b.set_title("the 6 running decodes during the burst", fontsize=10)
    host = result["host"]
    fig.suptitle(
        f"FluidToken on the real runtime (3 SmolLM2 workers, 1P + 2D), {result['date']}, {result['cpu']}:\n"
        f"prefill {host['prefill_tok_s']:.0f} tok/s, decode step {host['decode_step_ms']:.1f} ms"
        + ("" if "load_avg_1m" not in result else ", load avg " + "-".join(f"{x:.1f}" for x in result["load_avg_1m"])),
        fontsize=9,
    )
    return _save(fig, path)


def draw_kv_tier(result: dict, path: Path) -> Path:
    """The CDF of turn-2+ TTFT, with the node-shared KV store and without (kv_tier.py's runs)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for row in result["rows"]:
        xs = row["turn2_ttft_s"]
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        label = f"{row['arm']}: p50 {row['turn2_ttft_p50_s']:.2f} s, hit rate {row['real_hit_rate']:.0%}"
        ax.step(xs, ys, where="post", label=label)
    a = result["args"]
    ax.set_xlabel("turn-2+ TTFT (s)")
    ax.set_ylabel("share of turns 2+")
    ax.set_xscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(
        f"kv_tier.py --quick: {a['sessions']} chat sessions x {a['turns']} turns, {a['workers']} workers of "
        f"{a['num_kv_blocks']} blocks\n(working set {result['working_set_x_arenas']:.1f}x the arenas), "
        f"{result['date']}, {result['cpu']}, load avg {result['load_avg_1m'][0]:.1f}-{result['load_avg_1m'][1]:.1f}",
        fontsize=9,
    )
    return _save(fig, path)


def draw_table1(result: dict, path: Path) -> Path:
    """runtime_table1.py's rows: joint attainment and P99 TTFT per system, measured and simulated."""
    plt = _plt()
    rows, st = result["rows"], result["setting"]
    fig, axes = plt.subplots(1, 2, figsize=(8.0, 3.6))
    xs = range(len(rows))
    for ax, (metric, label, scale) in zip(
        axes, (("attainment", "joint SLO attainment (%)", 100), ("ttft_p99_s", "P99 TTFT (s)", 1)), strict=True
    ):
        for k, (side, shade) in enumerate((("real", "C0"), ("sim", "C7"))):
            vals = [r[side][metric] * scale for r in rows.values()]
            bars = ax.bar([x + (k - 0.5) * 0.38 for x in xs], vals, 0.38, color=shade,
                          label="real engine" if side == "real" else "simulator")  # fmt: skip
            ax.bar_label(bars, fmt="%.1f", fontsize=7)
        ax.set_xticks(list(xs), list(rows))
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    axes[1].axhline(st["slo"][0], color="C3", lw=0.8, ls="--", label=f"TTFT SLO {st['slo'][0]:g} s")
    axes[1].legend(fontsize=7)
    sp = st["host"]
    fig.suptitle(
        f"Table 1 on the real engine: {st['trace']}, {st['workers']} CPU workers, P/D from {st['prefill_workers']}P"
        f"{st['workers'] - st['prefill_workers']}D, SLO {st['slo'][0]:g} s / {st['slo'][1]:g} s\n{result['date']}, "
        f"{result['cpu']}, prefill {sp['prefill_tok_s']:.0f} tok/s, load avg {result['load_avg_1m'][0]:.1f}-"
        f"{result['load_avg_1m'][1]:.1f}",
        fontsize=8,
    )
    return _save(fig, path)


def draw_peers(result: dict, path: Path) -> Path:
    """engine_vs_peers.py's medians: fluidpd beside llama.cpp's server, the benchmark's own panels."""
    from fluidpd.bench.peers.plot import plot_medians

    title = (f"engine_vs_peers.py --peer llama.cpp, medians of {result['rounds']} rounds (lower is better for TTFT "
             f"and RSS); {result['date']}, {result['cpu']}, load avg {result['load_avg_1m'][0]:.1f}-"
             f"{result['load_avg_1m'][1]:.1f}")  # fmt: skip
    return plot_medians(result["medians"], path, result["concurrency"], title)


def draw_top(result: dict, path: Path) -> Path:
    """One `fluidpd top` frame, rendered by fluidpd.cli.top_view from the committed snapshots, as monospace text."""
    from rich.console import Console

    from fluidpd.cli.top_view import render

    width, size = 170, 8.0  # columns; font size (points)
    console = Console(width=width, file=io.StringIO(), color_system="truecolor", force_terminal=True)
    lines = console.render_lines(render(result["snapshot"], result["previous"]), console.options, pad=False)
    plt = _plt()
    adv, line_in, margin = 0.602 * size / 72, 1.45 * size / 72, 0.15  # a DejaVu Sans Mono cell, inches
    used = max(sum(seg.cell_length for seg in segs) for segs in lines)
    fig_w, fig_h = used * adv + 2 * margin, len(lines) * line_in + 2 * margin
    fig = plt.figure(figsize=(fig_w, fig_h), facecolor="white")
    for i, segments in enumerate(lines):
        col = 0
        for seg in segments:
            style = seg.style
            if seg.text.strip():
                color = "#202020"
                if style and style.color and not style.color.is_default:
                    color = style.color.get_truecolor().hex
                fig.text(
                    (margin + col * adv) / fig_w,
                    1 - (margin + (i + 0.5) * line_in) / fig_h,
                    seg.text,
                    family="DejaVu Sans Mono",
                    fontsize=size,
                    color=color,
                    weight="bold" if style and style.bold else "normal",
                    alpha=0.6 if style and style.dim else 1.0,
                    va="center",
                )
            col += seg.cell_length
    fig.savefig(path, dpi=110, facecolor=fig.get_facecolor())
    plt.close(fig)
    return path


def shrink(path: Path) -> None:
    """Over MAX_BYTES: quantise to a 256-colour palette (Pillow), then lower the resolution until it fits."""
    if path.stat().st_size <= MAX_BYTES:
        return
    from PIL import Image

    img = Image.open(path).convert("RGB")
    while True:
        img.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(path, optimize=True)
        if path.stat().st_size <= MAX_BYTES:
            return
        img = img.resize((img.width * 9 // 10, img.height * 9 // 10), Image.Resampling.LANCZOS)


# ---------------------------------------------------------------------------- real-engine captures


def host_cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return "unknown CPU"


def capture_fluidtoken() -> dict:
    """runtime_fluidtoken.py's run (its functions, its defaults), its numbers kept as JSON."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "runtime"))
    from runtime_common import coordinator
    from runtime_fluidtoken import BURST_LEN, SLO_TBT, SLO_TTFT, burst, burst_size

    runs, profile, n_burst, load0 = {}, None, 0, os.getloadavg()[0]
    for policy in ("static-pd", "fluidtoken"):
        coord = coordinator(policy, 3, profile=profile, prefill_workers=1, ttft_slo_s=SLO_TTFT, tbt_slo_s=SLO_TBT)
        profile = coord.profile
        n_burst = n_burst or burst_size(profile, 1.5)
        runs[policy] = asyncio.run(burst(coord, n_burst))
        print(policy, runs[policy], file=sys.stderr)
    assert profile is not None
    result = {
        "benchmark": "benchmarks/runtime/runtime_fluidtoken.py (defaults: --burst-share 1.5)",
        "host": {
            "prefill_tok_s": 512 / profile.prefill_time(512),
            "prefill_384_s": profile.prefill_time(BURST_LEN),
            "decode_step_ms": profile.decode_step_s * 1e3,
        },
        "burst": n_burst,
        "burst_len": BURST_LEN,
        "burst_share": 1.5,
        "slo_ttft_s": SLO_TTFT,
        "slo_tbt_s": SLO_TBT,
        "runs": runs,
    }
    return with_host(result, load0)


def run_benchmark(script: str, args: Callable[[str], list[str]], result: str, cwd: Path = ROOT) -> dict:
    """benchmarks/`script` with `args(out)` (`out`: a scratch folder), and the JSON `result` it wrote
    there, with the host's date, CPU and load."""
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="fluidpd-capture-") as out:
        subprocess.run([PY, str(ROOT / "benchmarks" / script), *args(out)], check=True, cwd=cwd)
        data = json.loads((Path(out) / result).read_text())
    return with_host(data, load0)


def capture_kv_tier() -> dict:
    """kv_tier.py --quick (two fresh servers: no store, then the store)."""
    return run_benchmark("runtime/kv_tier.py", lambda out: ["--quick", "--out", out], "kv_tier.json")


def capture_table1() -> dict:
    """runtime_table1.py at its defaults (the three systems through the real server; 18 min on a quiet
    2-core host)."""
    return run_benchmark("runtime/runtime_table1.py", lambda out: ["--out", out], "table1.json", ROOT / "benchmarks")


def capture_peers() -> dict:
    """engine_vs_peers.py --peer llama.cpp --rounds 3 (llama.cpp built by scripts/install_llama_cpp.sh;
    2 min on a quiet host)."""
    args = ["--peer", "llama.cpp", "--rounds", "3"]
    return run_benchmark(
        "peers/engine_vs_peers.py", lambda out: [*args, "--plot", f"{out}/p.png", "--json", f"{out}/r.json"], "r.json"
    )


def with_host(result: dict, load0: float) -> dict:
    """`result` with the date, the CPU model and the load average at its start and end (other jobs
    share the cores)."""
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": host_cpu(),
        "load_avg_1m": [load0, os.getloadavg()[0]],
        **result,
    }


def capture_top(port: int = 8791) -> dict:
    """A real `fluidpd serve --workers 3 --policy fluidpd` (SmolLM2) under 9 concurrent completions, one
    worker switched to prefill by the admin API mid-run; /v1/admin/cluster read twice, a second apart."""
    url = f"http://127.0.0.1:{port}"
    serve = [*FLUIDPD, "serve", "--workers", "3", "--policy", "fluidpd", "--port", str(port)]
    serve += ["--max-model-len", "1024", "--prefill-workers", "1", "--admit-ttft-factor", "0"]
    proc = subprocess.Popen(serve, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 600
        while True:
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("server did not start")
            try:
                with urllib.request.urlopen(url + "/health", timeout=5):
                    break
            except OSError:
                time.sleep(2)

        def post(route: str, body: dict) -> dict:
            req = urllib.request.Request(
                url + route, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
            )
            with urllib.request.urlopen(req, timeout=600) as r:
                return json.loads(r.read())

        def complete(i: int) -> None:
            words = " ".join(f"word{(i * 7 + j) % 50}" for j in range(40 + 30 * (i % 4)))
            post("/v1/completions", {"model": "smollm2", "prompt": words, "max_tokens": 96, "ignore_eos": True})

        def cluster() -> dict:
            with urllib.request.urlopen(url + "/v1/admin/cluster", timeout=10) as r:
                return json.loads(r.read())

        with ThreadPoolExecutor(max_workers=9) as pool:
            first = [pool.submit(complete, i) for i in range(5)]
            for f in first:
                f.result()
            later = [pool.submit(complete, i) for i in range(5, 14)]
            time.sleep(3.0)
            decode = next(w["id"] for w in cluster()["workers"] if w.get("role") == "decode")
            try:
                post(f"/v1/admin/workers/{decode}/role", {"role": "prefill"})
            except OSError as exc:
                print(f"role switch refused: {exc}", file=sys.stderr)
            time.sleep(1.0)
            previous = cluster()
            time.sleep(1.0)
            snapshot = cluster()
            for f in later:
                f.result()
    finally:
        proc.send_signal(2)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    return {
        "load_avg_1m": os.getloadavg()[0],
        "command": "fluidpd " + " ".join(serve[3:]),
        "load": "14 completions of 40-130 words, 96 tokens each (9 at once); a decode worker switched to prefill by "
        "POST /v1/admin/workers/ID/role (refused 409 if the cluster forbids it then)",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": host_cpu(),
        "profile": snapshot.get("profile"),
        "previous": previous,
        "snapshot": snapshot,
    }


# ---------------------------------------------------------------------------- main


# --capture NAME -> (the run, its JSON under docs/results/, the figure drawn from it)
CAPTURES = {
    "fluidtoken": (capture_fluidtoken, "runtime_fluidtoken.json", draw_fluidtoken),
    "top": (capture_top, "top_frame.json", draw_top),
    "kv_tier": (capture_kv_tier, "kv_tier.json", draw_kv_tier),
    "table1": (capture_table1, "runtime_table1.json", draw_table1),
    "peers": (capture_peers, "engine_vs_peers.json", draw_peers),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--list", action="store_true", help="list the parts and figures, run nothing")
    ap.add_argument("--only", nargs="+", choices=sorted(PARTS), help="run these parts only (and copy their figures)")
    ap.add_argument("--scratch", type=Path, default=None, help="the runs' directory (default: a temporary one)")
    ap.add_argument("--jobs", type=int, default=2, help="parts run at once (default: 2)")
    ap.add_argument("--scale", action="store_true", help="also `fluidpd experiment scale --window 60` (11 min)")
    ap.add_argument("--no-copy", action="store_true", help="run the parts, copy nothing into docs/images/")
    ap.add_argument("--capture", choices=tuple(CAPTURES), help="rerun a real-engine benchmark, rewrite its JSON")
    ap.add_argument("--claude-code-window", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--claude-code-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.claude_code_window is not None:
        claude_code_window(args.claude_code_window, args.claude_code_out)
        return 0
    if args.list:
        for name, cmd in PARTS.items():
            opt = " (with --scale)" if name in OPTIONAL else ""
            print(f"part {name}{opt}: {' '.join(cmd).replace(PY, 'python')}")
        for img, (part, src) in COPIES.items():
            print(f"docs/images/{img} <- {part}/{src}")
        for img, src in DRAWN_FROM_RESULTS.items():
            print(f"docs/images/{img} <- drawn from {src}")
        return 0
    if args.capture:
        RESULTS.mkdir(parents=True, exist_ok=True)
        capture, name, draw = CAPTURES[args.capture]
        result = capture()
        (RESULTS / name).write_text(json.dumps(result, indent=1, default=float) + "\n")
        img = next(i for i, src in DRAWN_FROM_RESULTS.items() if src == name)
        drawn = draw(result, IMAGES / img)
        shrink(drawn)
        print(f"wrote {RESULTS / name} and {drawn.relative_to(ROOT)}")
        return 0

    t0 = time.perf_counter()
    names = args.only or [n for n in PARTS if n not in OPTIONAL or args.scale]
    tmp = None if args.scratch else tempfile.TemporaryDirectory(prefix="fluidpd-figures-")
    scratch = args.scratch or Path(tmp.name)  # type: ignore[union-attr]
    scratch.mkdir(parents=True, exist_ok=True)
    took = run_parts(names, scratch, args.jobs)
    made: list[Path] = []
    if not args.no_copy:
        IMAGES.mkdir(parents=True, exist_ok=True)
        for img, (part, src) in COPIES.items():
            if part in names:
                (IMAGES / img).write_bytes((scratch / part / src).read_bytes())
                made.append(IMAGES / img)
        cc = [scratch / n for n in names if n.startswith("claude_code_")]
        if len(cc) == len(CC_WINDOWS):
            made.append(draw_claude_code(cc, IMAGES / "claude_code_sessions.png"))
        if not args.only:
            for img, src in DRAWN_FROM_RESULTS.items():
                if src.endswith(".json") and (RESULTS / src).exists():
                    draw = next(d for _, n, d in CAPTURES.values() if n == src)
                    made.append(draw(json.loads((RESULTS / src).read_text()), IMAGES / img))
        for p in made:
            shrink(p)
    total = sum(p.stat().st_size for p in made)
    for p in made:
        print(f"{p.relative_to(ROOT)}  {p.stat().st_size / 1e3:6.1f} KB")
    print("parts: " + ", ".join(f"{n} {s:.0f} s" for n, s in took.items()))
    print(f"figures: {len(made)} PNGs, {total / 1e3:.0f} KB in all, in {time.perf_counter() - t0:.0f} s")
    if tmp:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
