"""The README's claims that take minutes, rerun: each claim's README figure beside today's.

Every row of the README's "Where the numbers come from" table names the commands that measure it.
CLAIMS knows how to rerun each of them on this host (a README row, found by the command it names,
and the command line); this script runs them one after another (`--only NAME...`; `--list` shows
them with the minutes they took here and the README's date for each row), then prints, per claim,
what the README says, how old that is, and the headline the command printed today (its last line),
so a stale or machine-bound claim shows before it ships. Every headline goes to --out as JSON.

    .venv/bin/python benchmarks/readme_claims.py --list
    .venv/bin/python benchmarks/readme_claims.py [--only runtime_table1 prefix_cache] [--out results/readme_claims]

Rerunning all of them takes about three hours on a 2-core host (`--list` sums them); the real-engine
ones are load-relative (`fluidpd.bench.capacity`), so their figures mean the same on a faster or
slower machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FLUIDPD = (sys.executable, "-m", "fluidpd.cli")
PY = (sys.executable,)


@dataclass(frozen=True)
class Claim:
    """One command behind a README row: `row` is how the row's command cell names it."""

    name: str
    row: str
    argv: tuple[str, ...]
    minutes: float  # about how long one run takes on a 2-core host
    needs: str = ""  # what must be installed first (llama.cpp's server), else the claim is skipped


CLAIMS = (
    Claim("table1_sim", "fluidpd experiment table1", (*FLUIDPD, "experiment", "table1", "--out", "results/table1"), 60),
    Claim(
        "azure_code_bound",
        "benchmarks/simulation/azure_code_bound.py",
        (*PY, "benchmarks/simulation/azure_code_bound.py"),
        5,
    ),
    Claim("runtime_table1", "benchmarks/runtime/runtime_table1.py", (*PY, "benchmarks/runtime/runtime_table1.py"), 30),
    Claim(
        "runtime_phase_shift",
        "benchmarks/runtime/runtime_table1.py --phase-shift-s 20",
        (
            *PY,
            "benchmarks/runtime/runtime_table1.py",
            "--phase-shift-s",
            "20",
            "--out",
            "results/runtime_table1_phase_shift",
        ),
        30,
    ),
    Claim(
        "runtime_fluidtoken",
        "benchmarks/runtime/runtime_fluidtoken.py",
        (*PY, "benchmarks/runtime/runtime_fluidtoken.py"),
        2,
    ),
    Claim("replan", "fluidpd experiment replan", (*FLUIDPD, "experiment", "replan", "--out", "results/replan"), 20),
    Claim(
        "scale",
        "fluidpd experiment scale --window 60",
        (*FLUIDPD, "experiment", "scale", "--window", "60", "--out", "results/scale"),
        12,
    ),
    Claim(
        "runtime_fluidrole",
        "benchmarks/runtime/runtime_fluidrole.py",
        (*PY, "benchmarks/runtime/runtime_fluidrole.py"),
        3,
    ),
    Claim("runtime_restart", "`runtime_restart.py`", (*PY, "benchmarks/runtime/runtime_restart.py"), 3),
    Claim("table2", "fluidpd experiment table2", (*FLUIDPD, "experiment", "table2", "--out", "results/table2"), 2),
    Claim("prefix_cache", "benchmarks/runtime/prefix_cache.py", (*PY, "benchmarks/runtime/prefix_cache.py"), 16),
    Claim(
        "sim_prefix_cache",
        "benchmarks/simulation/sim_prefix_cache.py",
        (*PY, "benchmarks/simulation/sim_prefix_cache.py"),
        7,
    ),
    Claim("kv_tier", "benchmarks/runtime/kv_tier.py", (*PY, "benchmarks/runtime/kv_tier.py"), 12),
    Claim(
        "sim_host_tier", "benchmarks/simulation/sim_host_tier.py", (*PY, "benchmarks/simulation/sim_host_tier.py"), 2
    ),
    Claim("worker_failure", "benchmarks/runtime/worker_failure.py", (*PY, "benchmarks/runtime/worker_failure.py"), 4),
    Claim(
        "parallel_sampling",
        "benchmarks/runtime/parallel_sampling.py",
        (*PY, "benchmarks/runtime/parallel_sampling.py"),
        12,
    ),
    Claim(
        "structured_outputs",
        "benchmarks/engine/structured_outputs.py",
        (*PY, "benchmarks/engine/structured_outputs.py"),
        2,
    ),
    Claim("sim_fidelity", "benchmarks/simulation/sim_fidelity.py", (*PY, "benchmarks/simulation/sim_fidelity.py"), 25),
    Claim("engine_decode", "benchmarks/engine/engine_decode.py", (*PY, "benchmarks/engine/engine_decode.py"), 5),
    Claim(
        "engine_vs_peers",
        "`engine_vs_peers.py`",
        (*PY, "benchmarks/peers/engine_vs_peers.py", "--peer", "llama.cpp", "--rounds", "3"),
        15,
        needs="llama.cpp's server (scripts/install_llama_cpp.sh)",
    ),
    Claim(
        "engine_llamacpp_agreement",
        "`engine_llamacpp_agreement.py`",
        (*PY, "benchmarks/peers/engine_llamacpp_agreement.py"),
        11,
        needs="llama.cpp's server (scripts/install_llama_cpp.sh)",
    ),
)


