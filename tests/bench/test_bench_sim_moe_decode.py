"""benchmarks/simulation/sim_moe_decode.py: its rows and its fit check."""

import pytest
from benchscript import load

from fluidpd.latency.roofline import RooflineModel
from fluidpd.specs.hardware import get_hardware
from fluidpd.specs.models import get_model

bench = load("sim_moe_decode")
H100 = get_hardware("h100")


def test_rows_stream_the_touched_experts():
    mixtral = get_model("mixtral-8x7b", "fp8")
    r = RooflineModel(mixtral, H100)
    one, many = bench.row(r, 1, 2048), bench.row(r, 64, 2048)
    assert one["experts"] == pytest.approx(2.0) and many["experts"] == pytest.approx(8.0, rel=1e-6)
    assert one["weights_gb"] == pytest.approx(mixtral.active_params / 1e9)
    assert many["weights_gb"] == pytest.approx(mixtral.params / 1e9, rel=1e-6)
    assert many["ms_per_token"] < one["ms_per_token"] == one["step_ms"]


def test_fits_one_gpu():
    assert bench.fits(RooflineModel(get_model("qwen3-30b-a3b", "fp8"), H100))
    assert not bench.fits(RooflineModel(get_model("llama-3.3-70b", "bf16"), H100))
