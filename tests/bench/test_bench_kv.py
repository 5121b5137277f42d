"""`fluidpd experiment kv`: the saturation search, the per-request oracle, the clip, the goals and the command."""

import json
import subprocess
import sys

import numpy as np
import pytest

from fluidpd.bench.experiments import EXPERIMENTS
from fluidpd.bench.experiments.kv.goals import check_goals
from fluidpd.bench.experiments.kv.setting import SHARES, followups, oracle_new_tokens
from fluidpd.bench.experiments.kv.systems import SYSTEMS, systems_for
from fluidpd.bench.saturation import Probe, search
from fluidpd.workload import load_trace
from fluidpd.workload.blockmap import oracle_hits
from fluidpd.workload.trace import Trace


def step(limit: float):
    calls = []

    def best_at(load: float) -> Probe:
        calls.append(load)
        return Probe(load, 1.0 if load <= limit else 0.5, "b")

    return best_at, calls


def test_search_doubles_then_bisects_to_the_highest_passing_load():
    best_at, calls = step(300.0)
    out = search(100.0, 6, best_at)
    assert calls[:3] == [100.0, 200.0, 400.0]
    assert calls[3] == pytest.approx((200 * 400) ** 0.5)
    assert 200.0 <= out["saturation_load"] <= 300.0 and out["reached"]
    assert out["lowest_failing_load"] > 300.0
    assert len(out["probes"]) == 6


def test_search_halves_when_the_start_fails_and_reports_when_nothing_passes():
    best_at, calls = step(30.0)
    out = search(100.0, 3, best_at)
    assert calls == [100.0, 50.0, 25.0]
    assert out["saturation_load"] == 25.0 and out["reached"]
    out = search(100.0, 2, step(1.0)[0])
    assert not out["reached"] and out["saturation_load"] == 50.0
    with pytest.raises(ValueError):
        search(0.0, 2, best_at)


def test_per_request_oracle_sums_to_the_simulators_oracle_and_followups_share_a_prefix():
    trace = load_trace("hot_prefix", rate=20.0, seed=3, duration_s=5.0)
    new = oracle_new_tokens(trace, 16)
    hits, total = oracle_hits(trace, 16)
    assert int(trace.prompt_len.sum() - new.sum()) == hits and total == int(trace.prompt_len.sum())
    follow = followups(trace, 16)
    assert not follow[0] and follow.sum() > len(trace) // 2
    assert (new[follow] < trace.prompt_len[follow]).all()


def test_followups_of_sessions_are_the_turns_after_the_first():
    t = Trace("s", [0.0, 1.0, 2.0, 3.0], [5, 5, 5, 5], [1, 1, 1, 1], session=[0, 1, 0, -1], think_time_s=[0, 0, 1, 0])
    assert followups(t, 16).tolist() == [False, False, True, False]


def test_clip_cuts_prompt_plus_output_to_the_context_and_counts_the_requests_touched():
    t = Trace("c", [0.0, 1.0, 2.0], [100, 8190, 9000], [10, 10, 20000])
    out, touched = t.clipped(8192)
    assert touched == 2
    assert (out.prompt_len + out.output_len <= 8192).all()
    assert out.prompt_len.tolist() == [100, 8182, 1]
    assert out.output_len.tolist() == [10, 10, 8191]


def _rows(fluid_attain: float, fluid_ttft: float) -> list[dict]:
    rows = []
    for s in systems_for("hot_prefix"):
        f = s.name == "fluidpd+kv-affinity"
        rows.append(
            {
                "system": s.name,
                "attainment": fluid_attain if f else 0.9,
                "strict_attainment": fluid_attain if f else 0.9,
                "hit_rate": 0.9,
                "oracle_hit_rate": 0.92,
                "ttft_turn2_p50_s": fluid_ttft if f else 1.0,
                "ttft_turn2_p95_s": fluid_ttft if f else 2.0,
                "tbt_p99_s": 0.03,
                "kv_bytes_moved": 100.0 if f else 0.0,
                "kv_bytes_new_and_generated": 100.0,
                "max_mean_load": 1.1,
            }
        )
    return rows


