"""The KV-reuse table's runs: per workload the saturation search, then every system at each share of it."""

from __future__ import annotations

import math
import multiprocessing
import sys
import time
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field

from tqdm import tqdm

from fluidpd.bench.experiments.kv.goals import check_goals, envelope, host_tier_goals
from fluidpd.bench.experiments.kv.rows import kv_row
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
from fluidpd.bench.saturation import FULL_PROBES, QUICK_PROBES, Probe, search
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
    pool: Executor | None = None
    host_gib: float = 0.0  # also every row with a host KV tier of this many GiB a worker
    pooled: bool = False
    tunings: dict = field(default_factory=dict)

    def window(self, wl: KvWorkload) -> float:
        return self.window_s or (wl.quick_window_s if self.quick else wl.window_s)

    def map(self, fn: Callable, calls: list[tuple]) -> list:
        """[fn(*c) for c in calls], in the pool if there is one; one tick of the bar per call."""
        if self.pool is None:
            out = []
            for c in calls:
                out.append(fn(*c))
                self.bar.update(1)
            return out
        futures = [self.pool.submit(fn, *c) for c in calls]
        for _ in as_completed(futures):
            self.bar.update(1)
        return [f.result() for f in futures]

    def near(self, wl: KvWorkload, load: float) -> int | None:
        """Quick: the split tuned at the workload's load nearest `load` (in ratio; ties: the lower),
        whose neighbourhood the tuning searches; None (every split) in full or at the first load."""
        done = sorted((lo, t["split"]) for (name, lo), t in self.tunings.items() if name == wl.name)
        if not self.quick or not done:
            return None
        return min(done, key=lambda d: abs(math.log(d[0] / load)))[1]

    def point(self, wl: KvWorkload, load: float) -> tuple[Trace, Trace, int, dict]:
        """(history, evaluated window, requests clipped, tuning on the history) at `load`, tuned once."""
        history, trace, clipped = wl.windows(load, self.window(wl), self.seed)
        key = (wl.name, load)
        if key not in self.tunings:
            self.bar.set_postfix_str(f"{wl.name} {load:.3g} tuning on history", refresh=False)
            near = self.near(wl, load)
            self.tunings[key] = tune(history, self.seed, self.quick, near, self.pool)
            self.bar.update(tuning_runs(self.quick, near))
        return history, trace, clipped, self.tunings[key]

    def best_baseline(self, wl: KvWorkload, load: float) -> Probe:
        """The best baseline's joint attainment on the history window at `load`. Quick: the tuning's
        own runs (static-pd at every split, chunked and chunked-late-last at every budget, each with
        its policy's default router); full: also every baseline row at the tuned knobs."""
        history, _, _, tuned = self.point(wl, load)
        scores = {f"static-pd {k}P": v for k, v in tuned["split_attainment"].items()}
        scores |= {f"chunked budget {b}": v for b, v in tuned["chunk_budget_attainment"].items()}
        scores |= {f"chunked-late-last budget {b}": v for b, v in tuned["chunk_budget_late_last_attainment"].items()}
        if not self.quick:
            self.bar.set_postfix_str(f"{wl.name} {load:.3g} baselines on history", refresh=False)
            got = self.map(_attainment, [(history, s, tuned, self.seed) for s in BASELINES])
            scores |= {s.name: a for s, a in zip(BASELINES, got)}
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
        rows, host_rows, n = {}, {}, len(systems_for(wl.name))
        for share in SHARES:
            load = share * sat["saturation_load"]
            both, entry["loads"][f"{share:g}"] = self.at(wl, load)  # the untiered rows, then any tiered
            rows[f"{share:g}"], host_rows[f"{share:g}"] = both[:n], both[n:]
        entry["wall_s"] = time.perf_counter() - t0
        return {"entry": entry, "rows": rows, "host_rows": host_rows}

    def at(self, wl: KvWorkload, load: float) -> tuple[list[dict], dict]:
        """Every system on the evaluated window at `load`: (rows, what the load was and was tuned to)."""
        history, trace, clipped, tuned = self.point(wl, load)
        if len(trace) == 0:
            raise ValueError(f"{wl.name} at {load:.3g}: the evaluated window holds no requests")
        block = setup().sim.block_size
        follow, new = followups(trace, block), oracle_new_tokens(trace, block)
        self.bar.set_postfix_str(f"{wl.name} {load:.3g} every system", refresh=False)
        systems = list(systems_for(wl.name))
        if self.host_gib:  # the same rows again, each with the host tier
            systems += [s.with_host(self.host_gib, self.pooled) for s in systems]
        rows = self.map(_row, [(trace, s, tuned, self.seed, follow, new) for s in systems])
        info = {
            "load": load,
            "requests": len(trace),
            "history_requests": len(history),
            "followups": int(follow.sum()),
            "clipped_requests": clipped,
            "tuned_on_history": tuned,
        }
        return rows, info


