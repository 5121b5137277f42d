"""Algorithms 1 and 2 over an estimator whose answers the test chooses."""

import math

import pytest

from fluidpd.placement.algorithms import algorithm1, algorithm2
from fluidpd.placement.config import PlaceConfig
from fluidpd.placement.result import Placement, load_placement
from fluidpd.placement.search import Evaluator, search


class Table:
    """Goodput = a chosen function of (tp, pp); validity: tp * pp >= 2 and pp | 4."""

    def valid(self, tp, pp):
        return tp * pp >= 2 and 4 % pp == 0

    def prefill(self, tp, pp):
        return 3.0 * tp * pp * (1.2 if (tp, pp) == (2, 2) else 1.0)

    def decode(self, tp, pp):
        return 10.0 * tp * pp * (1.5 if (tp, pp) == (1, 4) else 1.0)

    def unit(self, pp, prefill_tp, decode_tp, a=1, b=1):
        return min(a * self.prefill(prefill_tp, pp), b * self.decode(decode_tp, pp))


def test_algorithm1_keeps_the_best_per_gpu_config_of_each_phase_and_replicates_it():
    res = algorithm1(Table(), nodes=1, gpus_per_node=4, rate=100.0)
    assert (res.prefill.tp, res.prefill.pp) == (2, 2)
    assert (res.decode.tp, res.decode.pp) == (1, 4)
    assert res.prefill_instances == math.ceil(100 / 14.4)
    assert res.decode_instances == math.ceil(100 / 60.0)
    assert all(Table().valid(c.tp, c.pp) for c in res.candidates)
    assert {c.tp * c.pp for c in res.candidates} <= {2, 3, 4, 6, 8}  # pp up to N*M/tp, valid only


def test_algorithm2_units_fit_one_node_per_stage():
    res = algorithm2(Table(), nodes=2, gpus_per_node=4, rate=50.0, ratios=[(1, 1), (2, 1), (1, 2)])
    for c in res.candidates:
        a, b = c.segments
        assert a * c.tp + b * c.decode_tp <= 4
        assert c.gpus == c.pp * (a * c.tp + b * c.decode_tp)
    best = max(res.candidates, key=lambda c: c.per_gpu)
    assert res.unit.per_gpu == best.per_gpu
    assert res.instances == math.ceil(50.0 / res.unit.goodput_rps)


def test_no_feasible_configuration_is_a_clear_error():
    class Nothing(Table):
        def valid(self, tp, pp):
            return False

    with pytest.raises(ValueError, match="no feasible"):
        algorithm1(Nothing(), 1, 4, 10.0)
    with pytest.raises(ValueError, match="no feasible unit"):
        algorithm2(Nothing(), 1, 4, 10.0)


def test_auto_follows_the_cross_node_bandwidth():
    cfg = PlaceConfig(nodes=2, gpus_per_node=4, rate=50.0, jobs=1)
    fast = search(Table(), cfg, 50.0, kv_bytes_per_request=100e6, link_bw_per_gpu=50e9)
    slow = search(Table(), cfg, 50.0, kv_bytes_per_request=100e6, link_bw_per_gpu=3.1e9 / 8)
    assert fast.algorithm == 1 and "Algorithm 1" in fast.reason
    assert slow.algorithm == 2 and slow.unit is not None and "NVLink" in slow.reason
    forced = search(Table(), PlaceConfig(nodes=2, gpus_per_node=4, algorithm="2", jobs=1), 50.0)
    assert forced.algorithm == 2


def test_parallel_scoring_gives_the_serial_answers():
    jobs = [(p, tp, pp) for tp in (1, 2, 4) for pp in (1, 2, 4) for p in ("prefill", "decode")]
    seen = []
    serial = Evaluator(Table(), 1)(jobs)
    parallel = Evaluator(Table(), 2, lambda done, total: seen.append((done, total)))(jobs)
    assert parallel == serial
    assert seen[-1] == (len(jobs), len(jobs))


def test_placement_json_round_trips_and_bad_files_are_clear(tmp_path):
    p = search(Table(), PlaceConfig(nodes=2, gpus_per_node=4, algorithm="2", jobs=1), 50.0)
    path = tmp_path / "p.json"
    import json

    path.write_text(json.dumps(p.to_json()))
    back = load_placement(path)
    assert back.to_json()["prefill"] == p.to_json()["prefill"]
    assert back.unit == p.unit and back.total_gpus == p.total_gpus
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        load_placement(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="not a placement"):
        Placement.from_json({"algorithm": 1})


def test_config_rejects_nonsense():
    for kw in ({"nodes": 0}, {"attainment": 1.5}, {"algorithm": "3"}, {"rate": -1.0}, {"requests": 1}):
        with pytest.raises(ValueError):
            PlaceConfig(**kw)


def test_algorithm2_pruning_finds_the_exhaustive_best_with_fewer_simulations():
    calls = []

    class Counting(Table):
        def unit(self, pp, prefill_tp, decode_tp, a=1, b=1):
            calls.append((pp, prefill_tp, decode_tp, a, b))
            return 0.9 * super().unit(pp, prefill_tp, decode_tp, a, b)  # joint attainment: below the bound

    ratios = [(a, b) for a in (1, 2, 3) for b in (1, 2, 3)]
    res = algorithm2(Counting(), nodes=2, gpus_per_node=4, rate=50.0, ratios=ratios, batch=2)
    est = Counting()
    every = [
        (0.9 * Table().unit(pp, tp, td, a, b) / (pp * (a * tp + b * td)), (pp, tp, td, (a, b)))
        for pp in (1, 2)
        for tp in range(1, 5)
        for td in range(1, 5)
        for a, b in ratios
        if est.valid(tp, pp) and est.valid(td, pp) and a * tp + b * td <= 4
    ]
    best_per_gpu, _ = max(every)
    assert res.unit.per_gpu == pytest.approx(best_per_gpu)
    assert res.pruned > 0 and len(calls) + res.pruned == len(every)
