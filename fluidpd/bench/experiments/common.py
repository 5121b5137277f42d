"""What the experiments share: the seed's cluster and SLOs (table1's docstring gives the reasons),
the workloads, tuning on history and the per-run result rows."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fluidpd.bench.simrun import attainment_between
from fluidpd.core.metrics import Slo
from fluidpd.placement.plan import CHUNK_BUDGETS
from fluidpd.policy.base import PolicyConfig
from fluidpd.sim.config import SimConfig
from fluidpd.sim.run import Setup, SimResult
from fluidpd.specs.hardware import get_hardware
from fluidpd.specs.models import get_model
from fluidpd.workload import load_trace, phase_shift
from fluidpd.workload.trace import Trace

MODEL, DTYPE, GPU = "llama-3.3-70b", "fp8", "h100"
N_WORKERS = 8
JITTER_CV = 0.05
SLO = Slo(ttft_s=2.0, tbt_s=0.040)
BASELINE_SPLIT = 2  # the seed's static 2P:6D
SPLITS = tuple(range(1, N_WORKERS))
FULL_WINDOW_S, QUICK_WINDOW_S = 600.0, 300.0
PHASE_SHIFT = {"surge_rate": 5.0, "wave_rate": 1.0, "cycles": 2}


@dataclass(frozen=True, slots=True)
class Workload:
    """One evaluated workload: its rate scales (full and quick), the headline scale and its windows."""

    name: str
    scales: tuple[float, ...]
    quick_scales: tuple[float, ...]
    headline: float
    about: str

    def trace(self, scale: float, window_s: float, seed: int, start_s: float = 0.0) -> Trace:
        """The evaluated window: `window_s` seconds from `start_s` of the rate-scaled workload."""
        if self.name == "phase_shift":
            cycles = PHASE_SHIFT["cycles"]
            return phase_shift(
                window_s / (2 * cycles),
                surge_rate=PHASE_SHIFT["surge_rate"] * scale,
                wave_rate=PHASE_SHIFT["wave_rate"] * scale,
                cycles=cycles,
                seed=seed,
            )
        return load_trace(self.name).scale_rate(scale).window(start_s, window_s)

    def start(self, window_s: float) -> float:
        """Where the evaluated window starts: after one history window (the phase shift: at 0)."""
        return 0.0 if self.name == "phase_shift" else window_s

    def history(self, scale: float, window_s: float, seed: int) -> Trace:
        """What tuning may look at: the window before the evaluated one, or for the synthetic phase
        shift another draw of the same process (another seed)."""
        if self.name == "phase_shift":
            return self.trace(scale, window_s, seed + 1)
        return self.trace(scale, window_s, seed)

    def phases(self, window_s: float) -> list[tuple[float, float, str]]:
        """(start, end, label) of every phase; one span for the Azure traces."""
        if self.name != "phase_shift":
            return [(0.0, window_s, "all")]
        n = 2 * PHASE_SHIFT["cycles"]
        d = window_s / n
        return [(i * d, (i + 1) * d, f"{'surge' if i % 2 == 0 else 'wave'}{i // 2 + 1}") for i in range(n)]


WORKLOADS = {
    "azure_code": Workload("azure_code", (0.5, 1.0, 1.5, 2.0), (1.0, 2.0), 1.0, "Azure code (bursty)"),
    "azure_conv": Workload("azure_conv", (1.0, 1.5, 2.0, 3.0), (1.5, 3.0), 1.5, "Azure conversation"),
    "phase_shift": Workload(
        "phase_shift", (0.6, 0.8, 1.0, 1.2), (0.8, 1.0), 1.0, "phase shift: summarisation surge / generation wave"
    ),
}


def setup(prefill_workers: int = BASELINE_SPLIT, seed: int = 0, model: str = MODEL, **policy) -> Setup:
    """The evaluation cluster of `model` with a given static split (and PolicyConfig overrides)."""
    return Setup(
        get_model(model, DTYPE),
        get_hardware(GPU),
        SLO,
        SimConfig(n_workers=N_WORKERS, step_jitter_cv=JITTER_CV, seed=seed),
        PolicyConfig(prefill_workers=prefill_workers, **policy),
    )


def check_fits(model: str) -> None:
    """A ValueError saying why, unless `model` fits one worker of the cluster (one GPU, no TP)."""
    s = setup(model=model)
    try:
        s.kv_blocks(s.roofline())
    except ValueError as exc:
        raise ValueError(
            f"{exc}: the experiments run one {model} {DTYPE} worker per GPU ({N_WORKERS} x {GPU}, no tensor "
            f"or expert parallelism); `fluidpd simulate --tp N --ep N` simulates larger workers"
        ) from None


def ttft_justification(model: str = MODEL) -> dict:
    """The p99 azure_code prompt and its prefill time alone on one worker (latency model)."""
    p99 = int(np.percentile(load_trace("azure_code").prompt_len, 99))
    t = setup(model=model).roofline().prefill_time(p99)
    return {
        "p99_prompt_tokens": p99,
        "prefill_alone_s": t,
        "slo_ttft_s": SLO.ttft_s,
        "queueing_headroom_s": SLO.ttft_s - t,
    }


def split_label(k: int) -> str:
    return f"{k}P:{N_WORKERS - k}D"


def best_split(rows: dict[int, dict]) -> int:
    """The static split with the best joint attainment (ties: strict attainment, then P99 TTFT)."""
    return max(rows, key=lambda k: (rows[k]["attainment"], rows[k]["strict_attainment"], -rows[k]["ttft_p99_s"]))


def headline_of(wl: Workload, scales: tuple[float, ...]) -> float:
    """The scale among `scales` nearest the workload's headline rate (in ratio; ties: the lower)."""
    return min(scales, key=lambda s: (abs(math.log(s / wl.headline)), s))


