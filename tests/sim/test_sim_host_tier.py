"""The simulator's host tier (`--kv-offloading-size`): loads timed as copies at the PCIe rate on the
worker's host link, beside its steps (the loading request waits, its neighbours do not), a node pool
shared by its workers."""

from __future__ import annotations

from dataclasses import replace

from simhelp import cluster, setup_8b

from fluidpd.workload.trace import Trace


def session_trace(sessions: int, turns: int, gap_s: float) -> Trace:
    """`sessions` chats whose turn k+1 repeats turn k's context (blocks by id) and adds 128 tokens."""
    rows, ids = [], []
    for s in range(sessions):
        ctx: list[int] = []
        for k in range(turns):
            ctx = [*ctx, *range(10_000 * s + 100 * k, 10_000 * s + 100 * k + 8)]  # 8 new blocks of 16
            rows.append((k * gap_s + 0.01 * s, 16 * len(ctx), 16))
            ids.append(list(ctx))
    order = sorted(range(len(rows)), key=lambda i: rows[i][0])
    return Trace(
        "sessions",
        [rows[i][0] for i in order],
        [rows[i][1] for i in order],
        [rows[i][2] for i in order],
        hash_ids=[ids[i] for i in order],
        hash_block_size=16,
    )


def run(tr: Trace, gib: float, bw: float = 0.0, pooled: bool = False):
    s = setup_8b(2, enable_prefix_caching=True, kv_offloading_size=gib, kv_offloading_pooled=pooled)
    if bw:
        s = replace(s, sim=replace(s.sim, kv_offloading_bw=bw))
    s = replace(s, sim=s.roofline().sim_config(s.sim))
    c = cluster(tr, "chunked", s, kv_blocks=96)  # a small arena: the sessions' contexts do not fit
    c.run()
    assert c.metrics.completed == len(tr) and all(w.kv_blocks_used == 0 for w in c.workers)
    hits = sum(w.prefix_cache_hits for w in c.workers)
    host = sum(w.host_hits for w in c.workers)
    return hits, host, c


def test_the_simulated_tier_turns_misses_into_loads_whose_copy_is_timed():
    tr = session_trace(sessions=12, turns=4, gap_s=2.0)
    off_hits, off_host, _ = run(tr, 0.0)
    on_hits, on_host, fast = run(tr, 1.0)
    assert off_host == 0 and on_host > 0
    assert on_hits > off_hits + on_host // 2
    _, slow_host, slow = run(tr, 1.0, bw=1e6)  # a tier at 1 MB/s: loads take seconds
    ttft = {name: sorted(r.ttft_s for r in c.metrics.finished) for name, c in (("fast", fast), ("slow", slow))}
    assert slow_host > 0 and ttft["slow"][len(tr) // 2] > ttft["fast"][len(tr) // 2]
    # the copies do not stall the workers' steps: the decodes beside a loading request keep their pace
    # (a gap over SLO_TBT only for a request preempted for room, which waits for its reload; the copies
    # stalling the steps instead gave 30 gaps over it here)
    over = sum(r.gaps_over for r in slow.metrics.finished)
    assert over <= sum(w.preemptions for w in slow.workers) and fast.metrics.tbt.max < 0.05


def test_a_request_waits_for_its_load_while_its_worker_steps_on():
    tr = session_trace(sessions=12, turns=4, gap_s=2.0)
    _, host, c = run(tr, 1.0, bw=2e6)
    loaded = [r for r in c.metrics.finished if r.loaded_tokens]
    assert host > 0 and loaded
    w = c.workers[0]
    per_token = c.kv_bytes_per_token / c.config.kv_offloading_bw
    for r in loaded:  # its first token came after its load's copy time (from its admission at the earliest)
        assert r.ttft_s >= r.loaded_tokens * per_token
    assert c._host_link_until[w.id] > 0


def test_a_node_pool_is_one_tier_with_its_workers_capacity():
    tr = session_trace(sessions=12, turns=4, gap_s=2.0)
    _, own_host, own = run(tr, 0.25)
    _, pool_host, pool = run(tr, 0.25, pooled=True)
    assert pool.workers[0].host is pool.workers[1].host and own.workers[0].host is not own.workers[1].host
    assert pool.workers[0].host.capacity_blocks == 2 * own.workers[0].host.capacity_blocks
    assert own_host > 0 and pool_host > 0
