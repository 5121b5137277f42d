"""`fluidpd experiment table1 --model`: the seed's cluster with another model, or a clear error if it does not fit."""

import subprocess
import sys

import pytest

from fluidpd.bench.experiments.common import MODEL, check_fits, setup
from fluidpd.bench.experiments.table1.run import run_table1


def test_the_default_and_a_moe_fit_one_h100_at_fp8():
    check_fits(MODEL)
    check_fits("qwen3-30b-a3b")
    assert setup(model="qwen3-30b-a3b").model.name == "qwen3-30b-a3b"
    assert setup().model.name == MODEL == "llama-3.3-70b"


def test_a_moe_too_big_for_one_gpu_is_a_clear_error():
    with pytest.raises(ValueError, match=r"235\.1 GB\) do not fit in 1 x h100.*one qwen3-235b-a22b fp8 worker per GPU"):
        check_fits("qwen3-235b-a22b")
    cmd = [sys.executable, "-m", "fluidpd.cli", "experiment", "table1", "--quick", "--model", "qwen3-235b-a22b"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "do not fit" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.slow
def test_table1_runs_every_system_on_the_model_asked_for():
    res, _ = run_table1(
        ["azure_conv"], scales=(1.0,), window_s=60.0, goodput=False, progress=False, model="qwen3-30b-a3b"
    )
    setting = res["setting"]
    assert setting["model"] == "qwen3-30b-a3b" and setting["weight_bytes"] == 30_532_122_624
    assert setting["kv_tokens_per_worker"] > 800_000  # 30.5 GB of fp8 weights leave ~44 GB: 48 KiB of KV a token
    assert len(res["table1"]["azure_conv"]) == 9
