"""`fluidpd experiment table1/table2/replan`: the seed's evaluation in simulation."""

import json
import subprocess
import sys

import pytest

from fluidpd.bench.experiments import EXPERIMENTS, load
from fluidpd.bench.experiments import common as ex
from fluidpd.bench.experiments.table1.run import SYSTEMS, run_table1
from fluidpd.bench.restarts import RestartModel
from fluidpd.bench.simrun import attainment_between, run_instrumented
from fluidpd.policy.view import Role


def fluidpd(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "fluidpd.cli", *args], capture_output=True, text=True, timeout=timeout)


def check_table1_output(out, scales: dict):
    """`scales`: workload -> the rate scales it must have run."""
    res = json.loads((out / "table1.json").read_text())
    assert set(res["table1"]) == set(scales)
    for name in scales:
        rows = res["table1"][name]
        assert [r["system"] for r in rows] == list(SYSTEMS)
        for r in rows:
            assert 0 <= r["attainment"] <= 1 and r["requests"] > 0
            assert r["completed"] + r["rejected"] <= r["requests"]
        entry = res["workloads"][name]
        assert entry["scales"] == sorted(scales[name])
        for run in entry["runs"].values():
            splits = run["splits"]
            assert list(splits) == [f"{k}P:{8 - k}D" for k in range(1, 8)]
            best = max(r["attainment"] for r in splits.values())
            assert run["systems"]["static-pd best"]["attainment"] == best
            assert run["systems"]["static-pd best"]["split"] == run["best_split"]
            assert splits[run["best_split"]]["attainment"] == best
            assert run["systems"]["static-pd 2P:6D"] == splits["2P:6D"]
            assert isinstance(run["systems"]["fluidpd"]["transitions"], list)
            if name == "phase_shift":
                phases = run["systems"]["fluidpd"]["phase_attainment"]
                assert list(phases) == ["surge1", "wave1", "surge2", "wave2"]
        png = out / f"attainment_vs_rate_{name}.png"
        assert png.stat().st_size > 5000
    if "phase_shift" in scales:
        assert (out / "fluidpd_phase_shift_timeline.png").stat().st_size > 5000
    assert (out / "headline.png").stat().st_size > 5000
    assert (out / "envelope.png").stat().st_size > 5000
    assert len(res["envelope"]) == sum(len(v) for v in scales.values())  # a point per workload and scale
    assert all(p["best_joint_system"] not in ("fluidpd", "fluidtoken", "static-pd best") for p in res["envelope"])
    return res


def check_tuned_on_history(run: dict) -> None:
    """One run's tuning on its history window: the split and both chunk budgets (of every budget,
    each under its own queue order) are the best there, and every P/D system but the oracle starts
    from that split."""
    tuned = run["tuned_on_history"]
    placed = tuned["split_label"]
    assert tuned["split_attainment"][placed] == max(tuned["split_attainment"].values())
    for key in ("chunk_budget", "chunk_budget_late_last"):
        budgets = tuned[f"{key}_attainment"]
        assert budgets[tuned[key]] == max(budgets.values())
        assert set(budgets) == set(ex.CHUNK_BUDGETS)
    systems = run["systems"]
    assert systems["chunked late-last"]["policy"] == "chunked-late-last"
    for s in ("distserve", "autoscaler", "fluidtoken", "fluidpd"):
        assert systems[s]["split"] == placed, s
    assert systems["static-pd best"]["what"].startswith("ORACLE")
    assert all(r["what"] for r in systems.values())
    assert isinstance(systems["autoscaler"]["replans"], list)


@pytest.mark.slow
def test_table1_tunes_on_history_and_every_p_d_system_starts_from_distserve_split():
    """azure_conv (phase_shift's and azure_code's runs are checked the same way on `--quick` below)."""
    # 90 s windows: the autoscaler still replans once (at 60 s), as at 120 s
    res, _ = run_table1(["azure_conv"], scales=(1.0,), window_s=90.0, goodput=False, progress=False)
    check_tuned_on_history(res["workloads"]["azure_conv"]["runs"]["1"])
    assert res["workloads"]["azure_conv"]["start_s"] == 90.0  # after its history window
    assert set(res["goals"]["dominates"]) == {"azure_conv"}


