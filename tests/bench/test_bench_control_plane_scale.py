"""control_plane_scale.py and coordinator_scale.py: a small run of each prints its table and
headline and writes its JSON (and PNG); bad arguments are clear errors."""

import json
import sys

import pytest
from benchscript import load


def test_a_small_run_prints_every_case_and_the_headline(monkeypatch, capsys, tmp_path):
    argv = ["control_plane_scale.py", "--workers", "8", "--periods", "3", "--sample", "2", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    load("control_plane_scale").main()
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "headline: no fluidpd or fluidpd-pools case at 1,024 workers was run"
    rows = json.loads((tmp_path / "control_plane_scale.json").read_text())["rows"]
    assert {(r["scenario"], r["policy"]) for r in rows} == {
        (s, p) for s in ("steady", "burst") for p in ("fluidpd", "fluidpd-pools", "static-pd", "chunked")
    }
    assert all(r["tick"]["samples"] == 3 and r["route"]["samples"] > 0 for r in rows)
    pooled = [r for r in rows if r["policy"] == "fluidpd-pools"]
    assert all(r["pools"] == 1 and r["pool_tick"]["samples"] == 3 and r["tier_route"]["samples"] > 0 for r in pooled)
    assert (tmp_path / "control_plane_scale.png").stat().st_size > 0


def test_the_sim_mode_compares_fluidpd_and_fluidpd_pools(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["control_plane_scale.py", "--sim", "--gpus", "8"])
    load("control_plane_scale").main()
    out = capsys.readouterr().out.splitlines()
    rows = [line for line in out if line[:2] in ("1x", "4x")]
    assert len(rows) == 2 * 3  # 2 loads x (fluidpd, pools of 64, pools of 16)
    assert out[-1] == "fluidpd-pools vs fluidpd, azure_code at 8 GPUs: attainment at worst +0.0000"


def test_the_coordinator_run_prints_whether_the_cycle_holds(monkeypatch, capsys, tmp_path):
    argv = ["coordinator_scale.py", "--workers", "16", "--seconds", "0.3", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    load("coordinator_scale").main()
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("fluidpd at 16 fake workers (steady): tick p99 ") and "the 10 ms cycle" in last
    (row,) = json.loads((tmp_path / "coordinator_scale.json").read_text())
    assert row["cycles"] >= 2 and row["state"] == "balanced" and row["policy"] == "fluidpd" and row["pools"] == 1


@pytest.mark.parametrize(
    "script,argv,message",
    [
        ("control_plane_scale", ["--periods", "0"], "--periods, --per-worker and --sample must be >= 1"),
        ("control_plane_scale", ["--scenarios", "nope"], "invalid choice"),
        ("coordinator_scale", ["--seconds", "0"], "--seconds must be > 0"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(monkeypatch, capsys, script, argv, message):
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv])
    with pytest.raises(SystemExit) as e:
        load(script).main()
    assert e.value.code == 2 and message in capsys.readouterr().err
