"""The envelope: fluidpd against the best other system at each point, per metric, and its plot."""

import pytest

from fluidpd.bench.experiments.envelope import EnvelopePoint, describe, envelope_plot, envelope_points


def _row(joint, strict, **kw):
    return {"attainment": joint, "strict_attainment": strict, **kw}


POINTS = {
    "a x1": {
        "fluidpd": _row(0.95, 0.90, switches_per_hour=12.0),
        "chunked": _row(0.96, 0.80),
        "static-pd": _row(0.90, 0.92),
        "oracle": _row(1, 1),
    },
    "a x2": {"fluidpd": _row(0.50, 0.50, switches_per_hour=48.0), "chunked": _row(0.40, 0.30)},
    "b x1": {"chunked": _row(0.9, 0.9)},  # fluidpd did not run here: no point
}


def test_each_metric_is_held_against_its_own_best_rival_and_oracles_are_left_out():
    points = envelope_points(POINTS, "fluidpd", ["chunked", "static-pd"])
    assert [p.point for p in points] == ["a x1", "a x2"]
    p = points[0]
    assert (p.best_joint_system, p.best_strict_system) == ("chunked", "static-pd")
    assert p.joint_margin_pp == pytest.approx(-1.0) and p.strict_margin_pp == pytest.approx(-2.0)
    assert points[1].joint_margin_pp == pytest.approx(10.0)
    assert EnvelopePoint.from_json(p.as_json()) == p
    line = describe(points)
    assert "at 1 of 2 points" in line and "worst joint -1.0 pp at a x1 (vs chunked)" in line
    assert "role switches median 30/h, most 48/h at a x2" in line
    old = {k: v for k, v in p.as_json().items() if k != "switches_per_hour"}  # a JSON from before the rate
    assert "role switches" not in describe([EnvelopePoint.from_json(old)])


def test_the_plot_is_written(tmp_path):
    points = envelope_points(POINTS, "fluidpd", ["chunked", "static-pd"])
    path = envelope_plot(points, tmp_path / "envelope.png", "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
