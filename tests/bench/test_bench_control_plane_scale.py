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
    assert out[-1] == "headline: no fluidpd case at 1,024 workers was run"
    rows = json.loads((tmp_path / "control_plane_scale.json").read_text())["rows"]
    assert {(r["scenario"], r["policy"]) for r in rows} == {
        (s, p) for s in ("steady", "burst") for p in ("fluidpd", "static-pd", "chunked")
    }
    assert all(r["tick"]["samples"] == 3 and r["route"]["samples"] > 0 for r in rows)
    assert (tmp_path / "control_plane_scale.png").stat().st_size > 0


def test_the_coordinator_run_prints_whether_the_cycle_holds(monkeypatch, capsys, tmp_path):
    argv = ["coordinator_scale.py", "--workers", "16", "--seconds", "0.3", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    load("coordinator_scale").main()
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("coordinator at 16 fake workers (steady): tick p99 ") and "the 10 ms cycle" in last
    (row,) = json.loads((tmp_path / "coordinator_scale.json").read_text())
    assert row["cycles"] >= 2 and row["state"] == "balanced"


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
