"""The KV-reuse table's runs: per workload the saturation search, then every system at each share of it."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from tqdm import tqdm

from fluidpd.bench.experiments.kv.goals import check_goals
from fluidpd.bench.experiments.kv.rows import kv_row
from fluidpd.bench.experiments.kv.saturation import FULL_PROBES, QUICK_PROBES, Probe, search
from fluidpd.bench.experiments.kv.setting import (
    DTYPE,
    GPU,
    JITTER_CV,
    MODEL,
    N_WORKERS,
    SHARES,
    SLO,
    WORKLOADS,
    KvWorkload,
    context_len,
    followups,
    oracle_new_tokens,
    setup,
    ttft_justification,
)
from fluidpd.bench.experiments.kv.systems import BASELINES, System, systems_for, tune, tuning_runs
from fluidpd.bench.simrun import run_instrumented
from fluidpd.workload.trace import Trace


@dataclass
class KvRun:
    """A KV-reuse table in progress: its settings, progress bar and the tunings made per (workload, load)."""

    window_s: float | None
    seed: int
    quick: bool
    bar: tqdm
    probes: int
    tunings: dict = field(default_factory=dict)

    def window(self, wl: KvWorkload) -> float:
        return self.window_s or (wl.quick_window_s if self.quick else wl.window_s)

    def point(self, wl: KvWorkload, load: float) -> tuple[Trace, Trace, int, dict]:
        """(history, evaluated window, requests clipped, tuning on the history) at `load`, tuned once."""
        history, trace, clipped = wl.windows(load, self.window(wl), self.seed)
        key = (wl.name, load)
        if key not in self.tunings:
            self.bar.set_postfix_str(f"{wl.name} {load:.3g} tuning on history", refresh=False)
            self.tunings[key] = tune(history, self.seed, self.quick, self.bar.update)
        return history, trace, clipped, self.tunings[key]

    def best_baseline(self, wl: KvWorkload, load: float) -> Probe:
        """The best baseline's joint attainment on the history window at `load`. Quick: the tuning's
        own runs (static-pd at every split and chunked at every budget, each with its policy's default
        router); full: also every baseline row at the tuned knobs."""
        history, _, _, tuned = self.point(wl, load)
        scores = {f"static-pd {k}P": v for k, v in tuned["split_attainment"].items()}
        scores |= {f"chunked budget {b}": v for b, v in tuned["chunk_budget_attainment"].items()}
        if not self.quick:
            for s in BASELINES:
                self.bar.set_postfix_str(f"{wl.name} {load:.3g} {s.name} on history", refresh=False)
                scores[s.name] = run_instrumented(history, s.policy, s.setup(tuned, self.seed)).summary["attainment"]
                self.bar.update(1)
        best = max(scores, key=lambda k: scores[k])
        return Probe(load, scores[best], best)

    def workload(self, wl: KvWorkload) -> dict:
        """The saturation search, then every system at each share of the saturation load."""
        t0 = time.perf_counter()
        sat = search(wl.start_load, self.probes, lambda load: self.best_baseline(wl, load))
        entry = {
            "about": wl.about,
            "knob": wl.knob,
            "window_s": self.window(wl),
            "history_start_s": wl.offset_s,
            "saturation": sat,
            "loads": {},
        }
        rows = {}
        for share in SHARES:
            load = share * sat["saturation_load"]
            rows[f"{share:g}"], entry["loads"][f"{share:g}"] = self.at(wl, load)
        entry["wall_s"] = time.perf_counter() - t0
        return {"entry": entry, "rows": rows}

    def at(self, wl: KvWorkload, load: float) -> tuple[list[dict], dict]:
        """Every system on the evaluated window at `load`: (rows, what the load was and was tuned to)."""
        history, trace, clipped, tuned = self.point(wl, load)
        if len(trace) == 0:
            raise ValueError(f"{wl.name} at {load:.3g}: the evaluated window holds no requests")
        block = setup().sim.block_size
        follow, new = followups(trace, block), oracle_new_tokens(trace, block)
        rows = []
        for s in systems_for(wl.name):
            rows.append(self.run(wl, trace, s, tuned, follow, new))
        info = {
            "load": load,
            "requests": len(trace),
            "history_requests": len(history),
            "followups": int(follow.sum()),
            "clipped_requests": clipped,
            "tuned_on_history": tuned,
        }
        return rows, info

    def run(self, wl: KvWorkload, trace: Trace, s: System, tuned: dict, follow, new) -> dict:
        self.bar.set_postfix_str(f"{wl.name} {s.name}", refresh=False)
        res = run_instrumented(trace, s.policy, s.setup(tuned, self.seed), keep_requests=True)
        self.bar.update(1)
        return kv_row(res, s.name, s.imitates, follow, new)


def run_kv(
    workloads: list[str] | None = None,
    *,
    quick: bool = False,
    window_s: float | None = None,
    probes: int | None = None,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """The KV-reuse table: {"setting", "workloads" (saturation, loads, tunings), "kv" (workload -> share
    of saturation -> rows), "goals"}."""
    names = list(workloads or WORKLOADS)
    for n in names:
        if n not in WORKLOADS:
            raise ValueError(f"unknown workload {n!r}; choose from {', '.join(WORKLOADS)}")
    n_probes = probes or (QUICK_PROBES if quick else FULL_PROBES)
    per_load = tuning_runs(quick) + (0 if quick else len(BASELINES))
    total = sum(n_probes * per_load + len(SHARES) * (tuning_runs(quick) + len(systems_for(n))) for n in names)
    bar = tqdm(total=total, desc="kv", unit="run", file=sys.stderr, disable=not progress, mininterval=0.5)
    state = KvRun(window_s, seed, quick, bar, n_probes)
    t0 = time.perf_counter()
    results: dict = {"setting": setting(quick, seed, n_probes), "workloads": {}, "kv": {}}
    for name in names:
        out = state.workload(WORKLOADS[name])
        results["workloads"][name], results["kv"][name] = out["entry"], out["rows"]
    bar.close()
    results["goals"] = check_goals(results)
    results["wall_s"] = time.perf_counter() - t0
    return results


def setting(quick: bool, seed: int, probes: int) -> dict:
    """The KV-reuse table's setting, as its JSON records it."""
    base = setup()
    return {
        "model": MODEL,
        "dtype": DTYPE,
        "gpu": GPU,
        "workers": N_WORKERS,
        "tp": 1,
        "prefix_caching": True,
        "jitter_cv": JITTER_CV,
        "slo_ttft_s": SLO.ttft_s,
        "slo_tbt_s": SLO.tbt_s,
        "context_tokens": context_len(),
        "kv_bytes_per_token": base.model.kv_bytes_per_token,
        "kv_tokens_per_worker": base.kv_blocks(base.roofline()) * base.sim.block_size,
        "ttft_justification": ttft_justification(),
        "shares_of_saturation": list(SHARES),
        "saturation_probes": probes,
        "quick": quick,
        "seed": seed,
        "systems": {s.name: s.imitates for s in systems_for("hot_prefix")},
    }
