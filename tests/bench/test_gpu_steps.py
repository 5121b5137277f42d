"""The GPU check's steps part, dry-run on the CPU: step times of the tiny shape beside the simulator's
prediction, and the measured profile it writes (`<gpu>-measured.json`) driving the simulator."""

from __future__ import annotations

import json
import math
import time

import pytest

from fluidpd.bench.gpu_check import steps_check
from fluidpd.bench.gpu_check.context import CheckContext
from fluidpd.bench.host_profile.config import GPU_PARTS, PARTS, ProfileConfig, gpu_config
from fluidpd.bench.host_profile.steps import measure_steps, step_grid
from fluidpd.core.metrics import Slo
from fluidpd.latency.profiled import ProfiledModel, latency_model
from fluidpd.latency.roofline import RooflineModel
from fluidpd.policy.base import PolicyConfig
from fluidpd.sim.config import SimConfig
from fluidpd.sim.run import Setup, simulate
from fluidpd.specs import hardware
from fluidpd.specs.hardware import profiled_hardware, shipped_profile
from fluidpd.specs.models import MODELS, ModelSpec, get_model
from fluidpd.workload.trace import Trace

# the dry run's tiny shape (gpu_check.synthetic), named in the catalogue for the simulator's sake
TINY = ModelSpec("gpu-check-tiny", 2, 128, 4, 2, 32, 256, 1024, False, True, False, 4096)


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    """The steps check on the tiny shape on the CPU: (its result, the profile it wrote, seconds)."""
    import torch

    tmp = tmp_path_factory.mktemp("gpu_steps")
    ctx = CheckContext("cpu", tmp / "out", tmp / "work", tiny=True)
    ctx.out.mkdir()
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(MODELS._entries, TINY.name, TINY)
        t0 = time.monotonic()
        try:
            result = steps_check.check(ctx)
        finally:
            torch.set_num_threads(threads)  # the profile runs as one of its 4 workers would
        seconds = time.monotonic() - t0
        profile = json.loads((ctx.out / "h100-measured.json").read_text())
        yield result, profile, seconds, ctx.out


@pytest.fixture
def tiny_spec(monkeypatch):
    monkeypatch.setitem(MODELS._entries, TINY.name, TINY)
    return get_model(TINY.name)


def test_the_dry_run_measures_and_predicts_every_point(dry):
    result, profile, seconds, _ = dry
    assert result["ok"] and result["dry_run"] and result["kind"] == "h100" and seconds < 60
    points = result["points"]
    assert {p["kind"] for p in points} == {"prefill", "decode"} and not result["skipped"]
    for p in points:
        assert p["measured_s"] > 0 and p["predicted_s"] > 0 and math.isfinite(p["error"])
        assert p["error"] == pytest.approx(p["predicted_s"] / p["measured_s"] - 1)
    prefill = {(p["tokens"], p["prior"]) for p in points if p["kind"] == "prefill"}
    decode = {(p["batch"], p["context"]) for p in points if p["kind"] == "decode"}
    assert prefill == {(c, prior) for c in (16, 64, 256) for prior in (0, 64)}
    # a decode point's context is its sequences' mean over the timed steps (each step adds a token)
    nominal = {(b, n) for b in (1, 4, 16) for n in (32, 128)}
    assert {(b, n - 2) for b, n in decode} == nominal
    # the prediction is the 8B's on an H100: a decode alone is decode_time(batch, context)
    roofline = RooflineModel(get_model("llama-3.1-8b"), hardware.get_hardware("h100"))
    d = next(p for p in points if p["kind"] == "decode" and p["batch"] == 4)
    assert d["predicted_s"] == pytest.approx(roofline.decode_time(4, d["context"]))
    for kind in ("prefill", "decode"):
        s = result["summary"][kind]
        errors = [abs(p["error"]) for p in points if p["kind"] == kind]
        assert s["points"] == len(errors) and s["max_abs_error"] == max(errors)
        assert s["mean_abs_error"] == pytest.approx(sum(errors) / len(errors))
    assert result["mixed_points"] and result["profile"] == "h100-measured.json"
    assert len(profile["steps"]) == len(points) + len(result["mixed_points"])


