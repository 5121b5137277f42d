"""Table 1's runs: every system on every workload and rate scale, each tuned on its history window."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from tqdm import tqdm

from fluidpd.bench.experiments.common import (
    BASELINE_SPLIT,
    CHUNK_BUDGETS,
    DTYPE,
    FULL_WINDOW_S,
    GPU,
    JITTER_CV,
    MODEL,
    N_WORKERS,
    PHASE_SHIFT,
    QUICK_WINDOW_S,
    SLO,
    SPLITS,
    WORKLOADS,
    Workload,
    best_split,
    headline_of,
    row,
    setup,
    split_label,
    ttft_justification,
    tune_on_history,
)
from fluidpd.bench.experiments.table1.goals import check_goals, envelope, goodput_search
from fluidpd.bench.simrun import run_system
from fluidpd.sim.config import SimConfig
from fluidpd.sim.run import Setup
from fluidpd.workload.trace import Trace

SYSTEMS = (
    "colocated",
    "chunked",
    "chunked late-last",
    "static-pd 2P:6D",
    "distserve",
    "autoscaler",
    "static-pd best",
    "fluidtoken",
    "fluidpd",
)
LABELS = {
    "colocated": "vLLM-style continuous batching",
    "chunked": "Sarathi-Serve chunked prefill, token budget tuned on history",
    "chunked late-last": "Sarathi-Serve chunked prefill, late-last queue order, budget tuned on history",
    "static-pd 2P:6D": "the seed's SGLang / vLLM P/D baseline",
    "distserve": "split searched on history; replanning by cold restart",
    "autoscaler": "Dynamo-style SLA planner from the distserve split; warm restarts",
    "static-pd best": "ORACLE: every split tried on the evaluated window",
    "fluidtoken": "FluidToken only, from the distserve split",
    "fluidpd": "FluidToken + FluidRole, from the distserve split",
}


def run_table1(
    workloads: list[str] | None = None,
    *,
    quick: bool = False,
    scales: tuple[float, ...] | None = None,
    window_s: float | None = None,
    seed: int = 0,
    goodput: bool | None = None,
    progress: bool = True,
    placement: str = "auto",
    model: str = MODEL,
) -> tuple[dict, dict]:
    """Every system on every workload and rate scale. Returns (JSON-ready results, kept objects for
    plots: the fluidpd runs at the headline scale under "timeline_<workload>").

    Each evaluated window has a history window before it (the Azure traces: the window before; the
    synthetic phase shift: another draw of the same process). What is tuned is tuned there: the
    distserve split (`placement` "auto": every static split simulated on the history, the best
    kept; or a `fluidpd place` JSON) and the token budgets of chunked and chunked late-last (each
    searched under its own queue order). Only "static-pd best" looks at the
    evaluated window (every split tried on it): the oracle. `model`: one worker's model (at DTYPE)."""
    names = _checked(workloads, scales)
    window = window_s or (QUICK_WINDOW_S if quick else FULL_WINDOW_S)
    if not window > 0:
        raise ValueError("window must be > 0")
    goodput = (not quick) if goodput is None else goodput
    plan = {n: tuple(sorted(scales or (WORKLOADS[n].quick_scales if quick else WORKLOADS[n].scales))) for n in names}
    results: dict = {"setting": setting(window, seed, quick, model), "workloads": {}, "table1": {}}
    t_start = time.perf_counter()
    bar = tqdm(total=_runs(plan), desc="table1", unit="run", file=sys.stderr, disable=not progress, mininterval=0.5)
    state = Table1Run(window, seed, placement, bar, model)
    for name in names:
        entry = state.workload(WORKLOADS[name], plan[name])
        results["workloads"][name] = entry
        shown = entry["runs"][f"{entry['headline_scale']:g}"]["systems"]
        results["table1"][name] = [shown[s] for s in SYSTEMS]
    bar.close()
    results["goodput"] = (
        goodput_search(plan, window, seed, state.cache, progress, results, model)
        if goodput and "azure_code" in names
        else None
    )
    results["goals"] = check_goals(results)
    results["envelope"] = [p.as_json() for p in envelope(results, SYSTEMS)]
    results["wall_s"] = time.perf_counter() - t_start
    return results, state.kept


def _checked(workloads: list[str] | None, scales: tuple[float, ...] | None) -> list[str]:
    names = list(workloads or WORKLOADS)
    for n in names:
        if n not in WORKLOADS:
            raise ValueError(f"unknown workload {n!r}; choose from {', '.join(WORKLOADS)}")
    if scales is not None and (not scales or min(scales) <= 0):
        raise ValueError("rate scales must be > 0")
    return names


def _runs(plan: dict[str, tuple[float, ...]]) -> int:
    """Simulations per Table 1 (the progress bar's total): tuning (the splits, both chunked budget
    searches), the systems and every split (the two static-pd systems are splits' runs)."""
    per_scale = len(SPLITS) + 2 * len(CHUNK_BUDGETS) + len(SYSTEMS) - 2 + len(SPLITS)
    return sum(len(s) for s in plan.values()) * per_scale


