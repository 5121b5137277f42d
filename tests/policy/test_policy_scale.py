"""The control cycle's shortcuts at scale (issue 54) decide exactly what a full recomputation decides.

A synthetic cluster (`fluidpd.bench.scale_cluster`) is moved on by random events (decode steps
observed, requests finishing, arriving and handed off) with a fixed seed; after each period every
memoized or restructured value is checked against the plain computation it stands for.
"""

from __future__ import annotations

import pytest

from fluidpd.bench.control_scale import Timings, churn
from fluidpd.bench.scale_cluster import build
from fluidpd.policy.actions import Borrow, BorrowSplit
from fluidpd.policy.borrowing import _unstarted_head, handoff_reserve
from fluidpd.policy.stepplan import on_time_first
from fluidpd.policy.telemetry import decode_pressure_index, worker_pressure
from fluidpd.policy.view import Role, blocks_for


def _prefill_rate(token, w) -> float:
    c = token.chunk_tokens(w, forecast=True)
    step = token.t_iter(w) + token.chunk_cost(w.num_decoding, 0, c, token.cost_scale(w)) if c else 0.0
    return c / step if step > 0 else 0.0


def _borrow(token, view, late) -> list[tuple]:
    """FluidToken's borrowing as it was before the cycle was made incremental: every waiting request
    tests every free worker, the most room wins."""
    donors = [w for w in view.workers if w.role is Role.PREFILL and w.queue]
    if not donors:
        return []
    heads = {w.id: _unstarted_head(on_time_first(w.queue, late), 8) for w in donors}
    owner = {r.id: wid for wid, reqs in heads.items() for r in reqs}
    waiting = sorted(
        (r for reqs in heads.values() for r in reqs), key=lambda r: (late is not None and late(r), r.arrival_s, r.id)
    )
    cap, c = token.config.borrowed_per_worker, token.config
    reserve = handoff_reserve(view)
    free, slack = [], {}
    for w in view.workers:
        if w.role is Role.DECODE and w.routable and len(w.queue) < cap:
            slack[w.id] = token.slack(w)
            if token.has_slack(w, slack[w.id]):
                free.append(w)
    room = {
        w.id: w.free_blocks - w.pull_blocks_pending - min(reserve, int(c.kv_headroom * w.kv_blocks_total)) for w in free
    }
    out = []
    for req in waiting:
        if not free:
            break
        need = blocks_for(req.prompt_len + req.output_len, free[0].block_size)
        fits = [
            w
            for w in free
            if room[w.id] >= need
            and token.chunk_cost(w.num_decoding + 1, req.prefill_target - c.min_chunk, c.min_chunk, token.cost_scale(w))
            <= slack[w.id]
            and (not req.queued_hit or w.cached_tokens(req) >= req.queued_hit)
        ]
        if not fits:
            continue
        home = max(fits, key=lambda w: (room[w.id], -w.id))
        free.remove(home)
        helpers = []
        if not (
            req.prompt_len < c.split_min_tokens or c.max_split < 2 or req.prefill_target != req.prompt_len or req.n > 1
        ):
            piece = -(-req.prompt_len // c.max_split)
            ok = [w for w in free if room[w.id] >= blocks_for(piece, w.block_size)]
            helpers = sorted(ok, key=lambda w: (-room[w.id], w.id))[: c.max_split - 1]
        for h in helpers:
            free.remove(h)
        out.append((req.id, owner[req.id], home.id, *(h.id for h in helpers)))
    return out


def _actions(actions) -> list[tuple]:
    out = []
    for a in actions:
        if isinstance(a, Borrow):
            out.append((a.request.id, a.src, a.dst))
        elif isinstance(a, BorrowSplit):
            out.append((a.request.id, a.src, *a.dsts))
    return out


@pytest.mark.parametrize("scenario", ["steady", "burst"])
def test_the_cycle_decides_what_a_full_recomputation_decides(scenario):
    cl = build("fluidpd", 64, 640, scenario, seed=7)
    policy, token = cl.policy, cl.policy.token
    f, c = policy.fluid, policy.costs
    borrowed, ppi = 0, 0.0
    for period in range(60):
        churn(cl, 0.01, Timings(), sample=3)
        decode = [w for w in cl.workers if w.role is Role.DECODE and w.routable]
        for w in decode:  # the memo answers what the plain computation answers
            assert token.prefill_rate(w) == _prefill_rate(token, w)
            slack = token.slack(w)
            assert token.slack_of(w) == (slack, token.has_slack(w, slack))
        dpi = decode_pressure_index(cl, c.slo.tbt_s, f.alpha, token.t_iter)
        pool = [w for w in cl.workers if w.role in (Role.DECODE, Role.COLOCATED) and w.routable]
        assert dpi == sum(worker_pressure(w, c.slo.tbt_s, f.alpha, token.t_iter) for w in pool) / len(pool)
        for tokens in (1, 17, 512, 4095):
            assert policy.prefill_work(tokens) == policy.prefill_scale * c.prefill_time(tokens)
        late = policy.late(cl.now)
        expected = _borrow(token, cl, late)
        got = _actions(token.borrow(cl, late))
        assert got == expected, period
        borrowed += len(got)
        policy.tick(cl)
        ppi = max(ppi, policy.pressure.ppi)
    if scenario == "burst":
        assert borrowed > 0 and ppi > 1.0  # the borrowing path was exercised
