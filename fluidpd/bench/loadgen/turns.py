"""Session results by turn: TTFT, TBT and attainment (the simulator's aggregation), and the prefix cache's
hit rate as the server reports it (cached prompt tokens over prompt tokens)."""

from __future__ import annotations

import math

import numpy as np

from fluidpd.bench.loadgen.aggregate import summarize
from fluidpd.bench.loadgen.closed_loop import TurnResult
from fluidpd.bench.loadgen.requests import BenchResult
from fluidpd.core.metrics import Slo


def hit_rate(results: list[BenchResult]) -> float:
    """Cached prompt tokens over prompt tokens, over the requests whose usage the server reported."""
    rs = [r for r in results if r.ok and r.usage_prompt_tokens]
    prompt = sum(r.usage_prompt_tokens or 0 for r in rs)
    return sum(r.cached_tokens for r in rs) / prompt if prompt else math.nan


def ttft_percentile(results: list[BenchResult], q: float) -> float:
    ttft = [r.token_s[0] - r.send_s for r in results if r.ok]
    return float(np.percentile(ttft, q)) if ttft else math.nan


def with_cache(row: dict, results: list[BenchResult]) -> dict:
    """`row` plus TTFT p95, prompt and cached tokens and the hit rate of `results`."""
    ok = [r for r in results if r.ok]
    row.update(
        {
            "ttft_p95_s": ttft_percentile(results, 95),
            "prompt_tokens": sum(r.usage_prompt_tokens or 0 for r in ok),
            "cached_tokens": sum(r.cached_tokens for r in ok),
            "output_tokens": sum(len(r.token_s) for r in ok),
            "hit_rate": hit_rate(results),
        }
    )
    return row


def by_turn(results: list[TurnResult], slo: Slo) -> list[dict]:
    """One row per turn position (1 = sessions' opening turns)."""
    rows = []
    for k in sorted({r.turn for r in results}):
        rs = [r.result for r in results if r.turn == k]
        rows.append({"turn": k + 1, **with_cache(summarize(rs, slo, f"turn {k + 1}"), rs)})
    return rows


def later_turns(results: list[TurnResult]) -> list[BenchResult]:
    """Turn 2 onwards: the turns that can reuse their session's history."""
    return [r.result for r in results if r.turn > 0]


def session_summary(results: list[TurnResult], slo: Slo, policy: str) -> dict:
    """The `fluidpd simulate` row over every turn, plus hit rates and TTFT of turns 2+ alone."""
    every = [r.result for r in results]
    row = with_cache(summarize(every, slo, policy), every)
    later = later_turns(results)
    row.update(
        {
            "sessions": len({r.session for r in results}),
            "turn2_ttft_p50_s": ttft_percentile(later, 50),
            "turn2_ttft_p95_s": ttft_percentile(later, 95),
            "turn2_hit_rate": hit_rate(later),
        }
    )
    return row
