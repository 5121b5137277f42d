"""FluidToken's chunk cost (dense tokens vs attended prior), its guard (decode jitter only), the
idle decode worker's step cap, and FluidRole's decode floor."""

from types import SimpleNamespace

import pytest
from simhelp_policy import setup_70b

from fluidpd.core.polynomial import Polynomial
from fluidpd.latency.fit import fit_attention_pair_time, fit_chunk_time
from fluidpd.latency.shape import StepShape
from fluidpd.policy.fluidtoken import FluidToken
from fluidpd.policy.view import Role, StepPlan


def test_prior_tokens_cost_attention_not_dense_work():
    s = setup_70b()
    r = s.roofline()
    token = FluidToken(fit_chunk_time(r), 0.04, attn_pair_s=fit_attention_pair_time(r))

    def truth(prior):
        base = StepShape(decode_tokens=4, decode_ctx=4 * 1000)
        mixed = StepShape(decode_tokens=4, decode_ctx=4 * 1000)
        mixed.add_chunk(256, prior)
        return r.step_time(mixed) - r.step_time(base)

    for prior in (2000, 6000):  # what the earlier tokens add: attention over them
        added = token.chunk_cost(4, prior, 256) - token.chunk_cost(4, 0, 256)
        assert added == pytest.approx(truth(prior) - truth(0), rel=0.1), prior
    assert token.chunk_cost(4, 0, 256) == pytest.approx(truth(0), rel=0.5)  # g is fitted at one decode
    # the old rule (prior counted as dense tokens) priced this chunk 2.4x too high
    g = token.chunk_time
    old = g(4 + 2000 + 256) - g(4 + 2000)
    assert old > 2 * token.chunk_cost(4, 2000, 256)


def test_without_a_measured_pair_time_the_fit_gives_one():
    token = FluidToken(Polynomial((2e-9, 1e-5, 0.0)), 0.04)
    assert token.attn_pair_s == pytest.approx(4e-9)
    assert FluidToken(Polynomial((1e-5, 0.0)), 0.04).attn_pair_s == 0.0


def _worker(**kw):
    base = dict(id=0, role=Role.DECODE, num_decoding=2, step_time_ewma_s=0.02, queue=[], kv_blocks_total=100)
    return SimpleNamespace(**{**base, **kw})


def test_the_guard_learns_decode_jitter_not_the_cost_models_error():
    token = FluidToken(Polynomial((1e-5, 0.0)), 0.04)
    w = _worker()
    req = SimpleNamespace(kv_prior=0, queued_hit=0)
    decode_only, mixed = StepPlan(decode=True), StepPlan(decode=True, chunks=[(req, 500)])
    token.observe(w, 0.020, decode_only)  # T_iter
    for i in range(200):
        token.observe(w, 0.020 + (0.001 if i % 2 else 0.0), decode_only)  # ~1 ms of jitter
        token.observe(w, 0.020 + 0.015, mixed)  # the chunk model off by 3x: 15 ms measured, 5 modelled
    assert token.tracker(0).guard_s < 0.003  # 1.5 x ~1 ms, not the mixed steps' 10 ms miss
    assert token.cost_scale(w) > 2.0  # the model's error goes into the per-worker scale


def test_an_idle_decode_worker_keeps_prefill_steps_within_a_decode_slack():
    token = FluidToken(Polynomial((1e-4, 0.0)), 0.04)  # 100 us per token: 0.04 s holds < 400
    req = SimpleNamespace(kv_prior=0, queued_hit=0, prefill_remaining=5000, prefilled=0, prefill_target=5000, worker=-1)
    w = _worker(num_decoding=0, queue=[req], num_prefilling=0, num_held=0, free_blocks=1000, block_size=16)
    plan = token.plan(w, 256)
    assert not plan.decode and plan.chunks
    assert sum(c for _, c in plan.chunks) <= 400


def test_a_decode_worker_leaves_only_if_the_rest_hold_the_decode_kv():
    from fluidpd.policy.fluidpd import FluidPD

    s = setup_70b()
    pol = FluidPD(s.policy, s.fluid, s.costs(s.roofline()))

    def view(used):
        ws = [
            SimpleNamespace(
                id=i,
                role=Role.DECODE,
                routable=True,
                kv_blocks_used=u,
                pull_blocks_pending=0,
                kv_blocks_total=100,
                role_since=-100.0,
            )
            for i, u in enumerate(used)
        ]
        ws.append(SimpleNamespace(id=9, role=Role.PREFILL, routable=True, role_since=-100.0))
        return SimpleNamespace(workers=ws, now=0.0)

    light, heavy = view([20, 20, 20]), view([70, 70, 70])
    assert pol._can_move(light)(light.workers[0])
    assert not pol._can_move(heavy)(heavy.workers[0])  # 210 blocks do not fit 0.8 x 200