def test_the_host_tier_check_compares_each_row_with_itself_without_the_tier():
    from fluidpd.bench.experiments.kv.goals import host_tier_goals

    plain = _rows(0.95, 0.1)
    tiered = [{**r, "system": r["system"] + "+host", "host_hit_rate": 0.02} for r in plain]
    ok = host_tier_goals({"kv": {"w": {"0.8": plain}}, "kv_host": {"w": {"0.8": tiered}}})["w"]
    assert ok["met"] and ok["worst_delta"] == 0 and ok["of_oracle_0.8"] == pytest.approx(0.9 / 0.92)
    worse = [{**r, "strict_attainment": r["strict_attainment"] - 0.05} for r in tiered]
    bad = host_tier_goals({"kv": {"w": {"0.8": plain}}, "kv_host": {"w": {"0.8": worse}}})["w"]
    assert not bad["met"] and bad["worst_delta"] == pytest.approx(-0.05) and len(bad["misses"]) == len(plain)


def test_goals_follow_the_measured_rows():
    good = {"kv": {"hot_prefix": {f"{x:g}": _rows(0.95, 0.1) for x in SHARES}}}
    g = check_goals(good)
    assert all(g["met"].values())
    assert g["b_turn2_ttft"]["hot_prefix"]["0.8"]["p50_cut"] == pytest.approx(0.9)
    bad = {"kv": {"hot_prefix": {f"{x:g}": _rows(0.85, 0.5) for x in SHARES}}}
    g = check_goals(bad)
    assert not g["met"]["c_dominates"] and not g["met"]["b_turn2_ttft"]
    assert g["met"]["a_hit_rate"] and g["met"]["e_hot_prefix"] and g["met"]["d_kv_moved"]


@pytest.mark.slow
def test_kv_command_writes_a_row_for_every_system_and_load(tmp_path):
    assert "kv" in EXPERIMENTS
    cmd = [sys.executable, "-m", "fluidpd.cli", "experiment", "kv", "--quick", "--out", str(tmp_path)]
    # 10 s windows (hot_prefix's own quick window): hundreds of hot_prefix requests, tens of Mooncake's
    cmd += ["--workloads", "hot_prefix,mooncake_conv", "--window", "10", "--probes", "1"]
    cmd += ["--kv-offloading-size", "1", "--kv-offloading-pooled"]  # every row again with a host tier
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads((tmp_path / "kv.json").read_text())
    assert set(res["kv"]) == {"hot_prefix", "mooncake_conv"}
    for name, loads in res["kv"].items():
        assert list(loads) == ["0.5", "0.8", "0.95"]
        sat = res["workloads"][name]["saturation"]["saturation_load"]
        for share, rows in loads.items():
            assert res["workloads"][name]["loads"][share]["load"] == pytest.approx(float(share) * sat)
            expected = [s.name for s in systems_for(name)]
            assert [r["system"] for r in rows] == expected
            for r in rows:
                for key in ("attainment", "strict_attainment", "hit_rate", "oracle_hit_rate"):
                    assert 0 <= r[key] <= 1
                assert r["hit_rate"] <= r["oracle_hit_rate"] + 1e-9
                assert r["kv_bytes_per_request"] >= 0 and r["max_mean_load"] >= 1 - 1e-9
                assert isinstance(r["transitions"], int)
                assert np.isfinite(r["tbt_p99_s"])
                assert np.isfinite(r["ttft_turn2_p50_s"]) == (r["turn2_finished"] > 0)
            static = {r["system"]: r for r in rows if r["system"].startswith("static-pd+")}
            assert all(r["transitions"] == 0 for r in static.values())
        assert (tmp_path / f"hit_rate_{name}.png").stat().st_size > 5000
        assert (tmp_path / f"ttft_turn2_{name}.png").stat().st_size > 5000
    assert (tmp_path / "envelope.png").stat().st_size > 5000
    assert len(res["envelope"]) == sum(len(loads) for loads in res["kv"].values())
    assert all(not p["best_strict_system"].startswith("fluidpd") for p in res["envelope"])
    assert "envelope: fluidpd within 0.5 pp" in proc.stdout
    assert set(res["goals"]["met"]) >= {"a_hit_rate", "b_turn2_ttft", "c_dominates", "d_kv_moved", "e_hot_prefix"}
    for name, loads in res["kv_host"].items():  # the same rows, named +host, the oracle unchanged
        for share, rows in loads.items():
            plain = res["kv"][name][share]
            assert [r["system"] for r in rows] == [r["system"] + "+host" for r in plain]
            for r, p in zip(rows, plain):
                assert r["oracle_hit_rate"] == p["oracle_hit_rate"] and 0 <= r["host_hit_rate"] <= r["hit_rate"]
            assert all(r["host_hit_rate"] == 0 for r in plain)
    assert res["host_tier"]["pooled"] and set(res["host_tier"]) >= {"hot_prefix", "mooncake_conv"}
    assert len(res["envelope_host"]) == len(res["envelope"])
    assert "With a host KV tier (1 GiB a worker, one pool per node)" in proc.stdout
    assert res["setting"]["model"] == "llama-3.1-8b" and len(SYSTEMS) == 17
    assert "Goals (issue 26)" in proc.stdout


