"""The decode side's forecast and the prefill -> decode switch it drives."""

from types import SimpleNamespace

import pytest
from simhelp_policy import setup_70b

from fluidpd.core.request import Request
from fluidpd.policy.decode_demand import DecodeDemand, DecodeForecast
from fluidpd.policy.fluidpd import FluidPD
from fluidpd.policy.view import Role


def _worker(i, role, used=0, pending=0, queue=(), total=1000):
    return SimpleNamespace(
        id=i,
        role=role,
        routable=True,
        queue=list(queue),
        kv_blocks_total=total,
        kv_blocks_used=used,
        free_blocks=total - used,
        pull_blocks_pending=pending,
        block_size=16,
        num_decoding=4,
        num_prefilling=0,
        step_time_ewma_s=0.02,
        queued_tokens=sum(r.prompt_len for r in queue),
        queued_uncached=sum(r.prompt_len for r in queue),
        num_held=0,
        num_cached_blocks=0,
        role_since=-100.0,
    )


def _view(now, workers):
    return SimpleNamespace(now=now, workers=workers)


def test_demand_is_the_decode_pools_kv_in_use_and_promised_the_larger_of_now_and_its_mean():
    dd = DecodeDemand(horizon_s=10.0, every_s=1.0)
    prefill = _worker(0, Role.PREFILL, used=700)  # what the prefill pool holds is not decode demand yet
    decode = [_worker(1, Role.DECODE, used=400), _worker(2, Role.DECODE, used=200, pending=200)]
    f = dd.observe(_view(0.0, [prefill, *decode]))
    assert (f.demand_blocks, f.demand_h, f.pool_blocks, f.worker_blocks) == (800, 800, 2000, 1000)
    decode[0].kv_blocks_used = 0
    assert dd.observe(_view(0.5, [prefill, *decode])) is f  # sampled once per every_s
    f = dd.observe(_view(1.0, [prefill, *decode]))
    assert f.demand_blocks == 400 and f.demand_h == pytest.approx(600)  # fallen for a moment: the mean
    decode[0].kv_blocks_used = 1600
    f = dd.observe(_view(2.0, [prefill, *decode]))
    assert f.demand_h == 2000  # risen: what it is now
    for t in range(3, 14):
        f = dd.observe(_view(float(t), [prefill, *decode]))
    assert f.demand_h == 2000  # the samples older than the horizon are gone


def test_served_share_and_room_with_more_or_fewer_decode_workers():
    f = DecodeForecast(demand_blocks=1500, demand_h=2500, pool_blocks=2000, worker_blocks=1000)
    assert f.served() == pytest.approx(0.8)
    assert f.served(1) == 1.0 and f.served(-1) == pytest.approx(0.4)
    assert f.room(0.2) == 0.0  # short of KV: nothing to borrow into
    assert f.room(0.2, 1) == pytest.approx(500 / 600)  # one more worker: 500 free of a 600-block headroom
    assert f.room(0.2, 2) == 1.0


def _fluidpd():
    s = setup_70b()
    return FluidPD(s.policy, s.fluid, s.costs(s.roofline()))


def test_a_prefill_worker_moves_to_decode_when_decode_is_short_and_prefill_keeps_up():
    pol = _fluidpd()
    workers = [
        _worker(0, Role.PREFILL),
        _worker(1, Role.PREFILL),
        _worker(2, Role.DECODE, used=1000, pending=600),
        _worker(3, Role.DECODE, used=1000, pending=600),
    ]
    pol.tick(_view(0.0, workers))
    assert pol.decode_forecast.served() == pytest.approx(2000 / 3200)
    assert pol.to_decode > 0  # idle prefill, hand-offs waiting for decode room
    assert pol.state != "decode-deficit"  # ... held for tau_persist first
    pol.tick(_view(pol.fluid.tau_persist_s + 0.1, workers))
    assert pol.state == "decode-deficit"
    assert (pol.transition.worker, pol.transition.dst_role) == (0, Role.DECODE)


def test_no_prefill_worker_moves_while_the_prefill_side_would_serve_less_than_decode_gains():
    pol = _fluidpd()
    backlog = [Request(i, 0.0, prompt_len=8000, output_len=10) for i in range(40)]
    for r in backlog:
        pol.demand.add(0.0, pol.prefill_work(r.prompt_len))  # as routing adds it
    workers = [
        _worker(0, Role.PREFILL, queue=backlog[:20]),
        _worker(1, Role.PREFILL, queue=backlog[20:]),
        _worker(2, Role.DECODE, used=1000, pending=50),  # decode a little short ...
        _worker(3, Role.DECODE, used=1000, pending=50),
    ]
    for w in workers[2:]:
        w.step_time_ewma_s = 0.039  # ... and its steps near SLO_TBT: no slack to borrow with
    pol.tick(_view(0.0, workers))
    assert pol.decode_forecast.served() < 1.0
    assert pol.served(-1) < pol.served(0)  # a prefill worker fewer serves less of the prompts
    assert pol.to_decode <= 0
