"""The datacenter generator: rate, daily cycle, lengths, burstiness, prefixes, sessions, seeds, errors, CLIs."""

import json

import numpy as np
import pytest

from fluidpd.cli import main
from fluidpd.workload import load_trace
from fluidpd.workload.datacenter import DatacenterConfig
from fluidpd.workload.datacenter_ids import ID_BLOCK, PREFIX_TAG, request_ids
from fluidpd.workload.datacenter_population import population


def hour_count(t, start_h: float) -> int:
    return int(((t.arrival_s >= start_h * 3600) & (t.arrival_s < (start_h + 1) * 3600)).sum())


def test_the_window_keeps_the_target_rate_over_real_time():
    t = load_trace("datacenter", rate=20.0, source="azure_code", hours=1.5, seed=3)
    assert t.duration_s == 5400.0 and t.arrival_s[-1] < 5400.0  # an hour and a half, not compressed
    assert len(t) == 108_000 and t.mean_rate == pytest.approx(20.0, rel=1e-3)
    assert (np.diff(t.arrival_s) >= 0).all() and t.hash_block_size == ID_BLOCK


@pytest.mark.parametrize("amplitude", [0.0, 0.5])
def test_the_daily_cycle_sets_peak_over_trough(amplitude):
    t = load_trace(
        "datacenter", rate=2.0, source="azure_conv", hours=24, daily_amplitude=amplitude, peak_hour=14, start_hour=0
    )
    assert t.mean_rate == pytest.approx(2.0, rel=1e-3)
    ratio = hour_count(t, 13.5) / hour_count(t, 1.5)  # the hours around the peak and the trough
    assert ratio == pytest.approx((1 + amplitude) / (1 - amplitude), rel=0.15)


def test_the_cycle_averages_to_one_over_any_window():
    cfg = DatacenterConfig(hours=2, daily_amplitude=0.8, start_hour=9, peak_hour=15)
    grid = np.linspace(0, cfg.duration_s, 100_001)
    assert cfg.relative_rate(grid).mean() == pytest.approx(1.0, rel=1e-3)
    assert cfg.relative_rate(grid)[-1] > cfg.relative_rate(grid)[0]  # 9:00 -> 11:00 climbs to the 15:00 peak


@pytest.mark.parametrize("source", ["azure_conv", "azure_code", "mooncake_conv"])
def test_lengths_follow_the_source(source):
    src = load_trace(source)
    t = load_trace("datacenter", rate=10.0, source=source, hours=1, seed=1)
    for mine, theirs in ((t.prompt_len, src.prompt_len), (t.output_len, src.output_len)):
        for q in (50, 90):
            assert np.percentile(mine, q) == pytest.approx(np.percentile(theirs, q), rel=0.05)


def test_a_population_keeps_the_sources_burstiness():
    def gap_cv(source: str) -> float:
        t = load_trace("datacenter", rate=5.0, source=source, hours=1, populations=1, daily_amplitude=0.0)
        gaps = np.diff(t.arrival_s)
        return float(gaps.std() / gaps.mean())

    assert gap_cv("azure_code") > 4.0  # the source's gaps have CV 13; Poisson's would be 1
    assert gap_cv("azure_conv") == pytest.approx(1.09, abs=0.3)


def test_many_populations_smooth_the_mix():
    def count_cv(populations: int) -> float:
        t = load_trace("datacenter", rate=20.0, hours=1, populations=populations, daily_amplitude=0.0)
        counts = np.bincount((t.arrival_s // 10).astype(int))
        return float(counts.std() / counts.mean())

    assert count_cv(64) < 0.7 * count_cv(1)  # independent populations: bursts do not line up


def test_populations_have_their_own_prefixes_and_share_them_inside():
    cfg = DatacenterConfig(source="azure_conv", rate=2.0, prefixes=3)
    src = load_trace("azure_conv")
    pops = [population(src, 3000, cfg, np.random.default_rng(s)) for s in range(3)]
    context = np.concatenate([p.prompt_len + p.output_len for p in pops])
    ids = request_ids(pops, cfg.prefixes, np.arange(len(context)), context)
    per_pop = [ids[i * 3000 : (i + 1) * 3000] for i in range(3)]
    sets = [set(np.concatenate(p).tolist()) for p in per_pop]
    assert sets[0].isdisjoint(sets[1]) and sets[0].isdisjoint(sets[2]) and sets[1].isdisjoint(sets[2])
    for p in per_pop:
        heads = [int(h[0]) for h in p if len(h) and h[0] < 2 * PREFIX_TAG]
        assert len(heads) > 0.5 * len(p)  # most requests open with one of the system prompts
        assert 1 <= len(set(heads)) <= cfg.prefixes


def test_later_turns_extend_the_earlier_context():
    t = load_trace("datacenter", rate=5.0, source="azure_conv", hours=1, seed=2)
    assert t.has_sessions and 0.3 < (t.session >= 0).mean() < 1.0
    last: dict[int, int] = {}
    for i, s in enumerate(t.session.tolist()):
        if s < 0:
            assert t.think_time_s[i] == 0.0
            continue
        j = last.get(s)
        last[s] = i
        if j is None:
            continue
        assert t.prompt_len[i] > t.prompt_len[j] + t.output_len[j]
        assert t.think_time_s[i] == pytest.approx(t.arrival_s[i] - t.arrival_s[j])
        assert len(t.hash_ids[i]) >= len(t.hash_ids[j])
        np.testing.assert_array_equal(t.hash_ids[i][: len(t.hash_ids[j])], t.hash_ids[j])
        assert len(t.hash_ids[i]) == (t.prompt_len[i] + t.output_len[i]) // ID_BLOCK
    turns = np.bincount(t.session[t.session >= 0])
    assert turns.min() >= 2 and 2.0 < turns.mean() < 6.0


def test_the_same_seed_gives_the_same_trace():
    a, b, c = (load_trace("datacenter", rate=5.0, hours=0.5, seed=s) for s in (7, 7, 8))
    for f in ("arrival_s", "prompt_len", "output_len", "session", "think_time_s"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    assert all(np.array_equal(x, y) for x, y in zip(a.hash_ids, b.hash_ids))
    assert not np.array_equal(a.arrival_s, c.arrival_s)
    lean = load_trace("datacenter", rate=5.0, hours=0.5, seed=7, block_ids=False)
    assert lean.hash_ids is None and np.array_equal(lean.arrival_s, a.arrival_s)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"rate": 0.0}, "rate"),
        ({"rate": -3.0}, "rate"),
        ({"hours": 0.0}, "hours"),
        ({"hours": -1.0}, "hours"),
        ({"source": "nope"}, "unknown datacenter source 'nope'"),
        ({"source": "sharegpt"}, "valid: azure_code"),
        ({"daily_amplitude": 1.0}, "daily_amplitude"),
        ({"populations": 0}, "populations"),
        ({"population_rate": 0.0}, "population_rate"),
        ({"turns": 0.5}, "turns"),
    ],
)
def test_bad_arguments_are_clear_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        load_trace("datacenter", **kw)


