"""Datacenter traffic from a real trace: independent user populations, each drawing its arrivals and
lengths from the trace and keeping its own sessions and system prompts, mixed at a target rate over
hours under a daily cycle (no time compression).

Every population sends an equal share of round(rate * duration) requests. Its arrival gaps are a block
bootstrap of the source's inter-arrival gaps (runs of BOOT_BLOCK consecutive gaps, so its bursts keep
their shape), stretched to fill the window at the population's rate; its (prompt, output) pairs are the
source's, drawn with replacement (`datacenter_population`). Time is then warped by the daily cycle,
rate(t) proportional to 1 + A cos(2 pi (h(t) - peak_hour) / 24) at hour of day h(t) = start_hour + t/3600,
normalised so the window's mean rate is the target (a sinusoid: none of the shipped traces spans a day).
Block ids (ID_BLOCK tokens) follow `datacenter_ids`.
"""

from __future__ import annotations

import numpy as np

from fluidpd.workload.datacenter_config import DatacenterConfig
from fluidpd.workload.datacenter_ids import ID_BLOCK, request_ids
from fluidpd.workload.datacenter_population import Population, population
from fluidpd.workload.trace import Trace


def datacenter(source: Trace, cfg: DatacenterConfig, seed: int = 0) -> Trace:
    """cfg.hours of traffic at cfg.rate req/s from `source`'s arrivals and lengths (see the module doc)."""
    if len(source) < 2 or source.duration_s <= 0:
        raise ValueError(f"source trace {source.name!r} needs at least 2 requests over a positive span")
    k = cfg.n_populations
    total = round(cfg.rate * cfg.duration_s)
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(k)]
    pops = [population(source, total // k + (p < total % k), cfg, rngs[p]) for p in range(k)]
    return _merge(pops, cfg, f"datacenter_{source.name}")


def _merge(pops: list[Population], cfg: DatacenterConfig, name: str) -> Trace:
    """The populations' requests in one arrival order; sessions, chains and system prompts renumbered globally."""
    arrival = np.concatenate([p.arrival_s for p in pops])
    order = np.argsort(arrival, kind="stable")
    sessions = np.cumsum([0] + [p.n_sessions for p in pops])
    session = np.concatenate([np.where(p.session >= 0, p.session + s, -1) for p, s in zip(pops, sessions)])
    prompt = np.concatenate([p.prompt_len for p in pops])[order]
    output = np.concatenate([p.output_len for p in pops])[order]
    ids = request_ids(pops, cfg.prefixes, order, prompt + output) if cfg.block_ids else None
    return Trace(
        name,
        arrival[order],
        prompt,
        output,
        ids,
        ID_BLOCK if ids is not None else None,
        cfg.duration_s,
        session[order],
        np.concatenate([p.think_s for p in pops])[order],
    )
