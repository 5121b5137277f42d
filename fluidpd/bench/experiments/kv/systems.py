"""The KV-reuse table's rows (`<policy>+<router>`), what each imitates, and their tuning on history."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fluidpd.bench.experiments.kv.setting import N_WORKERS, setup
from fluidpd.bench.simrun import run_instrumented
from fluidpd.placement.plan import MIN_HISTORY, fixed_split, middle_of_best
from fluidpd.policy.routers import ROUTERS
from fluidpd.policy.routers.kv_affinity import KvAffinity
from fluidpd.sim.run import Setup
from fluidpd.workload.trace import Trace

ROUTER_NAMES = ("round-robin", "shortest-queue", "sglang-cache-aware", "dynamo-kv", "llm-d")
POLICY_LABELS = {"chunked": "Sarathi-Serve chunked prefill", "static-pd": "DistServe-style static P/D"}
CHUNK_BUDGETS = (128, 256, 512, 1024, 2048)
QUICK_CHUNK_BUDGETS = (256, 512, 1024)
REFERENCE = "static-pd+cache-affinity"  # pure prefix affinity: the hot_prefix reference row


@dataclass(frozen=True, slots=True)
class System:
    """One row: a policy with a router; `baseline` rows set the saturation load."""

    policy: str
    router: str
    baseline: bool = True

    @property
    def name(self) -> str:
        return f"{self.policy}+{self.router}"

    @property
    def imitates(self) -> str:
        if self.policy == "fluidpd":
            what = KvAffinity.imitates if self.router == KvAffinity.name else "ablation: fluidpd without KV affinity"
            return f"FluidPD (FluidToken + FluidRole); {what}"
        return f"{POLICY_LABELS[self.policy]}; router: {ROUTERS.get(self.router).imitates}"

    def setup(self, tuned: dict, seed: int) -> Setup:
        """Its cluster as tuned on history: static-pd at the searched split (fluidpd starts there),
        chunked at the searched token budget."""
        if self.policy == "chunked":
            return setup(tuned["split"], seed, chunk_budget=tuned["chunk_budget"], router=self.router)
        return setup(tuned["split"], seed, router=self.router)


BASELINES = tuple(System(p, r) for p in ("chunked", "static-pd") for r in ROUTER_NAMES)
FLUID = (System("fluidpd", "shortest-queue", False), System("fluidpd", KvAffinity.name, False))
SYSTEMS = (*BASELINES, *FLUID)
REFERENCE_SYSTEM = System("static-pd", "cache-affinity", False)


def systems_for(workload: str) -> tuple[System, ...]:
    """The rows of a workload: every baseline, fluidpd twice, and on hot_prefix the pure-affinity reference."""
    return (*SYSTEMS, REFERENCE_SYSTEM) if workload == "hot_prefix" else SYSTEMS


def tune(history: Trace, seed: int, quick: bool, tick: Callable[[int], object] | None = None) -> dict:
    """What every system is tuned to on the history window: the P/D split the placement search picks
    (`fixed_split`: static-pd at every split, best joint attainment) and chunked's token budget (best
    joint attainment over the budgets; ties: the middle one). Each policy's own default router."""
    short = len(history) < MIN_HISTORY
    k, splits = _splits(history, seed) if short else fixed_split(history, setup(2, seed))
    if tick:
        tick(N_WORKERS - 1)
    budgets = {}
    for b in QUICK_CHUNK_BUDGETS if quick else CHUNK_BUDGETS:
        budgets[b] = run_instrumented(history, "chunked", setup(2, seed, chunk_budget=b)).summary["attainment"]
        if tick:
            tick(1)
    return {
        "split": k,
        "split_label": f"{k}P:{N_WORKERS - k}D",
        "split_attainment": splits,
        "chunk_budget": middle_of_best(budgets),
        "chunk_budget_attainment": budgets,
        "short_history": short,
        "best_tuned_attainment": max(max(splits.values()), max(budgets.values())),
    }


def _splits(history: Trace, seed: int) -> tuple[int, dict[int, float]]:
    """`fixed_split`'s search without its minimum history (a low-load Claude Code window is short)."""
    scores = {
        k: run_instrumented(history, "static-pd", setup(k, seed)).summary["attainment"] for k in range(1, N_WORKERS)
    }
    return middle_of_best(scores), scores


def tuning_runs(quick: bool) -> int:
    return N_WORKERS - 1 + len(QUICK_CHUNK_BUDGETS if quick else CHUNK_BUDGETS)
