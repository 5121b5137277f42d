"""`fluidpd serve --placement auto|FILE`: the starting prefill/decode split of a served cluster.

`auto` runs the placement search of `fluidpd simulate --placement auto` on this host's profile
(`--gpu cpu-host`): every split of the `--workers` simulated under static-pd on `--placement-history`
seconds of `--placement-trace` at `--placement-rate-scale`, with the served SLOs, the highest joint
attainment kept; on `--backend ray` with workers on several nodes, each simulated worker sits on
its bundle's node and KV crosses nodes at the bandwidth measured at start. FILE: a `fluidpd place
--out` JSON, whose prefill share of GPUs is kept.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from fluidpd.core.argtypes import positive


def add_placement_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--placement", help="starting P/D split: auto (search on this host's profile) or a fluidpd place JSON"
    )
    p.add_argument(
        "--placement-trace", default="azure_conv", help="workload --placement auto fits (default: azure_conv)"
    )
    p.add_argument("--placement-rate-scale", type=positive(float), default=0.05, help="its rate scale (default: 0.05)")
    p.add_argument(
        "--placement-history", type=positive(float), default=600.0, help="seconds of it searched (default: 600)"
    )


def placed_runtime(args: argparse.Namespace, engine, runtime, links=None):
    """`runtime` with the prefill workers `--placement` picks (unchanged without the flag); a line
    saying why. `links` (a Ray placement's measured RayLinks): the search puts each worker on its
    bundle's node and moves KV between nodes at the measured bandwidth."""
    if not args.placement:
        return runtime, None
    if runtime.workers < 2 or runtime.policy not in ("static-pd", "fluidpd", None):
        raise ValueError("--placement sets a prefill/decode split: it needs --workers >= 2 and a P/D policy")
    from fluidpd.cli.simulate import placed_split
    from fluidpd.sim.config import SimConfig
    from fluidpd.sim.run import Setup
    from fluidpd.specs.hardware import get_hardware, shipped_profile
    from fluidpd.specs.models import get_model
    from fluidpd.workload.registry import load_trace

    profile = shipped_profile("cpu-host")
    if profile is None or profile["engine"]["model"] != engine.model:
        raise ValueError(f"--placement auto needs a host profile of {engine.model!r} (fluidpd profile)")
    hw, sim = (
        get_hardware("cpu-host"),
        SimConfig(n_workers=runtime.workers, prefill_kv_fraction=runtime.prefill_kv_fraction),
    )
    if links is not None and links.inter_node_bw is not None:
        hw, sim = replace(hw, internode_bw=links.inter_node_bw), replace(sim, worker_nodes=tuple(links.nodes))
    setup = Setup(
        get_model(profile["model"]["spec"], "fp32"), hw, runtime.slo, sim=sim, policy=replace(runtime.scheduling)
    )
    history = load_trace(args.placement_trace).scale_rate(args.placement_rate_scale)
    history = history.window(0.0, args.placement_history)
    k, how = placed_split(args.placement, history, setup)
    scheduling = replace(runtime.scheduling, prefill_workers=k)
    return replace(runtime, scheduling=scheduling), f"placement: {k}P:{runtime.workers - k}D ({how})"
