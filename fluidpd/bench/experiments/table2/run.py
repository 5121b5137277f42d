"""Table 2's run: FluidRole's phases timed on the phase-shift workload, set against modelled restarts."""

from __future__ import annotations

import statistics
import time

from fluidpd.bench.experiments.common import (
    BASELINE_SPLIT,
    DTYPE,
    FULL_WINDOW_S,
    GPU,
    MODEL,
    N_WORKERS,
    PHASE_SHIFT,
    WORKLOADS,
    setup,
    transitions,
)
from fluidpd.bench.restarts import SEED_FLUIDROLE_S, SEED_TABLE2, SEED_WEIGHT_BYTES, RestartModel
from fluidpd.bench.simrun import run_instrumented
from fluidpd.policy.fluidrole import PHASES
from fluidpd.policy.view import Role
from fluidpd.sim.run import SimResult
from fluidpd.specs.models import get_model
from fluidpd.workload.trace import Trace


def forced_schedule(window_s: float) -> tuple[tuple[float, Role], ...]:
    """Mid-phase admin switches on the phase-shift workload: decode -> prefill in every surge,
    prefill -> decode in every wave."""
    return tuple(
        ((a + b) / 2, Role.PREFILL if label.startswith("surge") else Role.DECODE)
        for a, b, label in WORKLOADS["phase_shift"].phases(window_s)
    )


def run_table2(window_s: float | None = None, seed: int = 0) -> dict:
    """FluidRole phase durations (simulated, phase-shift workload) vs modelled restarts."""
    wl = WORKLOADS["phase_shift"]
    window = window_s or FULL_WINDOW_S  # four 150 s phases, as in Table 1
    trace = wl.trace(wl.headline, window, seed)
    t0 = time.perf_counter()
    result, forced = _fluidrole_run(trace, window, seed)
    wall = time.perf_counter() - t0
    done = [t for t in result.cluster.policy.transitions if t.done]
    if not done:
        raise RuntimeError("no FluidRole transition completed, even forced")
    med = medians(done)
    by_direction = _by_direction(done)
    # The seed's Table 2 row is a decode worker turned prefill worker (the case that relieves a
    # prefill backlog); a prefill worker turning decode usually has nothing to drain.
    fluid_total = by_direction.get("decode->prefill", {"median_s": med})["median_s"]["total"]
    model = RestartModel()
    fp8 = get_model(MODEL, DTYPE).weight_bytes
    fp16 = get_model(MODEL, "fp16").weight_bytes
    return {
        "setting": _setting(window, len(trace), seed),
        "fluidrole": {
            "forced": forced,
            "transitions": len(done),
            "median_s": med,
            "by_direction": by_direction,
            "table_total_s": fluid_total,
            "max_total_s": max(t.total_s for t in done),
            "min_total_s": min(t.total_s for t in done),
            "details": transitions(result),
            "sim_wall_s": wall,
        },
        "restart_model": _restart_model(model),
        "fp8": {"weight_bytes": fp8, "rows": restart_rows(model, fp8, fluid_total, med["total"])},
        "fp16": {"weight_bytes": fp16, "rows": restart_rows(model, fp16, fluid_total, med["total"])},
        "seed_140gb_model": {
            "weight_bytes": SEED_WEIGHT_BYTES,
            "rows": restart_rows(model, SEED_WEIGHT_BYTES, fluid_total, med["total"]),
        },
        "seed_table": [_mechanism(m, w, c, tot, tot / SEED_FLUIDROLE_S) for m, (w, c, tot) in SEED_TABLE2.items()],
    }


def _fluidrole_run(trace: Trace, window: float, seed: int) -> tuple[SimResult, bool]:
    """FluidPD on the trace; again with admin switches mid-phase when the pressure indices trigger
    no decode -> prefill switch (Table 2's row is one). Returns (the run, whether it was forced)."""
    result = run_instrumented(trace, "fluidpd", setup(BASELINE_SPLIT, seed))
    if any(t.dst_role is Role.PREFILL for t in result.cluster.policy.transitions if t.done):
        return result, False
    return run_instrumented(trace, "fluidpd", setup(BASELINE_SPLIT, seed), forced=forced_schedule(window)), True


def medians(done: list) -> dict[str, float]:
    """The median of every FluidRole phase, and of the total, over completed transitions."""
    med = {p: statistics.median(t.durations()[p] for t in done) for p in PHASES}
    med["total"] = statistics.median(t.total_s for t in done)
    return med


def _by_direction(done: list) -> dict[str, dict]:
    out = {}
    for src, dst in ((Role.DECODE, Role.PREFILL), (Role.PREFILL, Role.DECODE)):
        ts = [t for t in done if t.src_role is src and t.dst_role is dst]
        if ts:
            out[f"{src.value}->{dst.value}"] = {"count": len(ts), "median_s": medians(ts)}
    return out


def restart_rows(model: RestartModel, weight_bytes: float, fluid_total: float, all_total: float) -> list[dict]:
    """Every modelled restart for a model of `weight_bytes`, then FluidRole's two rows (its
    decode -> prefill median, the table's reference, and the median of all transitions)."""
    rows = [_mechanism(m, w, c, tot, tot / fluid_total) for m, (w, c, tot) in model.costs(weight_bytes).items()]
    rows.append(_mechanism("FluidRole decode->prefill (simulated)", 0.0, 0.0, fluid_total, 1.0))
    rows.append(_mechanism("FluidRole, all transitions (simulated)", 0.0, 0.0, all_total, all_total / fluid_total))
    return rows


def _mechanism(name: str, reload_s: float, rebuild_s: float, total_s: float, vs_fluidrole: float) -> dict:
    return {
        "mechanism": name,
        "weight_reload_s": reload_s,
        "context_rebuild_s": rebuild_s,
        "total_s": total_s,
        "vs_fluidrole": vs_fluidrole,
    }


def _setting(window: float, requests: int, seed: int) -> dict:
    return {
        "model": MODEL,
        "gpu": GPU,
        "workers": N_WORKERS,
        "workload": "phase_shift",
        "phase_shift": PHASE_SHIFT,
        "window_s": window,
        "requests": requests,
        "seed": seed,
        "phase_constants_s": {p: setup().sim.phase_s(p) for p in PHASES[1:]},
    }


def _restart_model(model: RestartModel) -> dict:
    return {
        "disk_bw_bytes_s": model.disk_bw,
        "shm_bw_bytes_s": model.shm_bw,
        "vm_provision_s": model.vm_provision_s,
        "cold_context_s": model.cold_context_s,
        "warm_context_s": model.warm_context_s,
        "autoscaler_context_s": model.autoscaler_context_s,
    }
