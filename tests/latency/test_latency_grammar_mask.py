"""Structured outputs in the latency models: a masked row costs its mask on top of the step."""

from __future__ import annotations

import pytest

from fluidpd.latency.config import LatencyConfig
from fluidpd.latency.profiled import latency_model
from fluidpd.latency.roofline import RooflineModel
from fluidpd.latency.shape import StepShape
from fluidpd.specs.hardware import get_hardware
from fluidpd.specs.models import get_model


def _decode(masked: int) -> StepShape:
    s = StepShape(decode_tokens=8, decode_ctx=8 * 1000)
    s.masked_rows = masked
    return s


def test_the_roofline_prices_each_masked_row():
    m = RooflineModel(get_model("llama-3.1-8b"), get_hardware("h100"), config=LatencyConfig(grammar_mask_s=1e-4))
    assert m.step_time(_decode(8)) - m.step_time(_decode(0)) == pytest.approx(8e-4)
    assert m.stage_time(_decode(3)) - m.stage_time(_decode(0)) == pytest.approx(3e-4)


def test_the_cpu_host_profile_prices_them_too():
    m = latency_model(get_model("smollm2-135m", "fp32"), get_hardware("cpu-host"))
    assert m.step_time(_decode(4)) > m.step_time(_decode(0))
    assert StepShape() == StepShape(masked_rows=0)