def test_a_population_rate_sets_the_number_of_populations():
    assert DatacenterConfig(rate=1000.0, population_rate=50.0).n_populations == 20
    assert DatacenterConfig(rate=10.0, population_rate=50.0).n_populations == 1
    assert DatacenterConfig(populations=7).n_populations == 7


def test_fluidpd_simulate_runs_a_datacenter_trace(tmp_path, capsys):
    out = tmp_path / "rows.json"
    argv = ["simulate", "--trace", "datacenter", "--dc-rate", "5", "--dc-hours", "0.02", "--dc-source", "azure_conv"]
    cluster = ["--model", "llama-3.1-8b", "--gpu", "h100", "--workers", "2", "--prefill-workers", "1"]
    rc = main([*argv, *cluster, "--policy", "chunked", "--ttft-slo", "2", "--tbt-slo", "0.1", "--out", str(out)])
    assert rc == 0
    (row,) = json.loads(out.read_text())
    assert row["requests"] == 360 and row["prefix_cache_oracle_hit_rate"] > 0.1


def test_fluidpd_bench_builds_its_requests_from_the_generator(monkeypatch):
    import fluidpd.bench.loadgen.run as bench_run
    from fluidpd.bench.loadgen.requests import plan_requests

    seen = {}

    class Stop(Exception):
        pass

    def fake_run_bench(cfg):
        seen["cfg"] = cfg
        raise Stop

    monkeypatch.setattr(bench_run, "run_bench", fake_run_bench)
    argv = ["bench", "--url", "http://127.0.0.1:9", "--trace", "datacenter", "--dc-rate", "4", "--dc-hours", "0.5"]
    with pytest.raises(Stop):
        main([*argv, "--duration", "120", "--ttft-slo", "1", "--tbt-slo", "0.1", "--no-progress"])
    trace = seen["cfg"].trace
    assert trace.name == "datacenter_azure_code" and trace.duration_s == 120.0
    whole = load_trace("datacenter", rate=4.0, hours=0.5)  # the flags reached the generator
    np.testing.assert_array_equal(trace.arrival_s, whole.arrival_s[whole.arrival_s < 120.0])
    plan = plan_requests(trace, list(range(5000)), 8192)
    assert len(plan.requests) == len(trace)
    assert [len(r.prompt_ids) for r in plan.requests] == np.minimum(trace.prompt_len, 8192 - trace.output_len).tolist()
    assert [r.arrival_s for r in plan.requests] == trace.arrival_s.tolist()


def test_fluidpd_bench_sessions_take_the_generators_flags_too(monkeypatch):
    import fluidpd.bench.loadgen.session_run as session_run

    seen = {}

    class Stop(Exception):
        pass

    async def fake_run_sessions(cfg, replay):
        seen["cfg"] = cfg
        raise Stop

    monkeypatch.setattr(session_run, "run_sessions", fake_run_sessions)
    argv = ["bench", "--url", "http://127.0.0.1:9", "--sessions", "datacenter", "--dc-rate", "3", "--dc-hours", "0.2"]
    with pytest.raises(Stop):
        main([*argv, "--ttft-slo", "1", "--tbt-slo", "0.1", "--no-progress"])
    trace = seen["cfg"].trace
    assert trace.has_sessions and len(trace) == round(3 * 0.2 * 3600)  # not the defaults' 100 req/s for 1 h
