"""Prefix caching and closed-loop sessions in the simulator."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from simhelp import cluster, setup_8b

from fluidpd.sim.run import simulate
from fluidpd.workload.hot_prefix import hot_prefix
from fluidpd.workload.sessions import chat_sessions
from fluidpd.workload.trace import Trace


def chat(**kw) -> Trace:
    spread = {"start_spread_s": 20.0}  # first turns apart: a shared prefix is computed before it is reused
    return chat_sessions(6, 4, system_tokens=2000, new_tokens=200, output_tokens=50, think_time_s=2.0, **spread, **kw)


def test_a_session_turn_arrives_its_think_time_after_the_previous_one_completes():
    t = chat(seed=3)
    c = cluster(t, "chunked", setup_8b(workers=2))
    c.run()
    assert c.metrics.completed == len(t)
    by_session: dict[int, list] = {}
    for r in sorted(c.metrics.finished, key=lambda r: r.arrival_s):
        by_session.setdefault(r.session, []).append(r)
    assert len(by_session) == 6
    for turns in by_session.values():
        assert turns[0].arrival_s == pytest.approx(t.arrival_s[turns[0].id])  # a first turn: open loop
        for prev, nxt in itertools.pairwise(turns):
            assert nxt.arrival_s == pytest.approx(prev.finish_s + nxt.think_time_s)
            assert nxt.arrival_s > t.arrival_s[nxt.id]  # later than its open-loop time: it waited


def test_a_rejected_turn_still_releases_the_next_one():
    t = chat_sessions(1, 3, system_tokens=0, new_tokens=100, output_tokens=10, think_time_s=1.0, seed=0)
    t.prompt_len[1] = 10**6  # can never fit
    c = cluster(t, "chunked", setup_8b(workers=1))
    c.run()
    assert c.metrics.rejected == 1 and c.metrics.completed == 2


def test_sessions_hit_their_history_and_the_summary_puts_the_oracle_beside_it():
    t = chat(seed=1)
    on = simulate(t, "colocated", setup_8b(workers=1)).summary
    off = simulate(t, "colocated", setup_8b(workers=1, enable_prefix_caching=False)).summary
    assert on["prefix_cache_oracle_hit_rate"] == off["prefix_cache_oracle_hit_rate"] > 0.8
    assert off["prefix_cache_hit_rate"] == 0.0
    # one worker and room for every session: every reusable block is found
    assert on["prefix_cache_hit_rate"] == pytest.approx(on["prefix_cache_oracle_hit_rate"], rel=0.02)
    assert on["ttft_p50_s"] < off["ttft_p50_s"]


def test_mooncake_blocks_map_onto_the_simulated_block_size():
    prefix = np.arange(4)  # four 512-token blocks shared, then each request's own
    ids = [np.concatenate([prefix, [100 + i]]) for i in range(3)]
    t = Trace("m", [0.0, 30.0, 60.0], [2100] * 3, [5] * 3, ids, 512)
    c = cluster(t, "colocated", setup_8b(workers=1))
    c.run()
    w = c.workers[0]
    assert (w.prefix_cache_queries, w.prefix_cache_hits) == (3 * 2100, 2 * 2048)
    assert all(len(r.block_hashes) == 2100 // 16 for r in c.metrics.finished)
    assert w.kv_blocks_used == 0 and not w.cache.refs


def test_a_trace_without_block_ids_has_no_reuse():
    t = Trace("plain", [0.0, 1.0], [2000, 2000], [5, 5])
    s = simulate(t, "chunked", setup_8b(workers=1)).summary
    assert s["prefix_cache_hit_rate"] == 0.0 and "prefix_cache_oracle_hit_rate" not in s


def test_hot_prefixes_are_found_by_the_cache_near_the_oracle():
    t = hot_prefix(30.0, 8.0, n_prefixes=4, seed=0)
    on = simulate(t, "colocated", setup_8b(workers=1)).summary
    off = simulate(t, "colocated", setup_8b(workers=1, enable_prefix_caching=False)).summary
    assert on["prefix_cache_oracle_hit_rate"] > 0.8 and off["prefix_cache_hit_rate"] == 0.0
    # one worker holds all four prefixes: only a prefix's first request and the suffixes miss
    assert on["prefix_cache_hit_rate"] == pytest.approx(on["prefix_cache_oracle_hit_rate"], rel=0.02)
    assert on["ttft_p50_s"] < off["ttft_p50_s"]
