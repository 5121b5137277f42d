"""`fluidpd place --example seed`: the seed's worked example, as printed in its Section V."""

import json
import subprocess
import sys

import pytest

from fluidpd.placement.closed_form import SeedEstimator, seed_example


@pytest.fixture(scope="module")
def seed():
    return seed_example()


def test_algorithm1_matches_the_seed(seed):
    p = seed["algorithm1"]
    assert (p.prefill.tp, p.prefill.pp, p.prefill.instances) == (1, 5, 8)
    assert p.prefill.goodput_rps == pytest.approx(27.3, abs=0.05)
    assert (p.decode.tp, p.decode.pp, p.decode.instances) == (2, 2, 4)
    assert p.decode.goodput_rps == pytest.approx(50.5, abs=0.05)
    assert p.total_gpus == 56


def test_algorithm2_matches_the_seed(seed):
    p = seed["algorithm2"]
    u = p.unit
    assert (u.pp, u.prefill_tp, u.decode_tp, u.instances) == (2, 4, 2, 7)
    assert (u.prefill_segments, u.decode_segments) == (1, 1)
    assert u.goodput_rps == pytest.approx(32.2, abs=0.05)
    assert p.total_gpus == 84


def test_segment_ratios_save_gpus_on_the_seed_example(seed):
    p = seed["algorithm2_ratios"]
    assert p.total_gpus < seed["algorithm2"].total_gpus
    u = p.unit
    # every stage of a unit fits one node
    assert u.prefill_segments * u.prefill_tp + u.decode_segments * u.decode_tp <= 8
    assert u.instances * u.goodput_rps >= 200.0


def test_the_seed_estimator_rejects_what_cannot_hold_the_model():
    est = SeedEstimator()
    assert not est.valid(1, 1)  # 140 GB on one 80 GB GPU
    assert not est.valid(1, 3)  # 80 layers do not split in 3
    assert est.valid(2, 1) and est.valid(1, 2)


def test_cli_prints_and_writes_the_example(tmp_path):
    out = tmp_path / "seed.json"
    png = tmp_path / "seed.png"
    p = subprocess.run(
        [sys.executable, "-m", "fluidpd.cli", "place", "--example", "seed", "--out", str(out), "--plot", str(png)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert "8 instances PP=5 TP=1 at 27.3 req/s" in p.stdout
    assert "4 instances PP=2 TP=2 at 50.5 req/s" in p.stdout
    assert "7 units PP=2" in p.stdout and "84 GPUs" in p.stdout and "56 GPUs" in p.stdout
    data = json.loads(out.read_text())
    for key in ("algorithm1", "algorithm2", "algorithm2_ratios"):
        d = data[key]
        for k in ("algorithm", "prefill", "decode", "total_gpus", "search_wall_s"):
            assert k in d
        for phase in ("prefill", "decode"):
            assert set(d[phase]) >= {"tp", "pp", "instances", "goodput_rps", "goodput_per_gpu"}
    assert data["algorithm2"]["unit"]["instances"] == 7
    assert data["gpus_saved_by_ratios"] == 84 - data["algorithm2_ratios"]["total_gpus"] > 0
    assert png.stat().st_size > 1000
