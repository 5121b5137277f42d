"""`fluidpd place`, and `--placement` in `fluidpd simulate`, as a user runs them."""

import json
import subprocess
import sys

import pytest

PLACE = [
    "place",
    "--model",
    "llama-3.1-8b",
    "--gpu",
    "h100",
    "--nodes",
    "1",
    "--gpus-per-node",
    "2",
    "--trace",
    "azure_conv",
    "--duration",
    "300",
    "--ttft-slo",
    "2",
    "--tpot-slo",
    "0.1",
    "--requests",
    "100",
    "--iters",
    "3",
    "--jobs",
    "1",
]
SIM = [
    "simulate",
    "--trace",
    "azure_code",
    "--policy",
    "static-pd",
    "--model",
    "llama-3.1-8b",
    "--gpu",
    "h100",
    "--workers",
    "4",
    "--ttft-slo",
    "2",
    "--tbt-slo",
    "0.05",
    "--duration",
    "120",
]


def fluidpd(*args):
    return subprocess.run([sys.executable, "-m", "fluidpd.cli", *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def placed(tmp_path_factory):
    d = tmp_path_factory.mktemp("place")
    p = fluidpd(*PLACE, "--rate", "6", "--out", str(d / "p.json"), "--plot", str(d / "p.png"))
    assert p.returncode == 0, p.stderr
    return p, d


def test_place_prints_the_choice_and_writes_the_documented_json(placed):
    p, d = placed
    assert "Algorithm 1" in p.stdout and "top prefill candidates" in p.stdout
    data = json.loads((d / "p.json").read_text())
    assert data["algorithm"] == 1
    for phase in ("prefill", "decode"):
        plan = data[phase]
        assert set(plan) >= {"tp", "pp", "instances", "goodput_rps", "goodput_per_gpu"}
        assert plan["instances"] * plan["goodput_rps"] >= 6.0  # n = ceil(R / goodput)
        assert plan["tp"] * plan["pp"] <= 2
    assert data["total_gpus"] == sum(
        data[p]["instances"] * data[p]["tp"] * data[p]["pp"] for p in ("prefill", "decode")
    )
    assert data["search_wall_s"] > 0 and data["workload"]["requests"] > 0
    assert (d / "p.png").stat().st_size > 1000


def test_a_placement_file_sets_the_simulated_split(placed):
    _, d = placed
    p = fluidpd(*SIM, "--placement", str(d / "p.json"))
    assert p.returncode == 0, p.stderr
    assert "placement: " in p.stderr and "from " in p.stderr


def test_placement_auto_searches_the_history_before_the_window():
    p = fluidpd(*SIM, "--start", "600", "--placement", "auto")
    assert p.returncode == 0, p.stderr
    assert "auto: static-pd attainment" in p.stderr and "history" in p.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["place"], "missing --model"),
        ([*PLACE, "--algorithm", "3"], "invalid choice"),
        ([*PLACE, "--attainment", "2"], "attainment"),
        ([*SIM, "--placement", "auto"], "--start > 0"),
        ([*SIM, "--placement", "/nonexistent.json"], "No such file"),
    ],
)
def test_bad_input_is_a_clear_error(args, message):
    p = fluidpd(*args)
    assert p.returncode == 2
    assert message in p.stderr
    assert "Traceback" not in p.stderr


def test_places_a_mixture_of_experts(tmp_path):
    out = tmp_path / "moe.json"
    p = fluidpd(*PLACE, "--model", "qwen3-30b-a3b", "--rate", "6", "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert "qwen3-30b-a3b bf16 on 1 x 2 h100" in p.stdout
    data = json.loads(out.read_text())
    assert data["prefill"]["goodput_rps"] > 0 and data["decode"]["goodput_rps"] > 0
