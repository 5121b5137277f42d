"""Results aggregated the way the simulator does, so the rows compare with `fluidpd simulate`."""

from __future__ import annotations

import itertools

from fluidpd.bench.loadgen.requests import BenchResult
from fluidpd.core.metrics import MetricsCollector, Slo
from fluidpd.core.request import Request


def summarize(results: list[BenchResult], slo: Slo, policy: str) -> dict:
    """The `fluidpd simulate` row for these results (failed requests count as misses)."""
    mc = collect(results, slo)
    row = {"policy": policy, **mc.summary(len(results))}
    row["failed"] = mc.rejected
    return row


def collect(results: list[BenchResult], slo: Slo) -> MetricsCollector:
    """The results as the simulator's metrics (TTFT per request, every gap); failed ones as rejected."""
    mc = MetricsCollector(slo)
    failed = 0
    for r in results:
        if not r.ok:
            failed += 1
            continue
        req = Request(r.index, r.send_s, r.prompt_len, len(r.token_s))
        times = r.token_s
        req.generated = len(times)
        req.first_token_s, req.last_token_s, req.finish_s = times[0], times[-1], max(r.finish_s, times[-1])
        for a, b in itertools.pairwise(times):
            mc.on_gap(b - a)
            req.add_gap(b - a, slo.tbt_s)
        mc.on_finish(req)
    mc.rejected = failed
    return mc


def error_counts(results: list[BenchResult]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in results:
        if r.error:
            out[r.error] = out.get(r.error, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))