@pytest.mark.slow
def test_replan_experiment_runs_as_documented(tmp_path):
    # 200 s phases: both replan toward prefill in azure_code's phase and back in the last
    out = tmp_path / "rp"
    p = fluidpd(
        "experiment",
        "replan",
        "--phase-s",
        "200",
        "--history-s",
        "120",
        "--profile-window",
        "120",
        "--persist-s",
        "60",
        "--check-s",
        "30",
        "--out",
        str(out),
    )
    assert p.returncode == 0, p.stderr
    res = json.loads((out / "replan.json").read_text())
    assert set(res["systems"]) == {"static-pd", "distserve", "fluidpd"}
    assert res["restart_s"] == pytest.approx(RestartModel().costs(70e9 * 1.0)["cold process restart"][2], rel=0.05)
    static, dist, fluid = (res["systems"][s] for s in ("static-pd", "distserve", "fluidpd"))
    assert static["role_changes"] == 0 and not static["replans"]
    assert dist["replans"] and dist["restarts"] == dist["role_changes"] > 0 and dist["gpu_s_lost"] > 0
    assert fluid["restarts"] == 0 and fluid["gpu_s_lost"] < dist["gpu_s_lost"]
    for r in res["systems"].values():
        assert set(r["phase_attainment"]) == {"1:azure_conv", "2:azure_code", "3:azure_conv"}
    assert (out / "replan_roles.png").stat().st_size > 5000
    assert "replanning:" in p.stdout


@pytest.mark.slow
def test_table1_quick_as_documented(tmp_path):
    """`--quick` on azure_code and phase_shift (azure_conv's windows are checked above, and its
    overloaded x3 is the slowest run of the quick set), each run tuned on its history."""
    out, names = tmp_path / "q", ("azure_code", "phase_shift")
    p = fluidpd("experiment", "table1", "--quick", "--workloads", ",".join(names), "--out", str(out))
    assert p.returncode == 0, p.stderr
    res = check_table1_output(out, {name: list(ex.WORKLOADS[name].quick_scales) for name in names})
    assert res["goodput"] is None
    for name in names:
        assert res["workloads"][name]["window_s"] == ex.QUICK_WINDOW_S
        for run in res["workloads"][name]["runs"].values():
            tuned = run["tuned_on_history"]  # the JSON's budget keys are strings
            for key in ("chunk_budget_attainment", "chunk_budget_late_last_attainment"):
                tuned[key] = {int(b): a for b, a in tuned[key].items()}
            check_tuned_on_history(run)
    assert res["workloads"]["azure_code"]["start_s"] == ex.QUICK_WINDOW_S  # after its history window
    assert res["workloads"]["phase_shift"]["start_s"] == 0.0  # history: another draw of the process
    assert set(res["goals"]["dominates"]) == set(names)
    assert res["setting"]["ttft_justification"]["p99_prompt_tokens"] == 7436
    assert 0.8 < res["setting"]["ttft_justification"]["prefill_alone_s"] < 2.0
    assert "7,436 tokens" in p.stdout and "Table 1: azure_code x1" in p.stdout
    assert "surge1" in p.stdout and "Bursty goal" in p.stdout and "ORACLE" in p.stdout
    assert (out / "fluidpd_azure_code_timeline.png").stat().st_size > 5000


def test_phase_shift_workload_stresses_the_static_2p6d_baseline():
    """The documented choice of surge and wave rates: static 2P:6D misses SLOs in some phase."""
    wl = ex.WORKLOADS["phase_shift"]
    trace = wl.trace(wl.headline, ex.FULL_WINDOW_S, 0)
    res = run_instrumented(trace, "static-pd", ex.setup(2), keep_requests=True)
    per_phase = [attainment_between(res, trace, ex.SLO, a, b) for a, b, _ in wl.phases(ex.FULL_WINDOW_S)]
    assert min(per_phase) < 0.7
    assert res.summary["attainment"] < 0.9


def test_restart_model_reproduces_the_seeds_fp16_table():
    costs = RestartModel().costs(140e9)
    assert costs["cold process restart"] == pytest.approx((82.4, 4.8, 87.2))
    assert costs["warm container restart"] == pytest.approx((14.1, 3.2, 17.3))
    assert costs["dynamic autoscaler (K8s)"] == pytest.approx((185.0, 8.4, 193.4))
    half = RestartModel().costs(70e9)
    assert half["cold process restart"][0] == pytest.approx(41.2)
    assert half["dynamic autoscaler (K8s)"][2] == pytest.approx(185.0 - 41.2 + 8.4)
    with pytest.raises(ValueError):
        RestartModel().costs(0)
    with pytest.raises(ValueError):
        RestartModel(disk_bw=0)


