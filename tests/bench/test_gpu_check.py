"""The GPU check's dry run: `scripts/gpu_check.sh` on the CPU with the tiny shapes runs every check
the GPU run does, through the same code, so the script cannot rot between GPU runs."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fluidpd.bench.gpu_check import imports_check
from fluidpd.bench.gpu_check.checks import CHECKS
from fluidpd.bench.gpu_check.context import CheckContext
from fluidpd.bench.gpu_check.run import run_checks

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_dry_run_passes_every_check_and_records_its_figures(tmp_path):
    out = tmp_path / "out"
    env = os.environ | {"DEVICE": "cpu", "PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    cmd = ["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(out), "--tiny", "--work", str(tmp_path / "work")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    record = json.loads((out / "gpu_check.json").read_text())
    checks = record["checks"]
    assert proc.returncode == 0, (proc.stdout[-3000:], {n: c.get("error") for n, c in checks.items()})
    assert list(checks) == list(CHECKS.names()) and record["ok"] and record["tiny"]
    assert checks["imports"]["versions"]["torch"] and not checks["imports"]["missing"]
    assert checks["engine"]["passed"] > 0 and not checks["engine"]["failed"]
    assert checks["generate"]["tokens"] > 0
    assert checks["serve"]["tokens"] > 0 and checks["serve"]["equal"]
    points = checks["steps"]["points"]
    assert {p["kind"] for p in points} == {"prefill", "decode"}
    assert all(p["measured_s"] > 0 and p["predicted_s"] > 0 and math.isfinite(p["error"]) for p in points)
    assert (out / "gpu_check.log").read_text().strip().endswith(f"{out / 'gpu_check.json'}")


def test_a_failed_imports_check_ends_the_run_and_says_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setitem(imports_check.PACKAGES, "no_such_module_fluidpd", "no-such-dist")
    ctx = CheckContext("cpu", tmp_path / "out", tmp_path / "work", tiny=True)
    record = run_checks(ctx, CHECKS.names())
    assert not record["ok"]
    assert "no_such_module_fluidpd" in record["checks"]["imports"]["missing"]
    assert all(r == {"ok": False, "skipped": "imports failed"} for n, r in record["checks"].items() if n != "imports")
    assert json.loads((ctx.out / "gpu_check.json").read_text())["checks"] == record["checks"]


def test_cuda_without_a_gpu_is_refused_before_anything_runs(tmp_path):
    cmd = [sys.executable, "-m", "fluidpd.bench.gpu_check", "--device", "cuda", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "torch sees no GPU" in proc.stderr
    assert not (tmp_path / "gpu_check.json").exists()


def test_the_bundle_pins_what_the_import_check_needs_beyond_the_gpu_image():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_bundle.py"), "--check"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    pins = dict(line.split("==") for line in proc.stdout.split())
    for dist in ("gguf", "llguidance", "fastapi", "uvicorn", "pydantic"):
        assert dist in pins and dist in imports_check.PACKAGES.values()
    assert all(v[0].isdigit() for v in pins.values())


def test_the_step_fidelity_benchmark_dry_run_ends_with_its_headline(tmp_path):
    script = ROOT / "benchmarks" / "engine" / "gpu_step_fidelity.py"
    cmd = [sys.executable, str(script), "--device", "cpu", "--tiny", "--out", str(tmp_path / "o"), "--work",
           str(tmp_path / "w")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=os.environ | {"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("gpu step fidelity (dry run") and "prefill mean |error|" in last and last.endswith("ok")
    result = json.loads((tmp_path / "o" / "steps.json").read_text())
    assert result["ok"] and (tmp_path / "o" / "h100-measured.json").is_file()
