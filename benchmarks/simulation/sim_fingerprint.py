"""Simulator fingerprint: every policy on a few workloads, per-request times and the summary.

A speed-up is checked to leave the results bit-identical (one workload has prefix-cache hits).

    .venv/bin/python benchmarks/simulation/sim_fingerprint.py --save before.json   # at the base commit
    .venv/bin/python benchmarks/simulation/sim_fingerprint.py --check before.json  # after the change

The last line says whether every case matched (exact float equality, run by run). From a git
worktree, put its package first (PYTHONPATH=.): the venv's editable install points at the main
checkout.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import replace

from fluidpd.core.metrics import Slo
from fluidpd.policy.base import PolicyConfig
from fluidpd.policy.registry import POLICIES
from fluidpd.sim.config import SimConfig
from fluidpd.sim.run import Setup, simulate
from fluidpd.specs.hardware import get_hardware
from fluidpd.specs.models import get_model
from fluidpd.workload import load_trace, synthetic


def cases():
    """(name, trace, setup) of each workload; every policy runs on each."""
    h100_70b = Setup(
        get_model("llama-3.3-70b", "fp8"),
        get_hardware("h100"),
        Slo(2.0, 0.1),
        SimConfig(n_workers=8),
        PolicyConfig(prefill_workers=2),
    )
    h100_8b = Setup(
        get_model("llama-3.1-8b", "bf16"),
        get_hardware("h100"),
        Slo(1.0, 0.05),
        SimConfig(n_workers=4, step_jitter_cv=0.1, seed=3),
        PolicyConfig(prefill_workers=1),
    )
    cpu = Setup(get_model("smollm2-135m", "bf16"), get_hardware("cpu-host"), Slo(5.0, 0.5), SimConfig(n_workers=4))
    azure = load_trace("azure_conv").scale_rate(4).head(3000)
    yield "azure_conv_x4_3k/70b-h100", azure, h100_70b
    # overloaded with a small arena: preemptions and long queues
    small_kv = replace(h100_8b, sim=SimConfig(n_workers=4, gpu_memory_utilization=0.25))
    yield "azure_conv_x8_2k/8b-h100-small-kv", load_trace("azure_conv").scale_rate(8).head(2000), small_kv
    synth = synthetic(3000, 60.0, prompt_len=("lognormal", 1024, 0.8), output_len=("lognormal", 128, 0.8), seed=1)
    yield "synthetic_3k/8b-h100-jitter", synth, h100_8b
    # closed-loop chat sessions with block ids: the prefix cache hits
    sessions = load_trace("mooncake_conv", sessions=True).head(600)
    yield "mooncake_conv_sessions_600/8b-h100-prefix-cache", sessions, replace(h100_8b, sim=SimConfig(n_workers=4))
    cpu_trace = synthetic(150, 2.0, prompt_len=("lognormal", 256, 0.5), output_len=("lognormal", 32, 0.5), seed=2)
    yield "synthetic_150/cpu-host-contended", cpu_trace, cpu


def fingerprint(result) -> dict:
    """The summary (less wall time) and a hash of every finished request's timeline."""
    summary = {k: v for k, v in result.summary.items() if k != "sim_wall_s"}
    rows = sorted(
        (r.id, r.arrival_s, r.first_token_s, r.last_token_s, r.finish_s, r.gaps, r.gaps_over, r.preemptions)
        for r in result.cluster.metrics.finished
    )
    digest = hashlib.sha256(repr(rows).encode()).hexdigest()
    tbt = result.cluster.metrics.tbt
    hist = hashlib.sha256(tbt.counts.tobytes() + repr((tbt.total, tbt.sum, tbt.max)).encode()).hexdigest()
    return {"summary": summary, "requests_sha256": digest, "tbt_hist_sha256": hist}


def run_all() -> dict:
    out = {}
    for name, trace, setup in cases():
        for policy in POLICIES.names():
            if policy in ("prefill-only", "decode-only"):
                continue
            try:
                result = simulate(trace, policy, setup, keep_requests=True)
            except ValueError as e:  # a policy that cannot run this setup
                out[f"{name}/{policy}"] = {"error": str(e)}
                continue
            out[f"{name}/{policy}"] = fingerprint(result)
            print(f"{name}/{policy}: {result.summary['completed']} completed", file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--save", metavar="JSON")
    group.add_argument("--check", metavar="JSON")
    args = ap.parse_args()
    now = run_all()
    if args.save:
        with open(args.save, "w") as f:
            json.dump(now, f, indent=1, sort_keys=True)
        print(f"headline: saved {len(now)} cases to {args.save}")
        return
    with open(args.check) as f:
        before = json.load(f)
    differ = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
    for k in differ:
        print(f"DIFFERS {k}: {before.get(k)} != {now.get(k)}")
    print(f"headline: {len(now) - len(differ)}/{len(now)} cases identical" + (" (FAIL)" if differ else ""))
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