def test_the_profile_marks_what_one_gpu_process_does_not_measure(dry):
    _, profile, _, _ = dry
    assert set(profile["measured_parts"]) == set(GPU_PARTS)
    for part in ("dispatch", "contention"):
        assert "not measured" in profile[part]["not_measured"]
    assert profile["contention"]["decode"] == [1.0] and profile["dispatch"]["decode_s"] == 0.0
    assert profile["device"]["type"] == "cpu" and profile["gpu_check"]["dry_run"]
    assert profile["model"]["spec"] == TINY.name and profile["engine"]["dtype"] == "bfloat16"
    assert profile["jitter"]["p50_s"] > 0 and profile["kv_transfer"]["bandwidth_Bps"] > 0


@pytest.fixture
def shipped(dry, monkeypatch):
    """The dry run's results folder as the shipped profiles (fluidpd/specs/profiles/)."""
    monkeypatch.setattr(hardware, "PROFILE_DIR", dry[3])
    shipped_profile.cache_clear()
    yield dry[1]
    monkeypatch.undo()
    shipped_profile.cache_clear()


def test_the_measured_profile_drives_a_simulation(shipped, tiny_spec):
    hw = profiled_hardware("h100-measured", shipped)
    lat = latency_model(tiny_spec, hw)
    assert isinstance(lat, ProfiledModel) and hw.mem_bytes == shipped["device"]["mem_bytes"]
    sim = lat.sim_config(SimConfig())
    assert sim.contention_decode == (1.0,) and sim.dispatch_decode_s == 0.0 and sim.step_noise_s
    setup = Setup(tiny_spec, hw, Slo(1.0, 0.1), SimConfig(n_workers=2), PolicyConfig(prefill_workers=1))
    trace = Trace("t", [0.0, 0.01, 0.02, 0.5], [200, 64, 300, 120], [8, 4, 6, 10])
    res = simulate(trace, "static-pd", setup)
    assert res.summary["completed"] == 4 and res.summary["ttft_p50_s"] > 0


