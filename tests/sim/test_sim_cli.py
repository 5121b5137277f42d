"""`fluidpd simulate` as a user runs it."""

import json
import subprocess
import sys

import pytest

BASE = [
    "simulate",
    "--model",
    "llama-3.1-8b",
    "--gpu",
    "h100",
    "--workers",
    "4",
    "--ttft-slo",
    "1",
    "--tbt-slo",
    "0.05",
]


def fluidpd(*args):
    return subprocess.run([sys.executable, "-m", "fluidpd.cli", *args], capture_output=True, text=True, timeout=300)


def test_writes_json_rows_with_the_documented_keys_and_plots(tmp_path):
    out = tmp_path / "r.json"
    p = fluidpd(
        *BASE,
        "--trace",
        "azure_code",
        "--duration",
        "120",
        "--policy",
        "colocated,static-pd",
        "--prefill-workers",
        "1",
        "--out",
        str(out),
        "--plot",
        str(tmp_path / "plots"),
    )
    assert p.returncode == 0, p.stderr
    rows = json.loads(out.read_text())
    assert [r["policy"] for r in rows] == ["colocated", "static-pd"]
    keys = {
        "policy",
        "requests",
        "completed",
        "attainment",
        "strict_attainment",
        "ttft_p50_s",
        "ttft_p99_s",
        "tbt_p50_s",
        "tbt_p99_s",
        "tpot_mean_s",
        "throughput_tok_s",
        "sim_wall_s",
    }
    for r in rows:
        assert keys <= r.keys()
        assert r["requests"] > 50 and r["completed"] == r["requests"]
    for name in ("ttft_cdf.png", "tbt_cdf.png", "timeline_colocated.png", "timeline_static-pd.png"):
        assert (tmp_path / "plots" / name).stat().st_size > 5000
    assert "static-pd" in p.stdout and "attain" in p.stdout


def test_goodput_flag_adds_the_rate_scale(tmp_path):
    out = tmp_path / "g.json"
    p = fluidpd(
        *BASE, "--trace", "azure_code", "--duration", "60", "--policy", "chunked", "--goodput", "--out", str(out)
    )
    assert p.returncode == 0, p.stderr
    (row,) = json.loads(out.read_text())
    assert row["goodput_rate_scale"] > 0


@pytest.mark.parametrize(
    "args,message",
    [
        (["--trace", "azure_code", "--policy", "nope"], "unknown policy"),
        (["--trace", "no_such_trace", "--policy", "chunked"], "no_such_trace"),
        (["--trace", "/tmp/definitely/missing.csv", "--policy", "chunked"], "missing.csv"),
        (["--trace", "azure_code", "--policy", "chunked", "--rate-scale", "-1"], "must be a finite number > 0"),
        (["--trace", "azure_code", "--policy", "chunked", "--workers", "0"], "workers"),
        (["--trace", "azure_code", "--policy", "chunked", "--chunk-budget", "0"], "chunk_budget must be >= 1"),
        (["--trace", "azure_code", "--policy", "static-pd", "--prefill-workers", "4"], "prefill workers"),
        (["--trace", "azure_code", "--policy", "static-pd", "--router", "nope"], "unknown router 'nope'"),
        (["--trace", "azure_code", "--policy", "chunked", "--router", "kv-affinity"], "unknown router 'kv-affinity'"),
    ],
)
def test_bad_arguments_give_a_message_and_exit_2(args, message):
    p = fluidpd(*BASE, *args)
    assert p.returncode == 2
    assert message in p.stderr
    assert "Traceback" not in p.stderr


def test_weights_that_do_not_fit_are_a_clear_error():
    p = fluidpd(
        "simulate",
        "--model",
        "llama-3.3-70b",
        "--dtype",
        "bf16",
        "--gpu",
        "h100",
        "--workers",
        "2",
        "--ttft-slo",
        "1",
        "--tbt-slo",
        "0.05",
        "--trace",
        "azure_code",
        "--policy",
        "chunked",
    )
    assert p.returncode == 2 and "do not fit" in p.stderr


def test_sessions_with_the_cache_on_and_off(tmp_path):
    rows = {}
    for flag in ("--enable-prefix-caching", "--no-enable-prefix-caching"):
        out = tmp_path / f"{flag}.json"
        args = ["--trace", "mooncake_conv", "--sessions", "--duration", "30", "--policy", "chunked", "--out", out]
        p = fluidpd(*BASE, *map(str, args), flag)
        assert p.returncode == 0, p.stderr
        rows[flag] = json.loads(out.read_text())[0]
    on, off = rows["--enable-prefix-caching"], rows["--no-enable-prefix-caching"]
    assert on["prefix_cache_hit_rate"] > 0 == off["prefix_cache_hit_rate"]
    assert on["prefix_cache_oracle_hit_rate"] == off["prefix_cache_oracle_hit_rate"] > 0
    p = fluidpd(*BASE, "--trace", "azure_code", "--sessions", "--policy", "chunked")
    assert p.returncode != 0 and "has no sessions" in p.stderr