@dataclass(frozen=True)
class Row:
    """A row of the README's claims table."""

    claim: str
    measured: str
    commands: str

    @property
    def dates(self) -> list[dt.date]:
        return [dt.date.fromisoformat(d) for d in re.findall(r"\b(\d{4}-\d{2}-\d{2})\b", self.measured)]


def readme_rows(text: str) -> list[Row]:
    """The rows of the table under "Where the numbers come from"."""
    section = text.split("## Where the numbers come from", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) == 3 and cells[0] not in ("claim", "---"):
            rows.append(Row(*cells))
    return rows


def row_of(claim: Claim, rows: list[Row]) -> Row:
    """The one README row whose command cell names `claim`."""
    found = [r for r in rows if claim.row in r.commands]
    if len(found) != 1:
        raise LookupError(f"{claim.name}: {len(found)} README rows name {claim.row!r} (one expected)")
    return found[0]


def missing(claim: Claim) -> str:
    """Why `claim` cannot run here ('' if it can)."""
    if claim.needs:
        from fluidpd.bench.peers.llamacpp import llama_server_binary

        try:
            llama_server_binary()
        except FileNotFoundError:
            return f"needs {claim.needs}"
    return ""


def headline(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def run(claim: Claim) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run(claim.argv, cwd=ROOT, capture_output=True, text=True)
    out = {"exit": proc.returncode, "minutes": (time.perf_counter() - t0) / 60, "headline": headline(proc.stdout)}
    if proc.returncode:
        out["stderr_tail"] = proc.stderr[-2000:]
    return out


def age(row: Row, today: dt.date) -> str:
    newest = max(row.dates, default=None)
    return "undated" if newest is None else f"{newest}, {(today - newest).days} days old"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=[c.name for c in CLAIMS], help="these claims (default: all)")
    ap.add_argument("--list", action="store_true", help="list the claims, their rows and dates; run nothing")
    ap.add_argument("--out", type=Path, default=Path("results/readme_claims"))
    args = ap.parse_args()
    rows, today = readme_rows(README.read_text()), dt.datetime.now(dt.UTC).date()
    chosen = [c for c in CLAIMS if not args.only or c.name in args.only]
    if args.list:
        for c in chosen:
            r = row_of(c, rows)
            print(f"{c.name:18} ~{c.minutes:>3.0f} min  README: {age(r, today):22} {r.claim}")
        print(f"{len(chosen)} claims, about {sum(c.minutes for c in chosen) / 60:.1f} h in all")
        return
    from tqdm import tqdm

    results = {}
    for c in tqdm(chosen, desc="README claims", unit="claim", file=sys.stderr):
        why = missing(c)
        results[c.name] = {"skipped": why} if why else run(c)
    args.out.mkdir(parents=True, exist_ok=True)
    report = []
    for c in chosen:
        r, got = row_of(c, rows), results[c.name]
        report.append({"claim": c.name, "row": r.claim, "readme": r.measured, "readme_age": age(r, today), **got})
        print(f"\n{c.name} ({r.claim})\n  README ({age(r, today)}): {r.measured}")
        if got.get("skipped"):
            print(f"  today: skipped ({got['skipped']})")
        else:
            status = "" if got["exit"] == 0 else f" [exit {got['exit']}]"
            print(f"  today ({got['minutes']:.0f} min){status}: {got['headline']}")
    (args.out / "readme_claims.json").write_text(json.dumps({"date": str(today), "claims": report}, indent=1) + "\n")
    failed = [c for c, got in results.items() if got.get("exit")]
    ran = sum(1 for got in results.values() if "exit" in got)
    print(
        f"\nreadme_claims: {ran} of {len(chosen)} claims rerun on {today}, {len(failed)} failed"
        + (f" ({', '.join(failed)})" if failed else "")
        + f"; headlines in {args.out / 'readme_claims.json'}"
    )


if __name__ == "__main__":
    main()
