"""The replan experiment's runs: its workload, every system on it, and a row per system."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from fluidpd.bench.restarts import RestartModel
from fluidpd.bench.simrun import attainment_between, run_system
from fluidpd.placement.plan import fixed_split
from fluidpd.placement.replan import ReplanConfig
from fluidpd.sim.run import Setup, SimResult
from fluidpd.workload.registry import load_trace
from fluidpd.workload.trace import Trace, compose

PHASES = (("azure_conv", 1.5), ("azure_code", 1.0), ("azure_conv", 1.5))  # (trace, rate scale)
SYSTEMS = ("static-pd", "distserve", "fluidpd")
RESTART = "cold process restart"


@dataclass(frozen=True, slots=True)
class ReplanWorkload:
    """Phases of `phase_s` seconds each, cut from the shipped traces at their rate scales."""

    phase_s: float = 3600.0
    history_s: float = 600.0
    phases: tuple[tuple[str, float], ...] = PHASES

    def trace(self) -> Trace:
        parts = []
        for name, scale in self.phases:
            t = load_trace(name).scale_rate(scale)
            parts.append(t.window(0.0, min(self.phase_s, t.duration_s)))
        return compose(parts, name="+".join(n for n, _ in self.phases))

    def bounds(self, trace: Trace) -> list[tuple[float, float, str]]:
        """(start, end, label) of each phase in the composed trace."""
        out, t0 = [], 0.0
        for i, (name, _) in enumerate(self.phases):
            d = min(self.phase_s, load_trace(name).scale_rate(self.phases[i][1]).duration_s)
            out.append((t0, t0 + d, f"{i + 1}:{name}"))
            t0 += d
        return out


def run_replan(
    base: Setup, workload: ReplanWorkload | None = None, config: ReplanConfig | None = None, progress: bool = True
) -> tuple[dict, dict[str, SimResult]]:
    """Every system on the workload; (JSON-ready results, the runs for plots)."""
    wl = workload or ReplanWorkload()
    trace = wl.trace()
    history = trace.window(0.0, wl.history_s)
    k0, scores = fixed_split(history, base)
    setup = dataclasses.replace(base, policy=dataclasses.replace(base.policy, prefill_workers=k0))
    restart_s = RestartModel().costs(base.model.weight_bytes)[RESTART][2]
    end = trace.duration_s
    results: dict = {
        "workload": {"phases": wl.bounds(trace), "requests": len(trace), "history_s": wl.history_s},
        "start_split": k0,
        "start_split_attainment_on_history": scores,
        "restart_s": restart_s,
        "restart_mechanism": RESTART,
        "systems": {},
    }
    runs: dict[str, SimResult] = {}
    for system in tqdm(SYSTEMS, desc="replan", unit="system", file=sys.stderr, disable=not progress):
        replan = None if system == "static-pd" else "restart"
        res = run_system(trace, system, setup, replan=replan, replan_config=config, keep_requests=True)
        runs[system] = res
        results["systems"][system] = _row(res, system, trace, wl, base, end)
    return results, runs


def _row(res: SimResult, system: str, trace: Trace, wl: ReplanWorkload, setup: Setup, end: float) -> dict:
    slo = setup.slo
    finished = res.cluster.metrics.finished or []
    evaluated = [r for r in finished if r.arrival_s >= wl.history_s]
    n = int((trace.arrival_s >= wl.history_s).sum())
    ok = [r for r in evaluated if r.ttft_s <= slo.ttft_s and r.tpot_s <= slo.tbt_s]
    ttft = np.array([r.ttft_s for r in evaluated]) if evaluated else np.array([np.nan])
    transitions = getattr(res.cluster.policy, "transitions", [])
    lost = drain = 0.0
    for t in transitions:
        d = t.durations()
        if t.is_restart:
            lost += d.get("restart", 0.0) + d.get("route", 0.0)
            drain += d.get("drain", 0.0)
        elif t.done:
            lost += t.total_s
    gpus = setup.sim.tp
    return {
        "system": system,
        "attainment": len(ok) / n if n else float("nan"),
        "attainment_all": res.summary["attainment"],
        "strict_attainment_all": res.summary["strict_attainment"],
        "ttft_p99_s": float(np.percentile(ttft, 99)),
        "tbt_p99_s": res.summary["tbt_p99_s"],
        "phase_attainment": {
            label: attainment_between(res, trace, slo, max(a, wl.history_s), b) for a, b, label in wl.bounds(trace)
        },
        "replans": res.summary.get("replans", []),
        "role_changes": len(transitions),
        "restarts": sum(1 for t in transitions if t.is_restart),
        "gpu_s_lost": lost * gpus,
        "gpu_s_draining": drain * gpus,
        "gpu_s_total": end * setup.sim.n_workers * gpus,
    }
