import pytest

from fluidpd.sim.goodput import goodput_rate_scale


def test_binary_search_finds_the_knee_from_either_side():
    calls = []

    def attain(x):
        calls.append(x)
        return 1.0 if x <= 3.3 else 0.5

    assert goodput_rate_scale(attain, start=1.0, iters=12) == pytest.approx(3.3, rel=0.01)
    assert goodput_rate_scale(attain, start=20.0, iters=12) == pytest.approx(3.3, rel=0.01)
    assert goodput_rate_scale(lambda x: 0.0, max_steps=4) == 0.0
    with pytest.raises(ValueError):
        goodput_rate_scale(attain, target=1.5)
