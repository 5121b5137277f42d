"""Phase goodput by simulation, the fitted workload, and the fixed-cluster split from history."""

import dataclasses

import numpy as np
import pytest

from fluidpd.core.metrics import Slo
from fluidpd.placement.config import PlaceConfig
from fluidpd.placement.plan import CHUNK_BUDGETS, best_chunk_budget, estimator, fit_history, fixed_split, split_of
from fluidpd.placement.search import search
from fluidpd.placement.verify import fine, verify
from fluidpd.policy.base import PolicyConfig
from fluidpd.policy.view import Role
from fluidpd.sim.config import SimConfig
from fluidpd.sim.deployment import Deployment, Instances
from fluidpd.sim.run import Setup, simulate
from fluidpd.specs.hardware import get_hardware
from fluidpd.specs.models import get_model
from fluidpd.workload.fitted import WorkloadModel
from fluidpd.workload.sampling import sample_requests

SLO = Slo(1.0, 0.05)


@pytest.fixture(scope="module")
def workload():
    rng = np.random.default_rng(1)
    trace = sample_requests(rng.integers(200, 1500, 300), rng.integers(20, 200, 300), 5.0, n=300, seed=2)
    return WorkloadModel.fit(trace)


@pytest.fixture(scope="module")
def est(workload):
    cfg = PlaceConfig(nodes=1, gpus_per_node=4, requests=150, iters=4)
    return estimator(get_model("llama-3.1-8b", "bf16"), get_hardware("h100"), SLO, workload, cfg)


def test_goodput_is_where_attainment_crosses_the_target(est):
    g = est.prefill(1, 1)
    dep = Deployment((Instances(Role.PREFILL, 1, 1),), 4)
    n = est.sizes[("prefill", 1, 1)]
    assert est.attainment_at("prefill-only", dep, g, output_len=1, requests=n) >= est.attainment
    assert est.attainment_at("prefill-only", dep, 1.5 * g, output_len=1, requests=n) < est.attainment


def test_more_gpus_serve_more_and_a_tight_tpot_serves_nothing(est):
    assert est.prefill(2, 1) > est.prefill(1, 1)
    assert est.decode(2, 1) > est.decode(1, 1) > 0
    tight = dataclasses.replace(est, slo=Slo(1.0, 0.001), _cache={}, sizes={})
    assert tight.decode(1, 1) == 0.0  # one batch-1 step alone misses 1 ms


def test_validity_checks_heads_layers_and_memory(est):
    assert est.valid(1, 1) and est.valid(2, 2)
    assert not est.valid(3, 1)  # 32 heads over 3 ranks
    assert not est.valid(1, 3)  # 32 layers over 3 stages
    big = dataclasses.replace(est, model=get_model("llama-3.3-70b", "bf16"), _cache={}, sizes={})
    assert not big.valid(1, 1)  # 140 GB of weights on one 80 GB GPU


@pytest.mark.slow
def test_the_chosen_configuration_is_the_best_by_a_finer_simulation(est):
    cfg = PlaceConfig(nodes=1, gpus_per_node=4, algorithm="1", requests=150, iters=4, jobs=1)
    p = search(est, cfg, 10.0)
    for check in verify(p, fine(est, requests=300, iters=5, sample_s=30.0)):
        assert check.ratio >= 0.85, check  # within the search's sampling tolerance


def test_thinning_gives_an_instance_its_share_of_the_stream(workload):
    low, high = workload.sample(1.0, 200, seed=3), workload.sample(2.0, 200, seed=3)
    assert low.mean_rate == pytest.approx(1.0, rel=0.25)
    assert high.mean_rate == pytest.approx(2.0, rel=0.25)
    fast = workload.sample(3 * workload.rate, 200, seed=3)
    assert fast.mean_rate == pytest.approx(3 * workload.rate, rel=0.25)
    assert workload.at_rate(50.0).rate == 50.0
    with pytest.raises(ValueError):
        workload.sample(0.0, 10)


def test_replayed_windows_keep_their_arrival_pattern():
    arrivals = np.array([0.0, 0.0, 0.0, 10.0, 10.0, 10.0, 20.0, 20.0, 20.0, 30.0])
    from fluidpd.workload.trace import Trace

    t = Trace("bursts", arrivals, np.full(10, 100), np.full(10, 10), span_s=30.0)
    wl = WorkloadModel.fit(t, replay=True)
    assert wl.arrivals == "replay"
    s = wl.sample(wl.rate, 30, seed=0)
    assert len(s) == 30  # the window repeats end to end
    assert np.sum(np.diff(s.arrival_s) == 0) >= 15  # bursts stay bursts


def test_fixed_split_is_the_best_static_split_on_history():
    setup = Setup(
        get_model("llama-3.1-8b", "bf16"),
        get_hardware("h100"),
        SLO,
        SimConfig(n_workers=4),
        PolicyConfig(prefill_workers=1),
    )
    rng = np.random.default_rng(4)
    history = sample_requests(rng.integers(1000, 3000, 400), rng.integers(5, 20, 400), 50.0, n=400, seed=5)
    k, scores = fixed_split(history, setup)
    assert set(scores) == {1, 2, 3}
    for j in (1, 2, 3):
        s = dataclasses.replace(setup, policy=dataclasses.replace(setup.policy, prefill_workers=j))
        assert scores[j] == simulate(history, "static-pd", s).summary["attainment"]
    assert scores[k] == max(scores.values())
    assert k == 3  # long prompts, short outputs, at a rate only 3 prefill workers keep up with
    with pytest.raises(ValueError, match="history"):
        fixed_split(history.head(5), setup)
    with pytest.raises(ValueError, match="history"):
        fit_history(history.head(5))


def test_best_chunk_budget_is_the_middle_of_the_best_on_history():
    setup = Setup(get_model("llama-3.1-8b", "bf16"), get_hardware("h100"), Slo(1.0, 0.015), SimConfig(n_workers=1))
    rng = np.random.default_rng(4)
    history = sample_requests(rng.integers(1000, 3000, 300), rng.integers(20, 100, 300), 8.0, n=300, seed=5)
    b, scores = best_chunk_budget(history, setup)
    assert list(scores) == list(CHUNK_BUDGETS)
    s = dataclasses.replace(setup, policy=dataclasses.replace(setup.policy, chunk_budget=768))
    assert scores[768] == simulate(history, "chunked", s).summary["attainment"]
    # small chunks queue prompts past the TTFT SLO, large ones stretch decode steps past the TBT SLO
    assert scores[128] < 0.5 and scores[1024] < 0.8
    assert [k for k in scores if scores[k] == 1.0] == [192, 256, 384] and b == 256
    b, scores = best_chunk_budget(history, setup, (384, 192, 192, 256))  # searched once each, in increasing order
    assert b == 256 and list(scores.items()) == [(192, 1.0), (256, 1.0), (384, 1.0)]
    with pytest.raises(ValueError, match="at least one candidate"):
        best_chunk_budget(history, setup, ())
    with pytest.raises(ValueError, match="history window holds 5 requests; a chunk budget needs at least 20"):
        best_chunk_budget(history.head(5), setup)


def test_split_of_a_placement_keeps_its_gpu_share():
    from fluidpd.placement.result import PhasePlan, Placement

    p = Placement(1, PhasePlan(2, 1, 3, 10.0), PhasePlan(2, 1, 1, 30.0), 30.0)
    assert split_of(p, 8) == 6
    assert split_of(Placement(1, PhasePlan(1, 1, 1, 1.0), PhasePlan(8, 1, 9, 1.0), 1.0), 8) == 1  # >= 1 each side
