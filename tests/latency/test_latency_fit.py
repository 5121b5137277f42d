import subprocess
import sys

import pytest

from fluidpd.latency.fit import Polynomial, fit_polynomial, fit_prefill_time
from fluidpd.latency.roofline import RooflineModel
from fluidpd.specs.hardware import get_hardware
from fluidpd.specs.models import get_model


def test_fit_recovers_exact_quadratic():
    xs = [1, 2, 3, 5, 8, 13]
    p = fit_polynomial(xs, [3 * x * x - 2 * x + 7 for x in xs])
    assert p.coeffs == pytest.approx((3, -2, 7), abs=1e-9)
    assert all(type(c) is float for c in p.coeffs)
    assert p(10) == pytest.approx(287)
    with pytest.raises(ValueError):
        fit_polynomial([1, 2], [1, 2], degree=2)


def test_horner_and_floor():
    p = Polynomial((2.0, 1.0))  # 2x + 1
    assert p(0) == 1.0 and p(3) == 7.0
    assert Polynomial((2.0, 1.0), floor=5.0)(1) == 5.0


def test_inverse_max_boundaries():
    p = Polynomial((2.0, 1.0))
    assert p.inverse_max(7.0, hi=100) == 3  # p(3) == budget exactly
    assert p.inverse_max(6.99, hi=100) == 2
    assert p.inverse_max(3.0, hi=100) == 1  # lo itself
    assert p.inverse_max(2.99, hi=100) == 0  # nothing fits
    assert p.inverse_max(201.0, hi=100) == 100  # capped at hi
    assert p.inverse_max(1e9, hi=0) == 0
    assert p.inverse_max(1.0, hi=10, lo=0) == 0
    for budget in (5.0, 50.5, 123.0):
        assert p.inverse_max(budget, hi=100) == max(x for x in range(0, 101) if x == 0 or p(x) <= budget)


def test_prefill_fit_tracks_roofline():
    r = RooflineModel(get_model("llama-3.1-8b"), get_hardware("h100"))
    f = fit_prefill_time(r, max_tokens=8192)
    for s in (1, 16, 100, 256, 300, 512, 1000, 2048, 3000, 4096, 6000, 8192):
        assert f(s) == pytest.approx(r.prefill_time(s), rel=0.05), s
    assert all(f(s) <= f(s + 64) for s in range(1, 8192, 64))


def test_chunk_size_from_slack():
    # FluidToken: C_chunk = argmax_c f_P(c) <= slack.
    r = RooflineModel(get_model("llama-3.3-70b", "fp8"), get_hardware("h100"), tp=2)
    f = fit_prefill_time(r, max_tokens=4096)
    slack = 0.040
    c = f.inverse_max(slack, hi=4096)
    assert 1 <= c < 4096
    assert f(c) <= slack < f(c + 1)
    assert r.prefill_time(c) == pytest.approx(slack, rel=0.06)


def test_polynomial_evaluation_does_not_import_numpy():
    code = (
        "import sys; from fluidpd.latency.fit import Polynomial; "
        "p = Polynomial((1.0, 2.0, 3.0)); assert p(2) == 11.0 and p.inverse_max(11.0, 50) == 2; "
        "assert 'numpy' not in sys.modules, 'numpy imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_polynomial_is_hashable_value():
    p = Polynomial([1, 2])
    assert p.coeffs == (1.0, 2.0) and hash(p) == hash(Polynomial((1.0, 2.0)))
    with pytest.raises(ValueError):
        Polynomial(())


def test_chunk_fit_follows_the_knee_where_fluidtoken_sizes_chunks():
    from fluidpd.latency.fit import fit_chunk_time
    from fluidpd.latency.shape import StepShape

    r = RooflineModel(get_model("llama-3.3-70b", "fp8"), get_hardware("h100"))
    g = fit_chunk_time(r)
    base = StepShape(decode_tokens=1, decode_ctx=1024)
    t0 = r.step_time(base)
    checked = 0
    for c in range(16, 1024, 8):
        s = StepShape(decode_tokens=1, decode_ctx=1024)
        s.add_chunk(c, 0)
        true = r.step_time(s) - t0
        if true <= 0.02:  # what fits in a 40 ms TBT's slack
            assert abs(g(1 + c) - g(1) - true) <= 0.002, c  # relative-error fitting missed by 3 ms here
            checked += 1
    assert checked > 10
