"""One simulation run for the experiments: `fluidpd.sim.run.simulate` with admin role switches.

* the finished requests, kept so attainment can be split by arrival time (phase-shift phases);
* admin role switches at given times (FluidPD.force_role), so FluidRole's phases can be timed on a
  run whose pressure never triggers one on its own.
"""

from __future__ import annotations

import dataclasses

from fluidpd.core.metrics import Slo
from fluidpd.policy import fluidrole
from fluidpd.policy.fluidpd import FluidPD
from fluidpd.policy.registry import POLICIES
from fluidpd.policy.view import Role
from fluidpd.sim.run import Setup, SimResult, simulate
from fluidpd.workload.trace import Trace
from fluidpd.world.events import EventKind


def run_instrumented(
    trace: Trace,
    policy_name: str,
    setup: Setup,
    *,
    keep_requests: bool = False,
    forced: tuple[tuple[float, Role], ...] = (),
    progress=None,
) -> SimResult:
    """Run `trace` under `policy_name` as `simulate` does.

    keep_requests: keep finished Request objects in `result.cluster.metrics.finished`.
    forced: (time s, target role) admin switches; at that time the worker the FluidRole engine
    would pick (cheapest drain / least queued) is switched. One that cannot happen (no eligible
    worker, last of its role) is skipped and listed in `result.summary["forced_skipped"]`.
    """
    if forced and not issubclass(POLICIES.get(policy_name), FluidPD):
        raise ValueError(f"{policy_name} runs no role transitions; cannot force one")
    skipped: list[float] = []

    def schedule_forced(cluster) -> None:
        def force(arg: tuple[float, Role]) -> None:
            at, role = arg
            choose = fluidrole.choose_decode_to_prefill if role is Role.PREFILL else fluidrole.choose_prefill_to_decode
            wid = choose(cluster, lambda w: True)
            try:
                if wid is None:
                    raise ValueError("no worker to switch")
                cluster.policy.force_role(wid, role, cluster)
            except ValueError:
                skipped.append(at)

        for at, role in sorted(forced, key=lambda f: f[0]):
            cluster.loop.at(at, EventKind.CONTROL, force, (at, role))

    result = simulate(
        trace, policy_name, setup, progress, keep_requests=keep_requests, before_run=schedule_forced if forced else None
    )
    if forced:
        result.summary["forced_skipped"] = skipped
    return result


def attainment_between(result: SimResult, trace: Trace, slo: Slo, start_s: float, end_s: float) -> float:
    """Joint attainment of the requests arriving in [start_s, end_s) (needs keep_requests=True);
    unfinished and rejected ones count as misses."""
    finished = result.cluster.metrics.finished
    if finished is None:
        raise ValueError("run with keep_requests=True to split attainment by arrival time")
    n = int(((trace.arrival_s >= start_s) & (trace.arrival_s < end_s)).sum())
    ok = sum(1 for r in finished if start_s <= r.arrival_s < end_s and r.ttft_s <= slo.ttft_s and r.tpot_s <= slo.tbt_s)
    return ok / n if n else float("nan")


def run_system(
    trace: Trace,
    policy: str,
    base: Setup,
    *,
    history: Trace | None = None,
    replan: str | None = None,
    replan_config=None,
    **kw,
) -> SimResult:
    """One system's run; `replan`: "restart" (DistServe's replanning, cold restarts, `replan_config`)
    or "autoscaler" (the SLA planner, warm restarts), each seeded with `history`. The plans made are
    in `result.summary["replans"]`."""
    if replan is None:
        return run_instrumented(trace, policy, base, **kw)
    from fluidpd.bench.restarts import RestartModel
    from fluidpd.placement.autoscaler import SlaPlanner
    from fluidpd.placement.replan import Replanner

    costs = RestartModel().costs(base.model.weight_bytes)
    planner: Replanner
    if replan == "restart":
        planner = Replanner(base, replan_config, costs["cold process restart"][2], history)
    elif replan == "autoscaler":
        planner = SlaPlanner(base, restart_s=costs["warm container restart"][2], history=history)
    else:
        raise ValueError(f"unknown replanning {replan!r}")
    res = simulate(trace, policy, base, keep_requests=True, before_run=planner.attach)
    res.summary["replans"] = [dataclasses.asdict(p) for p in planner.replans]
    return res