def test_ppi_follows_the_measured_prefill_speed():
    from fluidpd.policy.fluidpd import FluidPD

    s = setup_70b()
    pol = FluidPD(s.policy, s.fluid, s.costs(s.roofline()))
    w = SimpleNamespace(id=0, role=Role.PREFILL)
    req = SimpleNamespace(kv_prior=0, queued_hit=0)
    plan = StepPlan(chunks=[(req, 2048)])
    modelled = pol.costs.prefill_time(2048)
    for _ in range(10):
        pol.observe_step(w, 2.0 * modelled, plan)  # this host prefills at half the profiled speed
    assert pol.prefill_scale == pytest.approx(2.0, rel=0.01)
    assert pol.prefill_work(2048) == pytest.approx(2.0 * modelled, rel=0.01)
    for _ in range(10):
        pol.observe_step(w, 0.5 * modelled, plan)  # faster than profiled: the profile stays the floor
    assert pol.prefill_scale == pytest.approx(1.0, rel=0.01)


def test_chunks_cheaper_than_the_jitter_do_not_move_the_cost_scale():
    token = FluidToken(Polynomial((1e-5, 0.0)), 0.04)
    w = _worker()
    req = SimpleNamespace(kv_prior=0, queued_hit=0)
    token.observe(w, 0.020, StepPlan(decode=True))
    for i in range(100):
        token.observe(w, 0.020 + (0.002 if i % 2 else 0.0), StepPlan(decode=True))
    small = StepPlan(decode=True, chunks=[(req, 50)])  # 0.5 ms modelled, inside ~2 ms of jitter
    for excess in (-0.002, 0.004, -0.001, 0.003):
        token.observe(w, 0.020 + excess, small)
    assert token.cost_scale(w) == 1.0
    big = StepPlan(decode=True, chunks=[(req, 1000)])  # 10 ms modelled, measured 20: learned at once
    token.observe(w, 0.020 + 0.020, big)
    assert token.cost_scale(w) == pytest.approx(2.0, rel=0.15)


def _pool(decode_used: int, prefill_used: int, queue):
    def worker(i, role, used, q=()):
        return SimpleNamespace(
            id=i,
            role=role,
            routable=True,
            queue=list(q),
            kv_blocks_total=1000,
            kv_blocks_used=used,
            free_blocks=1000 - used,
            pull_blocks_pending=0,
            block_size=16,
            num_decoding=4,
            num_prefilling=0,
            step_time_ewma_s=0.02,
        )

    return SimpleNamespace(
        workers=[worker(0, Role.PREFILL, prefill_used, queue), worker(1, Role.DECODE, decode_used)], now=0.0
    )


def test_borrowing_keeps_free_the_kv_the_prefill_pool_will_hand_off():
    from fluidpd.core.request import Request

    token = FluidToken(Polynomial((1e-5, 0.0)), 0.04)

    def borrows(decode_used, prefill_used):
        req = Request(1, 0.0, prompt_len=1600, output_len=160)  # 110 blocks
        return token.borrow(_pool(decode_used, prefill_used, [req]))

    assert borrows(850, 0)  # 85% used, nothing coming from the prefill pool: a flat 20% kept it out
    assert not borrows(850, 100)  # 150 free, 100 promised to hand-offs: 50 left, the request needs 110
    assert borrows(500, 100)
    assert borrows(500, 600)  # a big prefill pool's share is capped at kv_headroom (200 of 1000)
    assert not borrows(850, 600)


def test_prefill_to_decode_prefers_the_worker_holding_kv_among_equals():
    from fluidpd.policy.fluidrole import choose_prefill_to_decode

    ws = [
        SimpleNamespace(id=i, role=Role.PREFILL, routable=True, queued_uncached=0, num_held=h, num_cached_blocks=0)
        for i, h in enumerate((0, 3))
    ]
    assert choose_prefill_to_decode(SimpleNamespace(workers=ws), lambda w: True) == 1
    ws[1].queued_uncached = 500  # queued work still comes first: it has to move to a peer
    assert choose_prefill_to_decode(SimpleNamespace(workers=ws), lambda w: True) == 0
    ws[1].queued_uncached, ws[1].num_held = 0, 0
    ws[0].num_cached_blocks = 40  # among equals, the prefill pool keeps the larger cache
    assert choose_prefill_to_decode(SimpleNamespace(workers=ws), lambda w: True) == 1