def tune_on_history(history: Trace, placement: str, seed: int, tick=None, model: str = MODEL) -> dict:
    """What the deployable systems get tuned on: the distserve split, chunked's budget and chunked
    late-last's (searched under its own order), each the best by joint attainment on the history
    window (ties: the middle of the best)."""
    from fluidpd.placement.plan import best_chunk_budget, fixed_split, split_of
    from fluidpd.placement.result import load_placement

    base = setup(BASELINE_SPLIT, seed, model)
    if placement == "auto":
        k, scores = fixed_split(history, base)
    else:
        k, scores = split_of(load_placement(placement), N_WORKERS), {}
    if tick:
        tick(len(SPLITS))
    budget, chunked = best_chunk_budget(history, base, CHUNK_BUDGETS)
    if tick:
        tick(len(CHUNK_BUDGETS))
    late, late_scores = best_chunk_budget(history, base, CHUNK_BUDGETS, policy="chunked-late-last")
    if tick:
        tick(len(CHUNK_BUDGETS))
    return {
        "split": k,
        "split_label": split_label(k),
        "split_attainment": {split_label(j): v for j, v in scores.items()},
        "chunk_budget": budget,
        "chunk_budget_attainment": chunked,
        "chunk_budget_late_last": late,
        "chunk_budget_late_last_attainment": late_scores,
    }


def transitions(result: SimResult) -> list[dict]:
    """Every role transition of the run's policy, JSON-ready."""
    return [
        {
            "worker": t.worker,
            "from": t.src_role.value,
            "to": t.dst_role.value,
            "reason": t.reason,
            "began_s": t.began_s,
            "total_s": t.total_s if t.done else None,
            "phases_s": t.durations(),
        }
        for t in getattr(result.cluster.policy, "transitions", [])
    ]


def row(result: SimResult, system: str, k: int, trace: Trace, wl: Workload, window_s: float) -> dict:
    """One system's result row: its summary, transitions, replans and (phase shift) per-phase attainment."""
    out = {"system": system, "policy": result.policy, "split": split_label(k), **result.summary}
    if hasattr(result.cluster.policy, "transitions"):
        out["transitions"] = transitions(result)
    if "replans" in result.summary:
        out["replans"] = result.summary["replans"]
    if wl.name == "phase_shift":
        out["phase_attainment"] = {
            label: attainment_between(result, trace, SLO, a, b) for a, b, label in wl.phases(window_s)
        }
    return out
