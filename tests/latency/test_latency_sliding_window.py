"""Sliding-window attention in the roofline: windowed layers read and attend to at most their window."""

import dataclasses

import pytest

from fluidpd.latency.roofline import RooflineModel
from fluidpd.latency.shape import StepShape
from fluidpd.specs.hardware import get_hardware
from fluidpd.specs.models import get_model

H100 = get_hardware("h100")
GEMMA = get_model("gemma-3-27b")
FULL = dataclasses.replace(GEMMA, sliding_window=0, sliding_layers=0)  # the same model, every layer global


def test_decode_kv_reads_grow_only_with_the_global_layers_past_the_window():
    windowed, full = RooflineModel(GEMMA, H100), RooflineModel(FULL, H100)
    grow_w = windowed.decode_time(32, 65536) - windowed.decode_time(32, 32768)
    grow_f = full.decode_time(32, 65536) - full.decode_time(32, 32768)
    assert grow_w == pytest.approx(grow_f * 10 / 62, rel=1e-9)  # 10 of 62 layers global
    assert windowed.decode_time(32, 512) == pytest.approx(full.decode_time(32, 512), rel=1e-12)  # inside it


def test_prefill_attention_bounded_by_the_window():
    windowed, full = RooflineModel(GEMMA, H100), RooflineModel(FULL, H100)
    assert windowed.prefill_time(512) == pytest.approx(full.prefill_time(512), rel=1e-12)
    assert windowed.prefill_time(16384) < full.prefill_time(16384)
    s = StepShape()
    s.add_chunk(2048, 30000)
    t = StepShape()
    t.add_chunk(2048, 60000)
    assert windowed.step_time(t) - windowed.step_time(s) < 0.2 * (full.step_time(t) - full.step_time(s))


def test_handoff_bytes_cap_the_windowed_layers():
    r = RooflineModel(GEMMA, H100)
    assert r.kv_bytes(512) == 512 * GEMMA.kv_bytes_per_token
    assert r.kv_bytes(8192) == GEMMA.kv_bytes(8192) < 8192 * GEMMA.kv_bytes_per_token / 2
    # block capacity stays per token for every layer: conservative for the windowed ones
    assert r.capacity_kv_tokens() == RooflineModel(FULL, H100).capacity_kv_tokens()