@dataclass(frozen=True, slots=True)
class Point:
    """One workload at one rate scale: the evaluated window and the history it is tuned on."""

    wl: Workload
    scale: float
    trace: Trace
    history: Trace
    headline: bool


@dataclass
class Table1Run:
    """A Table 1 run in progress: its settings, progress bar, the kept runs and the attainment cache."""

    window_s: float
    seed: int
    placement: str
    bar: tqdm
    model: str = MODEL
    kept: dict = field(default_factory=dict)
    cache: dict = field(default_factory=dict)  # (workload, policy, knob, scale) -> attainment, for the goodput

    def workload(self, wl: Workload, scales: tuple[float, ...]) -> dict:
        """Every rate scale of one workload."""
        head = headline_of(wl, scales)
        entry = {
            "about": wl.about,
            "window_s": self.window_s,
            "start_s": wl.start(self.window_s),
            "headline_scale": head,
            "scales": list(scales),
            "phases": wl.phases(self.window_s),
            "runs": {},
        }
        t0 = time.perf_counter()
        for x in scales:
            entry["runs"][f"{x:g}"] = self.scale(wl, x, x == head)
        entry["wall_s"] = time.perf_counter() - t0
        return entry

    def scale(self, wl: Workload, x: float, headline: bool) -> dict:
        """Tuning on the history, then every static split and every system on the evaluated window."""
        self.bar.set_postfix_str(f"{wl.name} x{x:g} tuning on history", refresh=False)
        history = wl.history(x, self.window_s, self.seed)
        tuned = tune_on_history(history, self.placement, self.seed, self.bar.update, self.model)
        trace = wl.trace(x, self.window_s, self.seed, wl.start(self.window_s))
        if len(trace) == 0:
            raise ValueError(f"{wl.name} x{x:g}: the {self.window_s:g} s window holds no requests")
        point = Point(wl, x, trace, history, headline)
        splits = {j: self._run(point, f"static-pd {split_label(j)}", "static-pd", self._setup(j)) for j in SPLITS}
        for j, r in splits.items():
            self.cache[(wl.name, "static-pd", j, x)] = r["attainment"]
        best = best_split(splits)
        systems = self._systems(point, splits, best, tuned)
        for name, r in systems.items():
            r["what"] = LABELS[name]
        return {
            "scale": x,
            "requests": len(trace),
            "history_requests": len(history),
            "tuned_on_history": tuned,
            "best_split": split_label(best),
            "systems": systems,
            "splits": {split_label(j): r for j, r in splits.items()},
        }

    def _systems(self, p: Point, splits: dict[int, dict], best: int, tuned: dict) -> dict[str, dict]:
        k, base = tuned["split"], BASELINE_SPLIT
        return {
            "colocated": self._run(p, "colocated", "colocated", self._setup(base)),
            "chunked": self._run(p, "chunked", "chunked", self._setup(base, chunk_budget=tuned["chunk_budget"])),
            "chunked late-last": self._run(
                p,
                "chunked late-last",
                "chunked-late-last",
                self._setup(base, chunk_budget=tuned["chunk_budget_late_last"]),
            ),
            "static-pd 2P:6D": splits[BASELINE_SPLIT],
            "distserve": self._run(p, "distserve", "distserve", self._setup(k), replan="restart"),
            "autoscaler": self._run(p, "autoscaler", "distserve", self._setup(k), replan="autoscaler"),
            "static-pd best": {**splits[best], "system": "static-pd best"},
            "fluidtoken": self._run(p, "fluidtoken", "fluidtoken", self._setup(k)),
            "fluidpd": self._run(p, "fluidpd", "fluidpd", self._setup(k)),
        }

    def _setup(self, prefill_workers: int, **policy) -> Setup:
        return setup(prefill_workers, self.seed, self.model, **policy)

    def _run(self, p: Point, system: str, policy: str, base: Setup, **kw) -> dict:
        self.bar.set_postfix_str(f"{p.wl.name} x{p.scale:g} {system}", refresh=False)
        res = run_system(p.trace, policy, base, history=p.history, keep_requests=True, **kw)
        self.bar.update(1)
        if p.headline and system == "fluidpd":
            self.kept[f"timeline_{p.wl.name}_fluidpd"] = res
        return row(res, system, base.policy.prefill_workers, p.trace, p.wl, self.window_s)


def setting(window: float, seed: int, quick: bool, model: str = MODEL) -> dict:
    """Table 1's setting, as its JSON records it."""
    base = setup(model=model)
    return {
        "model": model,
        "dtype": DTYPE,
        "gpu": GPU,
        "workers": N_WORKERS,
        "tp": 1,
        "jitter_cv": JITTER_CV,
        "slo_ttft_s": SLO.ttft_s,
        "slo_tbt_s": SLO.tbt_s,
        "weight_bytes": base.model.weight_bytes,
        "kv_tokens_per_worker": base.kv_blocks(base.roofline()) * SimConfig().block_size,
        "ttft_justification": ttft_justification(model),
        "window_s": window,
        "seed": seed,
        "quick": quick,
        "phase_shift": PHASE_SHIFT,
        "baseline_split": split_label(BASELINE_SPLIT),
        "systems": list(SYSTEMS),
    }