def _row(trace: Trace, s: System, tuned: dict, seed: int, follow, new) -> dict:
    """One system's row on the evaluated window (a pool task: module-level, returns plain data)."""
    res = run_instrumented(trace, s.policy, s.setup(tuned, seed), keep_requests=True)
    return kv_row(res, s.name, s.imitates, follow, new)


def _attainment(history: Trace, s: System, tuned: dict, seed: int) -> float:
    return run_instrumented(history, s.policy, s.setup(tuned, seed)).summary["attainment"]


def run_kv(
    workloads: list[str] | None = None,
    *,
    quick: bool = False,
    window_s: float | None = None,
    probes: int | None = None,
    seed: int = 0,
    progress: bool = True,
    jobs: int = 2,
    host_gib: float = 0.0,
    pooled: bool = False,
) -> dict:
    """The KV-reuse table: {"setting", "workloads" (saturation, loads, tunings), "kv" (workload -> share
    of saturation -> rows), "goals"}. `jobs` > 1: independent simulations (a load's rows, a tuning's
    three searches, full's baselines on history) run in that many processes; every simulation is seeded
    on its own, so the results are the same as with 1. `host_gib` > 0: every row also runs with a host
    KV tier of that many GiB a worker (one per node with `pooled`), into "kv_host", compared in
    "host_tier" (tuning and saturation stay the untiered rows')."""
    names = list(workloads or WORKLOADS)
    for n in names:
        if n not in WORKLOADS:
            raise ValueError(f"unknown workload {n!r}; choose from {', '.join(WORKLOADS)}")
    n_probes = probes or (QUICK_PROBES if quick else FULL_PROBES)
    total = _total_runs(names, quick, n_probes, host_gib)
    bar = tqdm(total=total, desc="kv", unit="run", file=sys.stderr, disable=not progress, mininterval=0.5)
    pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) if jobs > 1 else None
    state = KvRun(window_s, seed, quick, bar, n_probes, pool, host_gib, pooled)
    t0 = time.perf_counter()
    results: dict = {"setting": setting(quick, seed, n_probes) | {"jobs": jobs}, "workloads": {}, "kv": {}}
    try:
        for name in names:
            out = state.workload(WORKLOADS[name])
            results["workloads"][name], results["kv"][name] = out["entry"], out["rows"]
            if host_gib:
                results.setdefault("kv_host", {})[name] = out["host_rows"]
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        bar.close()
    _add_goals(results, host_gib, pooled)
    results["wall_s"] = time.perf_counter() - t0
    return results


def _total_runs(names: list[str], quick: bool, n_probes: int, host_gib: float) -> int:
    """The simulations `run_kv` runs (quick: a guess, the tuned splits' neighbourhoods are smaller at the ends)."""
    tunings = n_probes + len(SHARES)
    near = N_WORKERS // 2 if quick else None  # quick: every split at a workload's first load, then three
    tuning = tuning_runs(quick) + (tunings - 1) * tuning_runs(quick, near)
    return sum(
        tuning
        + (0 if quick else n_probes * len(BASELINES))
        + len(SHARES) * len(systems_for(n)) * (2 if host_gib else 1)
        for n in names
    )


def _add_goals(results: dict, host_gib: float, pooled: bool) -> None:
    """The goals and envelopes of the table's rows (and of its host-tier rows) into `results`."""
    results["goals"] = check_goals(results)
    results["envelope"] = [p.as_json() for p in envelope(results)]
    if host_gib:
        results["host_tier"] = host_tier_goals(results) | {"gib_per_worker": host_gib, "pooled": pooled}
        results["envelope_host"] = [p.as_json() for p in envelope(results, host=True)]


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