def test_a_gpu_profile_is_the_gpu_s_memory(shipped, tiny_spec):
    """On a GPU the spec's memory is the device's, and the KV the simulator gives a worker is what
    that memory holds beside the weights (not the engine's default arena)."""
    gpu = shipped | {"device": {"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "mem_bytes": 85e9}}
    hw = profiled_hardware("h100-measured", gpu)
    assert hw.mem_bytes == 85e9 and hw.measured
    lat = ProfiledModel(tiny_spec, hw, gpu)
    assert lat.kv_blocks(16, 0.1) == RooflineModel.kv_blocks(lat, 16, 0.1) > gpu["model"]["kv_blocks"]
    assert ProfiledModel(tiny_spec, hw, shipped).kv_blocks(16) == shipped["model"]["kv_blocks"]  # a CPU's


def test_the_gpu_grid_and_its_deadline():
    cfg = gpu_config()
    assert cfg.chunks[-1] == 8192 and cfg.batches[-1] == 256 and cfg.contexts == (128, 1024, 4096)
    grid = step_grid(cfg, 16382)
    kinds = [p["kind"] for p in grid]
    # the first prior's chunks, then the decodes, then the other priors' chunks (a short budget cuts those first)
    assert kinds == ["prefill"] * 7 + ["decode"] * 18 + ["prefill"] * 7
    assert {p["prior"] for p in grid[-7:]} == {4096}
    capped = step_grid(ProfileConfig(**{**cfg.__dict__, "max_decode_tokens": 262144}), 8190)
    assert {"kind": "decode", "batch": 128, "context": 4096} not in capped
    assert {"kind": "prefill", "tokens": 8192, "prior": 4096} not in capped

    late = {"kind": "prefill", "tokens": 8192, "prior": 4096, "why": "time budget"}
    profile = {"model": {"max_model_len": 16384}, "config": {"max_decode_tokens": 262144}, "steps_skipped": [late]}
    assert [(p.get("batch"), p.get("context"), p["why"][:7]) for p in steps_check.skipped(cfg, profile)] == [
        (128, 4096, "over th"),
        (256, 4096, "over th"),
        (None, None, "time bu"),
    ]

    class Engine:
        max_model_len = 4096

    skipped: list = []
    bench = type("Bench", (), {"engine": Engine()})()
    assert measure_steps(bench, ProfileConfig(), lambda: None, time.monotonic() - 1, skipped) == []  # type: ignore[arg-type]
    assert skipped == [p | {"why": "time budget"} for p in step_grid(ProfileConfig(), 4094)]


def test_a_failing_point_is_skipped_and_the_others_measured(monkeypatch):
    """With keep_going (the GPU check), a point whose step raises (out of memory) is recorded, its
    requests aborted, and the grid goes on; without it, the error is raised."""
    from fluidpd.bench.host_profile import steps

    def prefill(bench, cfg, c, prior):
        if c == 64:
            raise RuntimeError("CUDA out of memory")
        return {"kind": "prefill", "tokens": c}

    monkeypatch.setattr(steps, "_prefill_point", prefill)
    monkeypatch.setattr(steps, "_decode_points", lambda bench, cfg, b, n: [{"kind": "decode", "batch": b}])
    recovered = []
    engine = type("Engine", (), {"max_model_len": 1024})()
    bench = type("Bench", (), {"engine": engine, "recover": lambda self: recovered.append(1)})()
    cfg = ProfileConfig(chunks=(16, 64, 256), priors=(0,), batches=(1, 2), contexts=(32,))
    skipped: list = []
    points = measure_steps(bench, cfg, lambda: None, None, skipped, keep_going=True)  # type: ignore[arg-type]
    assert [p.get("tokens", p.get("batch")) for p in points] == [16, 256, 1, 2] and recovered == [1]
    assert skipped == [{"kind": "prefill", "tokens": 64, "prior": 0, "why": "RuntimeError: CUDA out of memory"}]
    with pytest.raises(RuntimeError, match="out of memory"):
        measure_steps(bench, cfg, lambda: None)  # type: ignore[arg-type]


def test_fluidpd_profile_on_cuda_takes_the_gpu_grid_and_parts(dry, tmp_path, monkeypatch, capsys):
    """`fluidpd profile --device cuda` (its measurement replaced by the dry run's profile: no GPU here)."""
    from fluidpd.bench.host_profile import measure
    from fluidpd.cli import main

    calls = []
    monkeypatch.setattr(measure, "measure_profile", lambda e, c, **kw: calls.append((e, c, kw)) or dry[1])
    out = tmp_path / "h100-measured.json"
    assert main(["profile", "--device", "cuda", "--model", "m", "--load-format", "dummy", "--out", str(out)]) == 0
    ((engine, cfg, kw),) = calls
    assert engine.device == "cuda" and engine.dtype_name == "bfloat16" and kw["parts"] == GPU_PARTS
    assert cfg == gpu_config() and kw["base"] is None
    assert json.loads(out.read_text()) == dry[1] and "contention: not measured" in capsys.readouterr().out
    main(["profile", "--device", "cuda", "--max-decode-tokens", "4096", "--repeats", "2", "--out", str(out)])
    assert calls[1][1] == gpu_config(max_decode_tokens=4096, repeats=2)
    main(["profile", "--load-format", "dummy", "--out", str(tmp_path / "cpu.json")])
    assert calls[2][1] == ProfileConfig() and calls[2][2]["parts"] == PARTS
