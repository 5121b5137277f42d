"""The scale experiment's runs: Table 1's deployable systems on clusters of 8 to 1,024 GPUs, each
cluster offered the same load per GPU from the datacenter generator."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace

from tqdm import tqdm

from fluidpd.bench.experiments.common import BASELINE_SPLIT, JITTER_CV, N_WORKERS, SLO, setup, tune_on_history
from fluidpd.bench.experiments.scale.clock import ControlClock
from fluidpd.policy.registry import POLICIES
from fluidpd.sim.run import Setup, SimResult, simulate
from fluidpd.workload.registry import load_trace
from fluidpd.workload.trace import Trace

# system -> (policy, how its split is chosen): "fixed" is the seed's 2P:6D ratio, "tuned" the split
# searched on the 8-GPU history window, scaled to the cluster
SYSTEMS = {
    "colocated": ("colocated", "fixed"),
    "chunked": ("chunked", "fixed"),
    "static-pd 2P:6D": ("static-pd", "fixed"),
    "static-pd tuned": ("static-pd", "tuned"),
    "fluidtoken": ("fluidtoken", "tuned"),
    "fluidpd": ("fluidpd", "tuned"),
    "fluidpd-pools": ("fluidpd-pools", "tuned"),
}
LABELS = {
    "colocated": "vLLM-style continuous batching",
    "chunked": "Sarathi-Serve chunked prefill, token budget tuned on the 8-GPU history",
    "static-pd 2P:6D": "the seed's P/D baseline: a quarter of the workers prefill",
    "static-pd tuned": "DistServe's split searched on the 8-GPU history, scaled (no replanning)",
    "fluidtoken": "FluidToken only, from the tuned split",
    "fluidpd": "FluidToken + FluidRole, one coordinator, from the tuned split",
    "fluidpd-pools": "FluidPD in pools of 64 workers behind a router tier, from the tuned split",
}
GPUS, QUICK_GPUS = (8, 64, 256, 1024), (8, 64, 256)
WINDOW_S, QUICK_WINDOW_S = 120.0, 60.0
# a small cluster's window is stretched to hold this many requests: one population's arrivals are as
# bursty as the trace, and a 2-minute sample of them measures the burst, not the system
MIN_REQUESTS, QUICK_MIN_REQUESTS = 10_000, 3_000
RATE_PER_GPU = 0.32  # Table 1's headline load (azure_code as recorded on 8 GPUs: 2.57 req/s) per GPU
POPULATION_GPUS = 8  # one user population per node's worth of load: populations grow with the cluster
HOST_TIER_GIB = 64.0  # host memory per worker for evicted KV, pooled per node


@dataclass(frozen=True, slots=True)
class ScaleSetting:
    """What every cluster size shares: the load per GPU, its source trace, the windows and the seed."""

    source: str = "azure_code"
    rate_per_gpu: float = RATE_PER_GPU
    window_s: float = WINDOW_S
    min_requests: int = MIN_REQUESTS
    seed: int = 0
    host_tier_gib: float = HOST_TIER_GIB

    def window(self, gpus: int) -> float:
        """Seconds evaluated on `gpus`: `window_s`, or longer where that holds under `min_requests`."""
        return max(self.window_s, self.min_requests / (self.rate_per_gpu * gpus))

    def trace(self, gpus: int, seed: int | None = None) -> Trace:
        """What `gpus` are offered: `window(gpus)` seconds of the generator, exactly rate x span requests
        (so every size gets the same load per GPU); `seed` another draw (the history tuning looks at)."""
        span = self.window(gpus)
        return load_trace(
            "datacenter",
            rate=self.rate_per_gpu * gpus,
            seed=self.seed if seed is None else seed,
            source=self.source,
            hours=span / 3600.0,
            population_rate=self.rate_per_gpu * POPULATION_GPUS,
        )

    def setup(self, gpus: int, prefill_workers: int, **policy) -> Setup:
        base = setup(prefill_workers, self.seed)
        sim = replace(
            base.sim,
            n_workers=gpus,
            gpus_per_node=8,
            step_jitter_cv=JITTER_CV,
            kv_offloading_size=self.host_tier_gib,
            kv_offloading_pooled=True,
        )
        return replace(base, sim=sim, policy=replace(base.policy, prefill_workers=prefill_workers, **policy))


def scaled_split(k: int, gpus: int) -> int:
    """`k` prefill workers of N_WORKERS, as a share of `gpus` (at least one of each role)."""
    return min(gpus - 1, max(1, round(k * gpus / N_WORKERS)))


@dataclass
class ScaleRun:
    """A scale experiment in progress: its setting, systems, progress bar and results."""

    setting: ScaleSetting
    systems: tuple[str, ...]
    bar: tqdm
    tuned: dict = field(default_factory=dict)

    def tune(self) -> dict:
        """The split and chunk budget, searched on the 8-GPU cluster's history: another draw of the
        same generator (another seed), as Table 1 tunes the phase shift."""
        self.bar.set_postfix_str("tuning on the 8-GPU history", refresh=False)
        history = self.setting.trace(N_WORKERS, self.setting.seed + 1)
        self.tuned = tune_on_history(history, "auto", self.setting.seed)
        return self.tuned

    def size(self, gpus: int) -> dict:
        """Every system on one cluster size."""
        trace = self.setting.trace(gpus)
        span = self.setting.window(gpus)
        if len(trace) == 0:
            raise ValueError(f"{gpus} GPUs: the {span:g} s window holds no requests")
        rows = {s: self.run(s, gpus, trace, span) for s in self.systems}
        return {"gpus": gpus, "window_s": span, "requests": len(trace), "rate": len(trace) / span, "systems": rows}

    def run(self, system: str, gpus: int, trace: Trace, span: float) -> dict:
        policy, split = SYSTEMS[system]
        k = BASELINE_SPLIT if split == "fixed" else self.tuned["split"]
        extra = {"chunk_budget": self.tuned["chunk_budget"]} if policy == "chunked" else {}
        base = self.setting.setup(gpus, scaled_split(k, gpus), **extra)
        self.bar.set_postfix_str(f"{gpus} GPUs {system}", refresh=False)
        clock = ControlClock()
        t0 = time.perf_counter()
        res = simulate(trace, policy, base, before_run=clock.attach)
        self.bar.update(1)
        return row(res, system, gpus, base, span, clock, time.perf_counter() - t0)


def row(res: SimResult, system: str, gpus: int, base: Setup, window_s: float, clock: ControlClock, wall: float) -> dict:
    """One system at one size: attainment, tails, goodput per GPU, switches, KV across nodes, control CPU."""
    s = res.summary
    goodput = s["attainment"] * s["requests"] / window_s
    return {
        "system": system,
        "what": LABELS[system],
        "prefill_workers": base.policy.prefill_workers,
        "requests": s["requests"],
        "completed": s["completed"],
        "attainment": s["attainment"],
        "strict_attainment": s["strict_attainment"],
        "ttft_p99_s": s["ttft_p99_s"],
        "tbt_p99_s": s["tbt_p99_s"],
        "goodput_rps": goodput,
        "goodput_per_gpu": goodput / gpus,
        "role_switches": s["role_switches"],
        "switches_per_hour": s["role_switches"] * 3600.0 / window_s,
        "kv_bytes_moved": s["kv_bytes_moved"],
        "kv_bytes_cross_node": res.cluster.kv_bytes_cross_node,
        **clock.summary(window_s, base.policy.tick_s),
        "sim_wall_s": wall,
    }


def run_scale(
    gpus: tuple[int, ...], setting: ScaleSetting, systems: tuple[str, ...] | None = None, progress: bool = True
) -> dict:
    """Every system at every size, JSON-ready (each run's summary is kept, never its cluster)."""
    names = tuple(systems or (s for s in SYSTEMS if SYSTEMS[s][0] in POLICIES))
    for s in names:
        if s not in SYSTEMS:
            raise ValueError(f"unknown system {s!r}; choose from {', '.join(SYSTEMS)}")
    if not gpus or min(gpus) < 2:
        raise ValueError("cluster sizes must be >= 2 GPUs")
    t_start = time.perf_counter()
    bar = tqdm(total=1 + len(gpus) * len(names), desc="scale", unit="run", file=sys.stderr, disable=not progress)
    state = ScaleRun(setting, names, bar)
    tuned = state.tune()
    bar.update(1)
    sizes = {str(n): state.size(n) for n in sorted(gpus)}
    bar.close()
    results: dict = {
        "setting": {
            "source": setting.source,
            "rate_per_gpu": setting.rate_per_gpu,
            "window_s": setting.window_s,
            "min_requests": setting.min_requests,
            "seed": setting.seed,
            "host_tier_gib_per_worker": setting.host_tier_gib,
            "population_gpus": POPULATION_GPUS,
            "slo_ttft_s": SLO.ttft_s,
            "slo_tbt_s": SLO.tbt_s,
            "systems": list(names),
        },
        "tuned_on_8_gpu_history": tuned,
        "sizes": sizes,
    }
    results["goal"] = goodput_goal(results)
    results["wall_s"] = time.perf_counter() - t_start
    return results


def goodput_goal(results: dict) -> dict:
    """Issue 54's goal: fluidpd's goodput per GPU at the largest size within 5% of its value at the smallest."""
    sizes = sorted(results["sizes"].values(), key=lambda r: r["gpus"])
    small, large = sizes[0], sizes[-1]
    if "fluidpd" not in small["systems"] or small is large:
        return {"met": None}
    a, b = small["systems"]["fluidpd"]["goodput_per_gpu"], large["systems"]["fluidpd"]["goodput_per_gpu"]
    ratio = b / a if a > 0 else float("nan")
    return {"small_gpus": small["gpus"], "large_gpus": large["gpus"], "ratio": ratio, "met": bool(ratio >= 0.95)}
