"""Table 1's systems, envelope and goodput goals, on synthetic attainments (no full Table 1 run)."""

from types import SimpleNamespace

import pytest
from rich.console import Console

from fluidpd.bench.experiments.common import CHUNK_BUDGETS
from fluidpd.bench.experiments.table1 import goals
from fluidpd.bench.experiments.table1.report import _headline_cells, print_goodput
from fluidpd.bench.experiments.table1.run import LABELS, SYSTEMS, _runs


def test_chunked_late_last_is_a_system_beside_fcfs_chunked():
    assert SYSTEMS.index("chunked late-last") == SYSTEMS.index("chunked") + 1
    assert "late-last" in LABELS["chunked late-last"] and set(LABELS) == set(SYSTEMS)
    # tuning runs both chunked budget searches: one more CHUNK_BUDGETS' worth a scale than before
    assert _runs({"w": (1.0,)}) == 7 + 2 * len(CHUNK_BUDGETS) + len(SYSTEMS) - 2 + 7


def _rows(best: str) -> dict:
    """Every system at 80% (joint and strict), fluidpd at 85%, `best` at 95%; the oracle and
    fluidtoken (not held against fluidpd) at 100%."""
    out = {s: {"attainment": 0.8, "strict_attainment": 0.8} for s in SYSTEMS}
    out["fluidpd"] = {"attainment": 0.85, "strict_attainment": 0.85}
    out[best] = {"attainment": 0.95, "strict_attainment": 0.95}
    out["static-pd best"] = out["fluidtoken"] = {"attainment": 1.0, "strict_attainment": 1.0}
    return out


def test_the_envelope_holds_fluidpd_against_chunked_late_last_but_not_the_oracle_or_its_ablation():
    results = {
        "workloads": {
            "azure_code": {"scales": [1.0], "runs": {"1": {"systems": _rows("chunked late-last")}}},
            "azure_conv": {"scales": [3.0], "runs": {"3": {"systems": _rows("chunked")}}},
        }
    }
    points = goals.envelope(results, SYSTEMS)
    assert [(p.point, p.best_joint_system, p.best_strict_system) for p in points] == [
        ("azure_code x1", "chunked late-last", "chunked late-last"),
        ("azure_conv x3", "chunked", "chunked"),
    ]
    assert points[0].joint_margin_pp == pytest.approx(-10.0)


def test_goodput_holds_fluidpd_against_chunked_late_last_too(monkeypatch):
    """Attainment 1 up to a rate scale per policy, then 0: each goodput is that scale (within the
    search's bisection); fluidpd beats distserve and chunked by their goals, not chunked late-last."""
    caps = {"fluidpd": 2.0, "static-pd": 1.2, "chunked": 1.5, "chunked-late-last": 1.8}
    budgets = {}

    def fake_run(trace, policy, setup):
        if policy.startswith("chunked"):
            budgets.setdefault(policy, set()).add(setup.policy.chunk_budget)
        return SimpleNamespace(summary={"attainment": 1.0 if trace <= caps[policy] else 0.0})

    monkeypatch.setattr(goals, "run_instrumented", fake_run)
    monkeypatch.setattr(type(goals.WORKLOADS["azure_code"]), "trace", lambda self, x, *a: x)
    tuned = {"split": 3, "chunk_budget": 256, "chunk_budget_late_last": 768}
    results = {"workloads": {"azure_code": {"runs": {"1": {"tuned_on_history": tuned}}}}}
    gp = goals.goodput_search({"azure_code": (1.0,)}, 300.0, 0, {}, False, results)
    assert budgets == {"chunked": {256}, "chunked-late-last": {768}}
    assert gp["chunked_late_last"] == pytest.approx(1.8, rel=0.05) and gp["chunk_budget_late_last"] == 768
    assert gp["ratio_vs_chunked_late_last"] == pytest.approx(2.0 / 1.8, rel=0.05)
    assert gp["ratio_vs_distserve"] >= goals.GOODPUT_GOAL["distserve"]
    assert gp["ratio_vs_chunked"] >= goals.GOODPUT_GOAL["chunked"]
    assert not gp["met"]  # chunked late-last is within 1.2x of fluidpd
    checked = goals.check_goals({"table1": {}, "workloads": {}, "goodput": gp})["goodput"]
    assert checked["vs_chunked_late_last"] == gp["ratio_vs_chunked_late_last"] and not checked["met"]
    console = Console(record=True, width=300)
    print_goodput(console, gp)
    out = console.export_text()
    assert "chunked late-last (768) x1.79" in out and "/ chunked late-last 1.11x" in out and "NOT met" in out


def test_chunked_late_last_runs_on_every_worker_so_its_row_names_no_split():
    row = {
        "system": "chunked late-last",
        "policy": "chunked-late-last",
        "split": "2P:6D",
        "attainment": 0.9,
        "strict_attainment": 0.8,
        "ttft_p99_s": 1.0,
        "tbt_p99_s": 0.03,
        "tbt_decode_p99_s": 0.03,
        "what": LABELS["chunked late-last"],
    }
    assert _headline_cells(row)[1] == "-"
