import pytest

from fluidpd.specs.hardware import HARDWARE_NAMES, get_hardware


def test_catalog():
    assert set(HARDWARE_NAMES) == {"h100", "h200", "a100-80g", "cpu-host"}
    h100, h200, a100 = get_hardware("h100"), get_hardware("h200"), get_hardware("a100-80g")
    assert (h100.mem_bytes, h100.mem_bw, h100.nvlink_bw) == (80e9, 3.35e12, 900e9)
    assert (h200.mem_bytes, h200.mem_bw) == (141e9, 4.8e12)
    assert dict(h200.peak_flops) == dict(h100.peak_flops)
    assert (a100.mem_bw, a100.nvlink_bw) == (2.039e12, 600e9)
    assert h100.flops("bf16") == 989e12 and h100.flops("fp8") == 1979e12 and h100.flops("fp32") == 494.5e12
    assert a100.flops("fp16") == 312e12
    assert h100.internode_bw == 50e9


def test_ridge_points_match_seed():
    assert get_hardware("a100-80g").ridge_point("fp16") == pytest.approx(153, abs=1)  # paper: 156 (2 TB/s)
    assert get_hardware("h100").ridge_point("bf16") == pytest.approx(295, abs=1)


def test_fp8_on_a100_raises():
    with pytest.raises(ValueError, match="fp8"):
        get_hardware("a100-80g").flops("fp8")


def test_measured_flag_and_immutability():
    assert get_hardware("h100").measured
    cpu = get_hardware("cpu-host")
    assert cpu.measured  # from the shipped host profile (specs/profiles/cpu-host.json)
    assert 1e9 < cpu.mem_bw < 1e12 and 1e9 < cpu.flops("fp32") < 1e13
    with pytest.raises(TypeError):
        cpu.peak_flops["fp8"] = 1.0


def test_unknown_hardware():
    with pytest.raises(ValueError, match="h100"):
        get_hardware("tpu-v5")
    assert get_hardware("H100") is get_hardware("h100")