@pytest.mark.slow
def test_table2_times_fluidrole_in_simulation_and_compares_restarts(tmp_path):
    p = fluidpd("experiment", "table2", "--out", str(tmp_path))
    assert p.returncode == 0, p.stderr
    res = json.loads((tmp_path / "table2.json").read_text())
    fr = res["fluidrole"]
    assert fr["transitions"] >= 1
    med = fr["median_s"]
    assert med["total"] > 0.0
    d2p = fr["by_direction"]["decode->prefill"]["median_s"]
    assert fr["table_total_s"] == d2p["total"]
    assert d2p["total"] >= 0.05  # Table 2's FluidRole row: drain + 37 ms of phases
    for phase, const in res["setting"]["phase_constants_s"].items():
        assert med[phase] == pytest.approx(const)
    assert med["drain"] >= 0
    for d in fr["details"]:
        if d["total_s"] is not None:
            assert d["total_s"] == pytest.approx(sum(d["phases_s"].values()))
    rows = {r["mechanism"]: r for r in res["fp8"]["rows"]}
    fp16 = {r["mechanism"]: r for r in res["fp16"]["rows"]}
    cold = rows["cold process restart"]
    assert cold["total_s"] == pytest.approx(res["fp8"]["weight_bytes"] / (140e9 / 82.4) + 4.8)
    # in place, even a drain that waits mid-surge for peers' KV room is an order of magnitude faster
    assert med["total"] * 10 <= cold["total_s"] and d2p["total"] * 10 <= cold["total_s"]
    assert cold["vs_fluidrole"] == pytest.approx(cold["total_s"] / d2p["total"])
    assert fp16["cold process restart"]["total_s"] > cold["total_s"] > rows["warm container restart"]["total_s"]
    seed140 = {r["mechanism"]: r for r in res["seed_140gb_model"]["rows"]}
    assert seed140["cold process restart"]["total_s"] == pytest.approx(87.2)
    assert "87.2" in p.stdout and "FluidRole" in p.stdout


def test_forced_role_switches_run_all_four_phases():
    wl = ex.WORKLOADS["phase_shift"]
    trace = wl.trace(0.5, 120, 0)
    res = run_instrumented(trace, "fluidpd", ex.setup(2), forced=((30.0, Role.PREFILL), (90.0, Role.DECODE)))
    ts = res.cluster.policy.transitions  # the admin's two, and any FluidPD takes itself after the first
    assert [(t.src_role, t.dst_role) for t in ts if t.reason == "admin"] == [
        (Role.DECODE, Role.PREFILL),
        (Role.PREFILL, Role.DECODE),
    ]
    assert all(t.done and t.began_s >= 30.0 for t in ts)
    assert res.summary["completed"] == len(trace)
    with pytest.raises(ValueError, match="no role transitions"):
        run_instrumented(trace, "static-pd", ex.setup(2), forced=((1.0, Role.PREFILL),))


def test_best_split_and_headline_choice():
    rows = {
        1: {"attainment": 0.5, "strict_attainment": 0.4, "ttft_p99_s": 1.0},
        2: {"attainment": 0.8, "strict_attainment": 0.3, "ttft_p99_s": 2.0},
        3: {"attainment": 0.8, "strict_attainment": 0.5, "ttft_p99_s": 3.0},
    }
    assert ex.best_split(rows) == 3
    assert ex.headline_of(ex.WORKLOADS["azure_conv"], (1.0, 3.0)) == 1.0
    assert ex.headline_of(ex.WORKLOADS["azure_conv"], (1.0, 1.5, 3.0)) == 1.5


@pytest.mark.parametrize(
    "args,message",
    [
        (["table1", "--scales", "-1"], "must be a finite number > 0"),
        (["table1", "--scales", "abc"], "not a number"),
        (["table1", "--window", "0"], "must be a finite number > 0"),
        (["table1", "--workloads", "nope"], "unknown workload"),
        (["table3"], "invalid choice"),
        ([], "required"),
    ],
)
def test_bad_arguments_give_a_message_and_exit_2(args, message, capsys):
    from fluidpd.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["experiment", *args])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_bad_arguments_from_the_shell_exit_2_without_a_traceback():
    p = fluidpd("experiment", "table1", "--quick", "--scales", "0", timeout=60)
    assert p.returncode == 2
    assert "must be a finite number > 0" in p.stderr and "Traceback" not in p.stderr


def test_every_registered_experiment_is_a_subcommand_with_its_own_help(capsys):
    from fluidpd.cli import main

    assert list(EXPERIMENTS) == ["table1", "table2", "kv", "replan", "calibrate", "scale"]
    for name in EXPERIMENTS:
        module = load(name)
        with pytest.raises(SystemExit) as exc:
            main(["experiment", name, "--help"])
        assert exc.value.code == 0
        assert module.__doc__.splitlines()[0] in capsys.readouterr().out
    with pytest.raises(ValueError, match="unknown experiment 'table3'; choose from table1, table2"):
        load("table3")
