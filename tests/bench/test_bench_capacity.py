"""The real-engine benchmarks' load from this host's capacity: the same requests on every host, a
host's speed as the simulator's step scales, and a saturation rate that follows the host's speed."""

from __future__ import annotations

import numpy as np
import pytest

from fluidpd.bench.capacity import HostSpeed, Window, best_split, host_setup, load_for
from fluidpd.core.metrics import Slo
from fluidpd.latency.shape import StepShape
from fluidpd.workload.registry import load_trace

SLO = Slo(5.0, 0.5)
SPEC, DURATION = "azure_code:0.1@9100", 150.0


def profile(prefill_512_s: float, decode_step_s: float = 0.02) -> dict:
    return {"prefill_512_s": prefill_512_s, "decode_step_s": decode_step_s, "threads": 1}


def test_a_window_is_the_same_requests_at_any_rate():
    window, rate = Window.parse(SPEC, DURATION)
    assert (window.start_s, window.span_s, rate) == pytest.approx((910.0, 15.0, 0.1))
    reference = load_trace("azure_code").shaped(0.1, DURATION, None, 9100)
    at_ref, faster = window.at(0.1), window.at(0.4)
    assert np.array_equal(at_ref.prompt_len, reference.prompt_len) and len(at_ref) == 182
    assert np.array_equal(faster.prompt_len, at_ref.prompt_len)
    assert np.allclose(faster.arrival_s * 4, at_ref.arrival_s)
    assert window.before() == Window("azure_code", 895.0, 15.0) and window.after(3.0).start_s == 925.0
    assert window.spec(0.1) == "azure_code:0.1@9100"
    clipped = window.at(0.1, max_model_len=512)
    assert (clipped.prompt_len + clipped.output_len <= 512).all() and len(clipped) == len(at_ref)


def test_a_host_as_fast_as_the_profile_has_unit_scales():
    model = host_setup(4, SLO).roofline()
    prefill, decode = StepShape(), StepShape()
    prefill.add_chunk(512, 0)
    decode.add_decodes(1, 5)
    same = HostSpeed.of(profile(model.step_time(prefill), model.step_time(decode)), 4, SLO)
    assert same.scales == pytest.approx({"decode": 1.0, "prefill": 1.0})
    slower = HostSpeed.of(profile(2 * model.step_time(prefill), 3 * model.step_time(decode)), 4, SLO)
    assert slower.scales == pytest.approx({"decode": 3.0, "prefill": 2.0})
    assert slower.prefill_tok_s == pytest.approx(512 / (2 * model.step_time(prefill)))
    assert HostSpeed.median_of([profile(1.0), profile(3.0), profile(2.0)], 4, SLO).prefill_512_s == 2.0


def test_the_saturation_rate_follows_the_hosts_speed():
    window, rate = Window.parse(SPEC, DURATION)
    clip = {"max_requests": 300, "max_model_len": 512}
    fast, slow = HostSpeed.of(profile(1.1, 0.011), 4, SLO), HostSpeed.of(profile(2.2, 0.022), 4, SLO)
    at_fast = load_for(window, 4, SLO, fast, rate, 1.0, **clip)
    at_slow = load_for(window, 4, SLO, slow, rate, 1.0, **clip)
    assert at_fast.saturation["reached"] and at_slow.saturation["reached"]
    assert at_fast.rate > 1.5 * at_slow.rate  # twice the speed: well over the load
    half = load_for(window, 4, SLO, slow, rate, 0.5, **clip)
    assert half.rate == pytest.approx(0.5 * at_slow.rate) and "0.5 x this host's saturation" in half.describe()
    fixed = load_for(window, 4, SLO, slow, rate, 1.0, fixed_rate=0.1)
    assert (fixed.rate, fixed.share, fixed.saturation) == (0.1, None, None)
    assert 1 <= best_split(window, at_slow.rate, 4, SLO, slow, **clip) <= 3