WINDOW = ["--trace", "azure_code", "--workers", "2", "--start", "300", "--history", "120", "--duration", "60"]


def chunked_row(tmp_path, *args) -> tuple[dict, str]:
    """The chunked row (less its wall time) of a run on WINDOW, and the run's stderr."""
    out = tmp_path / "rows.json"
    p = fluidpd(*BASE, *WINDOW, "--policy", "chunked,static-pd", "--out", str(out), *args)
    assert p.returncode == 0, p.stderr
    row = next(r for r in json.loads(out.read_text()) if r["policy"] == "chunked")
    row.pop("sim_wall_s")
    return row, p.stderr


def test_placement_auto_tunes_chunkeds_budget_on_the_history_and_runs_with_it(tmp_path):
    from fluidpd.placement.plan import CHUNK_BUDGETS

    row, err = chunked_row(tmp_path, "--placement", "auto")
    (split,) = [x for x in err.splitlines() if x.startswith("placement: ")]
    (line,) = [x for x in err.splitlines() if x.startswith("chunked chunk budget: ")]
    budget = int(line.split()[3])
    assert budget in CHUNK_BUDGETS and f"the best of {len(CHUNK_BUDGETS)} budgets" in line
    history = "on 718 requests of history"  # the split's history is the budget's
    assert history in split and history in line
    assert row == chunked_row(tmp_path, "--chunk-budget", str(budget))[0]


def test_placement_auto_keeps_a_given_chunk_budget(tmp_path):
    row, err = chunked_row(tmp_path, "--placement", "auto", "--chunk-budget", "48")
    assert "placement: " in err and "chunk budget" not in err
    assert row == chunked_row(tmp_path, "--chunk-budget", "48")[0]
    assert row != chunked_row(tmp_path, "--placement", "auto")[0]  # the tuned budget would have run otherwise


def test_samples_and_constrained_shape_the_trace(tmp_path):
    rows = {}
    for samples in (1, 4):
        out = tmp_path / f"r{samples}.json"
        extra = ["--constrained", "0.5"] if samples > 1 else []
        p = fluidpd(*BASE, "--trace", "azure_conv", "--duration", "60", "--policy", "colocated", "--samples",
                    str(samples), *extra, "--out", str(out))  # fmt: skip
        assert p.returncode == 0, p.stderr
        (rows[samples],) = json.loads(out.read_text())
    assert rows[4]["completed"] == rows[1]["completed"] == rows[1]["requests"]
    assert rows[4]["throughput_tok_s"] > 2.5 * rows[1]["throughput_tok_s"]  # 4 sequences decode per request
    bad = fluidpd(*BASE, "--trace", "azure_conv", "--duration", "60", "--policy", "colocated", "--constrained", "2")
    assert bad.returncode == 2 and "constrained" in bad.stderr


def test_a_mixture_of_experts_with_expert_parallel_workers(tmp_path):
    out = tmp_path / "moe.json"
    moe = ["--model", "qwen3-30b-a3b", "--gpu", "h100", "--ttft-slo", "2", "--tbt-slo", "0.05", "--trace", "azure_code"]
    run = ["--duration", "60", "--policy", "static-pd,fluidpd", "--prefill-workers", "1", "--out", str(out)]
    p = fluidpd("simulate", *moe, *run, "--workers", "2", "--tp", "2", "--ep", "2")
    assert p.returncode == 0, p.stderr
    rows = json.loads(out.read_text())
    assert [r["policy"] for r in rows] == ["static-pd", "fluidpd"]
    assert all(r["completed"] == r["requests"] > 20 for r in rows)
    bad = fluidpd("simulate", *moe, *run, "--workers", "2", "--tp", "2", "--ep", "4")
    assert bad.returncode == 2 and "ep must be a positive divisor of tp=2" in bad.stderr
    big = fluidpd("simulate", *moe[2:], "--model", "qwen3-235b-a22b", "--dtype", "fp8", *run)
    assert big.returncode == 2 and "qwen3-235b-a22b weights (235.1 GB) do not fit in 1 x h100" in big.stderr