def test_the_last_prefill_worker_may_go_only_when_one_more_decode_worker_is_predicted_to_gain():
    from fluidpd.policy.fluidpd import FluidPD
    from fluidpd.policy.telemetry import prefill_pressure_index

    s = setup_70b()
    pol = FluidPD(s.policy, s.fluid, s.costs(s.roofline()))
    view = _pool(500, 0, [])
    for w in view.workers:
        w.role_since, w.queued_tokens = -100.0, 0
    prefill = view.workers[0]
    assert not pol._can_move(view)(prefill)  # the last prefill worker stays ...
    pol.to_decode = 0.1
    assert pol._can_move(view)(prefill)  # ... unless the shape with one more decode worker serves more
    pol.use_token = False
    assert not pol._can_move(view)(prefill)  # without FluidToken nobody would prefill
    pol.use_token = True

    prefill.routable = False  # all-decode: prompts go to the decode worker with least queued work
    second = _pool(900, 0, []).workers[1]
    second.id, second.queued_tokens = 2, 0
    view.workers[1].queued_tokens = 4000
    view.workers.append(second)
    from fluidpd.core.request import Request

    second.cached_tokens = lambda r: 0
    assert pol.route(Request(6, 0.0, prompt_len=1000, output_len=10), view) == 2
    assert pol.demand.rate(0.0) == pytest.approx(pol.prefill_work(1000) / pol.fluid.horizon_s)

    req = Request(7, -10.0, prompt_len=4000, output_len=10)  # 10 s late already
    view.workers[1].queue.append(req)
    ppi = prefill_pressure_index(view, lambda n: n * 1e-4, 2.0)
    assert ppi == pytest.approx((0.4 + (10.0 + 0.4 - 2.0)) / (2 * 2.0))  # the decode workers' queues


def test_chunks_are_sized_from_the_measured_overrun_of_mixed_steps():
    """Mixed steps run 0.8-1.35x what the planner estimates (a loaded host): sized to SLO_TBT minus
    the decode-jitter guard alone, about half of them broke SLO_TBT; sized from the measured p99
    of measured / planned, almost none do. The first chunks, before any is measured, are priced at
    the prior."""
    import random

    token = FluidToken(Polynomial((1e-5, 0.0)), 0.04)  # 10 us a prompt token
    w = _worker()
    req = SimpleNamespace(kv_prior=0, queued_hit=0)
    rng, over, mixed = random.Random(3), 0, 0
    token.observe(w, 0.020, StepPlan(decode=True))
    seed = 0.04 - 0.020 - token.tracker(0).guard_s  # SLO_TBT - T_iter - delta_guard
    assert token.slack(w) == pytest.approx(seed / token.config.overrun_prior)  # not yet measured
    assert token.slack(w, forecast=True) == pytest.approx(seed)
    for i in range(600):
        token.observe(w, 0.020 + 0.001 * (i % 2), StepPlan(decode=True))
        c = token.chunk_tokens(w)
        assert c > 0
        duration = (0.020 + 1e-5 * c) * rng.uniform(0.8, 1.35)
        token.observe(w, duration, StepPlan(decode=True, chunks=[(req, c)]))
        if i >= 20:
            mixed += 1
            over += duration > 0.04
    assert over / mixed <= 0.02, over / mixed
    assert 1.1 < token.overrun_of(0).factor < 1.7  # the factor over the online scale, itself noisy
    assert token.chunk_tokens(w) > 1000  # still borrows: the bound prices the error, not more


def test_an_idle_decode_worker_never_stalls_a_started_prompt_behind_one_that_cannot_start():
    """Late-last started B ahead of the late A; KV for A only frees when B finishes. With chunks priced
    past the slack (a cost scale measured while a replacement worker loaded), the step that keeps
    an idle decode worker going must take B's chunk, not stop at A: else neither ever runs."""
    from fluidpd.core.request import Request
    from fluidpd.policy.stepplan import past_ttft
    from fluidpd.world.worker import WorkerState

    token = FluidToken(Polynomial((1e-3, 0.0)), 0.5)  # 1 ms a token: a 16-token chunk fits 0.5 s
    w = WorkerState(2, Role.DECODE, 0, 80, 16)
    late_one = Request(0, 0.0, 900, 30)  # 57 blocks, arrived long ago
    started = Request(1, 9.0, 1000, 30)
    started.prefilled, started.worker = 600, w.id
    w.allocate(w.blocks_of(started) + 3)  # what it reserved: 66 of 80 blocks, 14 free
    w.enqueue(late_one)
    w.enqueue(started)
    late = past_ttft(10.0, 5.0)
    token.scale[w.id] = 1e3  # every chunk priced past the slack
    plan = token.plan(w, 256, late)
    assert [r.id for r, _ in plan.chunks] == [1] and not plan.decode
    token.scale[w.id] = 1.0
    assert [r.id for r, _ in token.plan(w, 256, late).chunks] == [1]  # priced within it: the same request


def test_a_worker_whose_step_is_priced_at_nothing_lends_nothing_and_raises_nothing():
    # nothing decoding (T_iter 0) and a flat fit (a chunk priced at 0 s): the forecast's rate is 0, not a
    # ZeroDivisionError in the control loop (which once stopped a runtime's ticks)
    tok = FluidToken(Polynomial([0.0]), 0.04)
    w = SimpleNamespace(id=0, num_decoding=0, step_time_ewma_s=0.0, queue=[], block_size=16)
    assert tok.chunk_tokens(w, forecast=True) > 0
    assert tok.prefill_rate(w) == 0.0
