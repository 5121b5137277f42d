"""The profiled latency model: its fit, its checks, and the simulator's contention from a profile."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from fluidpd.latency.profiled import ProfiledModel, _nnls, fit_steps, latency_model, step_cv
from fluidpd.latency.roofline import RooflineModel
from fluidpd.latency.shape import StepShape
from fluidpd.sim.config import SimConfig
from fluidpd.specs.hardware import get_hardware, shipped_profile
from fluidpd.specs.models import get_model


def _true_time(s: dict) -> float:
    """A made-up host: 10 ms fixed, GEMMs flat to 16 tokens then 0.2 ms per token, attention linear."""
    tok = s["prefill_tokens"] + s["decode_tokens"]
    rows = s["prefill_seqs"] + s["decode_tokens"]
    return (
        0.010
        + 2e-4 * max(0, tok - 16)
        + 3e-4 * rows
        + 1e-4 * s["prefill_seqs"]
        + 2e-9 * s["prefill_attn_pairs"]
        + 5e-8 * s["decode_ctx"]
    )


def _points(rng: random.Random, n: int) -> list[dict]:
    pts = []
    for _ in range(n):
        s = StepShape()
        if rng.random() < 0.5:
            s.add_chunk(rng.choice([8, 32, 128, 512, 2048]), rng.choice([0, 512]))
        if rng.random() < 0.6 or not s.tokens:
            b = rng.choice([1, 4, 16, 32])
            s.add_decodes(b, b * rng.choice([64, 512, 2048]))
        shape = {k: getattr(s, k) for k in s.__slots__}
        pts.append({"kind": "x", "shape": shape, "seconds": _true_time(shape)})
    return pts


def test_fit_predicts_held_out_shapes():
    rng = random.Random(0)
    fit = fit_steps(_points(rng, 80))
    assert fit.max_rel_error < 0.05
    errors = [abs(fit(p["shape"]) / p["seconds"] - 1) for p in _points(rng, 200)]
    assert float(np.median(errors)) < 0.02 and max(errors) < 0.10
    dense = [v for k, v in fit.terms().items() if k.startswith("dense@")]
    assert dense == sorted(dense)  # never decreasing in tokens
    assert all(c >= 0 for c in fit.coeffs)


def test_fit_needs_points():
    with pytest.raises(ValueError, match="at least 8"):
        fit_steps(_points(random.Random(1), 5))


def test_nnls_matches_a_known_solution():
    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    b = np.array([2.0, -1.0, 1.0])  # unconstrained optimum has x2 < 0
    x = _nnls(a, b)
    assert x[1] == 0 and x[0] == pytest.approx(1.5)


def test_step_cv_reproduces_the_measured_tail():
    jitter = {"p50_s": 0.02, "p999_s": 0.03}
    sigma = math.sqrt(math.log1p(step_cv(jitter) ** 2))
    assert math.exp(3.09 * sigma) == pytest.approx(1.5, rel=1e-6)
    assert step_cv({"p50_s": 0.02, "p999_s": 0.02}) == 0.0


def test_contention_factor():
    cfg = SimConfig(contention_decode=(1.0, 1.2, 1.9), contention_prefill=(1.0, 1.5))
    assert cfg.contention(True, 1) == 1.0 and cfg.contention(True, 3) == 1.9
    assert cfg.contention(False, 2) == 1.5 and cfg.contention(False, 4) == pytest.approx(3.0)
    assert cfg.contention(True, 3, cross=2) == 1.9  # no cross table: as among its own kind
    cross = SimConfig(contention_decode=(1.0, 1.2, 1.9), contention_decode_cross=(1.0, 1.6, 2.5))
    assert cross.contention(True, 3, cross=2) == pytest.approx(2.5)  # both others prefill
    assert cross.contention(True, 3, cross=1) == pytest.approx((1.9 + 2.5) / 2)  # half of them
    assert cross.contention(True, 1, cross=0) == 1.0
    with pytest.raises(ValueError, match="> 0"):
        SimConfig(contention_decode=(1.0, 0.0))


def test_shipped_cpu_host_profile_drives_the_simulator():
    profile = shipped_profile("cpu-host")
    assert profile is not None and profile["model"]["spec"] == "smollm2-135m"
    hw = get_hardware("cpu-host")
    assert hw.measured
    model = get_model("smollm2-135m", "fp32")
    lat = latency_model(model, hw)
    assert isinstance(lat, ProfiledModel)
    assert lat.fit.mean_rel_error < 0.10  # on its own points
    errors = [abs(lat.step_time(StepShape(**p["shape"])) / p["seconds"] - 1) for p in profile["steps"]]
    assert float(np.median(errors)) < 0.05 and np.mean(np.array(errors) < 0.15) >= 0.9
    assert lat.kv_blocks(16) == profile["model"]["kv_blocks"]
    sim = lat.sim_config(SimConfig())
    assert sim.contention_decode == tuple(profile["contention"]["decode"])
    assert sim.contention_decode_cross == tuple(profile["contention"]["decode_cross"])
    # the measured noise replaces the log-normal factor, unless a jitter is asked for
    assert sim.step_noise_s == tuple(profile["jitter"]["excess_s"]) and sim.step_jitter_cv == 0
    assert lat.sim_config(SimConfig(step_jitter_cv=0.1)).step_noise_s == ()
    assert 0 < sim.dispatch_decode_s < 0.05 and 0 < sim.dispatch_prefill_s < 0.05
    # a shared-memory hand-off is both workers' CPU work: the export share on the source, the rest on the destination
    assert sim.kv_export_share == profile["kv_transfer"]["export_share"] > 0
    assert sim.kv_export_share + sim.kv_import_share == pytest.approx(1.0)
    assert isinstance(latency_model(model, get_hardware("h100")), RooflineModel)
    with pytest.raises(ValueError, match="profiled for smollm2-135m"):
        latency_model(get_model("llama-3.1-8b"), hw)
    with pytest.raises(ValueError, match="tp = pp = 1"):
        latency_model(model, hw, tp=2)
