"""One row of the KV-reuse table from a simulation: hit rates, turn-2+ TTFT, TBT, attainment, KV moved, load."""

from __future__ import annotations

import numpy as np

from fluidpd.sim.run import SimResult


def kv_row(res: SimResult, system: str, imitates: str, follow: np.ndarray, new_tokens: np.ndarray) -> dict:
    """`follow`: which trace rows are follow-ups (turn 2+); `new_tokens`: each row's prompt tokens the
    infinite-cache oracle misses. Turn-2+ TTFT percentiles are over the follow-ups that finished."""
    s = res.summary
    finished = res.cluster.metrics.finished
    if finished is None:
        raise ValueError("run with keep_requests=True")
    ttft = np.array([r.ttft_s for r in finished if follow[r.id]], dtype=np.float64)
    budget_tokens = sum(int(new_tokens[r.id]) + r.generated for r in finished)
    per_token = res.cluster.kv_bytes_per_token
    return {
        "system": system,
        "imitates": imitates,
        "requests": s["requests"],
        "completed": s["completed"],
        "attainment": s["attainment"],
        "strict_attainment": s["strict_attainment"],
        "hit_rate": s["prefix_cache_hit_rate"],
        "host_hit_rate": s.get("prefix_cache_host_hit_rate", 0.0),  # of hit_rate, from the host tier
        "oracle_hit_rate": s.get("prefix_cache_oracle_hit_rate", 0.0),
        "turn2_requests": int(follow.sum()),
        "turn2_finished": len(ttft),
        "ttft_turn2_p50_s": float(np.percentile(ttft, 50)) if len(ttft) else float("nan"),
        "ttft_turn2_p95_s": float(np.percentile(ttft, 95)) if len(ttft) else float("nan"),
        "ttft_p50_s": s["ttft_p50_s"],
        "tbt_p99_s": s["tbt_p99_s"],
        "kv_bytes_per_request": s["kv_bytes_per_request"],
        "kv_bytes_moved": s["kv_bytes_moved"],
        # what moving only the new input and the generated tokens of each finished turn would take
        "kv_bytes_new_and_generated": budget_tokens * per_token,
        "max_mean_load": s["max_mean_load"],
        "routed_to_decode": s["routed_to_decode"],
        "transitions": s["role_switches"],
        "switches_per_hour": s["switches_per_hour"],
        "sim_wall_s": s["sim_wall_s"],
    }