def test_quick_tuning_searches_the_neighbours_of_the_nearest_split():
    from fluidpd.bench.experiments.kv.setting import setup
    from fluidpd.bench.experiments.kv.systems import near_splits, tuning_runs
    from fluidpd.placement.plan import CHUNK_BUDGETS, fixed_split

    assert near_splits(None) is None
    assert near_splits(4) == [3, 4, 5] and near_splits(1) == [1, 2] and near_splits(7) == [6, 7]
    assert tuning_runs(False) == 7 + 2 * len(CHUNK_BUDGETS) and tuning_runs(True, 4) == 3 + 2 * 3
    trace = load_trace("hot_prefix", rate=20.0, seed=3, duration_s=1.0)
    for bad in ([], [0, 1], [8]):
        with pytest.raises(ValueError):
            fixed_split(trace, setup(), bad, min_history=0)


def test_chunked_late_last_rows_run_every_router_at_their_own_tuned_budget():
    from fluidpd.bench.experiments.kv.systems import BASELINES, ROUTER_NAMES

    late = [s for s in BASELINES if s.policy == "chunked-late-last"]
    assert [s.router for s in late] == list(ROUTER_NAMES)
    assert all("late-last" in s.imitates for s in late)
    tuned = {"split": 3, "chunk_budget": 256, "chunk_budget_late_last": 768}
    assert late[0].setup(tuned, 0).policy.chunk_budget == 768
    fcfs = next(s for s in BASELINES if s.policy == "chunked")
    assert fcfs.setup(tuned, 0).policy.chunk_budget == 256


def test_the_kv_envelope_counts_chunked_late_last_among_the_other_rows():
    from fluidpd.bench.experiments.kv.goals import envelope

    rows = _rows(0.9, 0.1)
    best = "chunked-late-last+llm-d"
    rows = [{**r, "attainment": 0.97, "strict_attainment": 0.96} if r["system"] == best else r for r in rows]
    rows = [{**r, "attainment": 1.0} if r["system"] == "fluidpd+shortest-queue" else r for r in rows]  # its ablation
    (p,) = envelope({"kv": {"hot_prefix": {"0.8": rows}}})
    assert (p.best_joint_system, p.best_strict_system) == (best, best)
    assert p.joint_margin_pp == pytest.approx(-7.0)
