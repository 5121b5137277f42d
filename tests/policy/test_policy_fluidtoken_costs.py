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
    req = SimpleNamespace(kv_prior=0)
    decode_only, mixed = StepPlan(decode=True), StepPlan(decode=True, chunks=[(req, 500)])
    token.observe(w, 0.020, decode_only)  # T_iter
    for i in range(200):
        token.observe(w, 0.020 + (0.001 if i % 2 else 0.0), decode_only)  # ~1 ms of jitter
        token.observe(w, 0.020 + 0.015, mixed)  # the chunk model off by 3x: 15 ms measured, 5 modelled
    assert token.tracker(0).guard_s < 0.003  # 1.5 x ~1 ms, not the mixed steps' 10 ms miss
    assert token.cost_scale(w) > 2.0  # the model's error goes into the per-worker scale


def test_an_idle_decode_worker_keeps_prefill_steps_within_a_decode_slack():
    token = FluidToken(Polynomial((1e-4, 0.0)), 0.04)  # 100 us per token: 0.04 s holds < 400
    req = SimpleNamespace(kv_prior=0, prefill_remaining=5000, prefilled=0, prefill_target=5000, worker=-1)
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
    req = SimpleNamespace(kv_prior=0)
    plan = StepPlan(chunks=[(req, 2048)])
    modelled = pol.costs.prefill_time(2048)
    for _ in range(10):
        pol.observe_step(w, 2.0 * modelled, plan)  # this host prefills at half the profiled speed
    assert pol.prefill_scale == pytest.approx(2.0, rel=0.01)
    assert pol.prefill_work(2048) == pytest.approx(2.0 * modelled, rel=0.01)
    for _ in range(10):
        pol.observe_step(w, 0.5 * modelled, plan)  # faster than profiled: the profile stays the floor
    assert pol.prefill_scale == pytest.approx(1.0, rel=0.01)
