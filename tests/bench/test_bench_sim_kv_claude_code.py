"""benchmarks/simulation/sim_kv_claude_code.py's goodput search: chunked-late-last is searched and counted among
the chunked baselines fluidpd is held against (simulations replaced by fixed attainments)."""

from benchscript import load


def _script():
    return load("sim_kv_claude_code")


def test_goodput_holds_fluidpd_against_the_best_chunked_late_last_included(monkeypatch, capsys):
    script = _script()
    assert "chunked-late-last+llm-d" in script.SYSTEMS and "chunked+llm-d" in script.SYSTEMS
    caps = {"fluidpd+kv-affinity": 96.0, "chunked+llm-d": 48.0, "chunked-late-last+llm-d": 80.0}

    def fake_run(concurrency, system, start_s=3600.0):
        ok = concurrency <= caps.get(system, 64.0)
        return {"attainment": 1.0 if ok else 0.5, "requests": 100, "role_switches": 0}

    monkeypatch.setattr(script, "run", fake_run)
    script.goodput()
    out = capsys.readouterr().out
    assert "goodput chunked-late-last+llm-d    80 sessions" in out
    assert "1.20x the best chunked, FCFS or late-last (80)" in out
