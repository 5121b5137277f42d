"""The KV-reuse table's rows (`<policy>+<router>`), what each imitates, and their tuning on history."""

from __future__ import annotations

from concurrent.futures import Executor
from dataclasses import dataclass, replace

from fluidpd.bench.experiments.kv.setting import N_WORKERS, setup
from fluidpd.placement.plan import CHUNK_BUDGETS, MIN_HISTORY, best_chunk_budget, fixed_split
from fluidpd.policy.routers import ROUTERS
from fluidpd.policy.routers.kv_affinity import KvAffinity
from fluidpd.sim.run import Setup
from fluidpd.workload.trace import Trace

ROUTER_NAMES = ("round-robin", "shortest-queue", "sglang-cache-aware", "dynamo-kv", "llm-d")
POLICY_LABELS = {
    "chunked": "Sarathi-Serve chunked prefill",
    "chunked-late-last": "Sarathi-Serve chunked prefill, late-last queue order",
    "static-pd": "DistServe-style static P/D",
}
BUDGET_KEYS = {"chunked": "chunk_budget", "chunked-late-last": "chunk_budget_late_last"}  # the tuning's keys
QUICK_CHUNK_BUDGETS = (256, 512, 1024)  # full: the placement search's CHUNK_BUDGETS
QUICK_SPLIT_SPAN = 1  # quick: splits tried either side of the one tuned at the workload's nearest load
REFERENCE = "static-pd+cache-affinity"  # pure prefix affinity: the hot_prefix reference row
HOST_SUFFIX = "+host"  # a row's name with the host KV tier


@dataclass(frozen=True, slots=True)
class System:
    """One row: a policy with a router; `baseline` rows set the saturation load."""

    policy: str
    router: str
    baseline: bool = True
    host_gib: float = 0.0  # a host KV tier of this many GiB a worker (0: none)
    pooled: bool = False  # ... one per node

    @property
    def name(self) -> str:
        return f"{self.policy}+{self.router}" + (HOST_SUFFIX if self.host_gib else "")

    def with_host(self, gib: float, pooled: bool) -> System:
        """The same row with a host KV tier (every row of the tiered table gets the same one)."""
        return replace(self, host_gib=gib, pooled=pooled)

    @property
    def imitates(self) -> str:
        if self.policy == "fluidpd":
            what = KvAffinity.imitates if self.router == KvAffinity.name else "ablation: fluidpd without KV affinity"
            return f"FluidPD (FluidToken + FluidRole); {what}"
        return f"{POLICY_LABELS[self.policy]}; router: {ROUTERS.get(self.router).imitates}"

    def setup(self, tuned: dict, seed: int) -> Setup:
        """Its cluster as tuned on history: static-pd at the searched split (fluidpd starts there),
        chunked and chunked-late-last each at the token budget searched under it."""
        if self.policy in BUDGET_KEYS:
            s = setup(tuned["split"], seed, chunk_budget=tuned[BUDGET_KEYS[self.policy]], router=self.router)
        else:
            s = setup(tuned["split"], seed, router=self.router)
        if not self.host_gib:
            return s
        return replace(s, sim=replace(s.sim, kv_offloading_size=self.host_gib, kv_offloading_pooled=self.pooled))


BASELINES = tuple(System(p, r) for p in ("chunked", "chunked-late-last", "static-pd") for r in ROUTER_NAMES)
FLUID = (System("fluidpd", "shortest-queue", False), System("fluidpd", KvAffinity.name, False))
SYSTEMS = (*BASELINES, *FLUID)
REFERENCE_SYSTEM = System("static-pd", "cache-affinity", False)


def systems_for(workload: str) -> tuple[System, ...]:
    """The rows of a workload: every baseline, fluidpd twice, and on hot_prefix the pure-affinity reference."""
    return (*SYSTEMS, REFERENCE_SYSTEM) if workload == "hot_prefix" else SYSTEMS


def tune(history: Trace, seed: int, quick: bool, near: int | None = None, pool: Executor | None = None) -> dict:
    """What every system is tuned to on the history window: the P/D split the placement search picks
    (`fixed_split`: static-pd at each split, best joint attainment; every split, or with `near` only
    near-1..near+1) and the token budgets of chunked and chunked-late-last, each searched under its
    own policy (`best_chunk_budget`: best joint attainment over CHUNK_BUDGETS, quick:
    QUICK_CHUNK_BUDGETS; ties: the middle one). Each policy's own default router. A history under
    MIN_HISTORY requests is searched all the same and flagged. With `pool` the three searches run
    side by side."""
    short = len(history) < MIN_HISTORY
    budgets = QUICK_CHUNK_BUDGETS if quick else CHUNK_BUDGETS
    searches = (
        (_split_search, history, seed, near_splits(near)),
        (_budget_search, history, seed, budgets, "chunked"),
        (_budget_search, history, seed, budgets, "chunked-late-last"),
    )
    if pool is None:
        (k, splits), (b, scores), (late, late_scores) = (f(*a) for f, *a in searches)
    else:
        futures = [pool.submit(f, *a) for f, *a in searches]
        (k, splits), (b, scores), (late, late_scores) = (f.result() for f in futures)
    return {
        "split": k,
        "split_label": f"{k}P:{N_WORKERS - k}D",
        "split_attainment": splits,
        "chunk_budget": b,
        "chunk_budget_attainment": scores,
        "chunk_budget_late_last": late,
        "chunk_budget_late_last_attainment": late_scores,
        "short_history": short,
        "best_tuned_attainment": max(max(splits.values()), max(scores.values()), max(late_scores.values())),
    }


def _split_search(history: Trace, seed: int, splits: list[int] | None) -> tuple[int, dict[int, float]]:
    # pool tasks take plain data: a Setup does not pickle (HardwareSpec holds a mappingproxy)
    return fixed_split(history, setup(2, seed), splits, min_history=0)


def _budget_search(history: Trace, seed: int, budgets: tuple[int, ...], policy: str) -> tuple[int, dict[int, float]]:
    return best_chunk_budget(history, setup(2, seed), budgets, min_history=0, policy=policy)


def near_splits(near: int | None) -> list[int] | None:
    """The splits a search tries: all (None), or `near` and its neighbours within 1..N_WORKERS-1."""
    if near is None:
        return None
    return list(range(max(1, near - QUICK_SPLIT_SPAN), min(N_WORKERS - 1, near + QUICK_SPLIT_SPAN) + 1))


def tuning_runs(quick: bool, near: int | None = None) -> int:
    """Simulations one tuning takes."""
    splits = near_splits(near)
    budgets = QUICK_CHUNK_BUDGETS if quick else CHUNK_BUDGETS
    return (N_WORKERS - 1 if splits is None else len(splits)) + len(BUDGET_KEYS) * len(budgets)
