import gzip
import json

import numpy as np
import pytest

from fluidpd.workload import (
    load_azure,
    load_claude_code,
    load_csv_trace,
    load_length_trace,
    load_lengths,
    load_mooncake,
    spread_steps,
    trace_dir,
)


@pytest.fixture(scope="module")
def claude():
    return load_claude_code(concurrency=64.0, seed=0)


@pytest.mark.parametrize(
    "kind,rows,duration,prompt_mean,output_mean",
    [
        ("code", 8819, 3435.95, 2047.85, 27.88),
        ("conv", 19366, 3501.72, 1154.70, 211.13),
    ],
)
def test_azure(kind, rows, duration, prompt_mean, output_mean):
    t = load_azure(kind=kind)
    assert t.name == f"azure_{kind}" and len(t) == rows
    assert t.arrival_s[0] == 0.0 and t.duration_s == pytest.approx(duration, abs=0.01)
    assert t.prompt_len.mean() == pytest.approx(prompt_mean, abs=0.01)
    assert t.output_len.mean() == pytest.approx(output_mean, abs=0.01)


def test_azure_timestamps_keep_sub_millisecond_precision():
    t = load_azure(kind="code")
    assert t.arrival_s[1] == pytest.approx(0.052, abs=1e-9)  # 18:17:04.0319600 - 18:17:03.9799600


@pytest.mark.parametrize(
    "kind,rows,duration,prompt_mean,output_mean,blocks",
    [
        ("conversation", 12031, 3537.0, 12035.06, 342.62, 288_500),
        ("synthetic", 3993, 1022.0, 15325.48, 149.12, 121_877),
    ],
)
def test_mooncake(kind, rows, duration, prompt_mean, output_mean, blocks):
    t = load_mooncake(kind=kind)
    assert len(t) == rows and t.duration_s == pytest.approx(duration, abs=0.5)
    assert t.prompt_len.mean() == pytest.approx(prompt_mean, abs=0.01)
    assert t.output_len.mean() == pytest.approx(output_mean, abs=0.01)
    assert t.hash_block_size == 512 and sum(map(len, t.hash_ids)) == blocks
    assert len(t.hash_ids[0]) == -(-t.prompt_len[0] // 512)


def test_mooncake_spread_quantized():
    raw = load_mooncake()
    spread = load_mooncake(spread_quantized=True, seed=1)
    assert len(np.unique(raw.arrival_s)) == 1180
    assert len(np.unique(spread.arrival_s)) > 12_000
    assert (np.diff(spread.arrival_s) >= 0).all()
    assert (spread.arrival_s >= raw.arrival_s).all() and (spread.arrival_s - raw.arrival_s < 3.01).all()
    np.testing.assert_array_equal(spread.prompt_len, raw.prompt_len)  # request order kept
    frac = spread.arrival_s % 3.0  # spread over the step, not bunched at its start
    assert 1.2 < frac.mean() < 1.8
    np.testing.assert_array_equal(spread.arrival_s, load_mooncake(spread_quantized=True, seed=1).arrival_s)
    assert not np.array_equal(spread.arrival_s, load_mooncake(spread_quantized=True, seed=2).arrival_s)


def test_spread_steps_on_small_input():
    t = np.array([0.0, 0.0, 0.0, 3.0, 6.0, 6.0])
    s = spread_steps(t, seed=0)
    assert (np.diff(s) >= 0).all() and (s >= t).all() and (s < t + 3.0).all()


def test_claude_code(claude):
    assert len(claude) == 49334 and claude.arrival_s[0] == 0.0
    assert claude.prompt_len.mean() == pytest.approx(122379.0, abs=0.01)
    assert claude.output_len.min() == 1 and claude.output_len.mean() == pytest.approx(440.06, abs=0.01)


def test_claude_code_uncached_input(claude):
    t = load_claude_code(uncached_only=True, seed=0)
    assert t.prompt_len.mean() == pytest.approx(4508.56, abs=0.01)
    assert (t.prompt_len <= claude.prompt_len).all()
    np.testing.assert_array_equal(t.arrival_s, claude.arrival_s)


def test_claude_code_concurrency_sets_session_start_rate(claude):
    busy = load_claude_code(concurrency=640.0, seed=0)
    # ten times the concurrency: sessions start ten times as often, so half the requests arrive much sooner
    # (not quite 10x: time inside a session does not shrink)
    ratio = np.median(claude.arrival_s) / np.median(busy.arrival_s)
    assert 5 < ratio < 11
    other = load_claude_code(seed=1)
    assert not np.array_equal(other.arrival_s, claude.arrival_s)
    with pytest.raises(ValueError, match="concurrency"):
        load_claude_code(concurrency=0)


def test_claude_code_mean_concurrency_matches_request(tmp_path):
    # 400 sessions of exactly 100 s: with concurrency 5, starts come every 20 s on average
    sessions = tmp_path / "claude_code_sessions.csv"
    sessions.write_text("trace,duration_s\n" + "".join(f"s{i},100.0\n" for i in range(400)))
    reqs = tmp_path / "req.jsonl"
    reqs.write_text(
        "".join(
            json.dumps(
                {
                    "trace": f"s{i}",
                    "t_s": float(t),
                    "input_tokens": 100,
                    "output_tokens": 0,
                    "prefix_hit_blocks": 1,
                    "block_size": 64,
                    "hash_runs": [[1, 2], [10, 1]],
                }
            )
            + "\n"
            for i in range(400)
            for t in (0, 100)
        )
    )
    t = load_claude_code(reqs, concurrency=5.0, seed=0, with_hashes=True, uncached_only=True)
    assert len(t) == 800 and t.prompt_len.max() == 36 and t.output_len.min() == 1
    assert 400 * 100.0 / t.duration_s == pytest.approx(5.0, rel=0.15)
    assert t.hash_block_size == 64
    assert all(len(h) == 3 for h in t.hash_ids)
    assert len({int(h[0]) for h in t.hash_ids}) == 400  # ids made unique per session


@pytest.mark.parametrize(
    "kind,rows,prompt_mean,output_mean",
    [
        ("sharegpt", 30731, 2340.03, 438.71),
        ("arxiv_sum", 28257, 2588.08, 291.43),
        ("bwb", 33768, 1067.18, 1612.83),
    ],
)
def test_length_only(kind, rows, prompt_mean, output_mean):
    prompt, output = load_lengths(kind=kind)
    assert len(prompt) == len(output) == rows
    assert prompt.mean() == pytest.approx(prompt_mean, abs=0.01)
    assert output.mean() == pytest.approx(output_mean, abs=0.01)
    t = load_length_trace(kind=kind, rate=5.0, seed=3)
    assert len(t) == rows and t.name == kind
    assert t.mean_rate == pytest.approx(5.0, rel=0.03)
    np.testing.assert_array_equal(t.prompt_len, prompt)


def test_length_trace_resampled_by_duration():
    t = load_length_trace(kind="bwb", rate=10.0, duration_s=100.0, seed=0)
    assert t.duration_s == 100.0 and t.arrival_s.max() < 100.0
    assert len(t) == pytest.approx(1000, rel=0.15)
    assert t.output_len.mean() > t.prompt_len.mean()


def test_env_var_overrides_trace_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FLUIDPD_TRACE_DIR", str(tmp_path))
    assert trace_dir() == tmp_path
    (tmp_path / "azure_conv_2023.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-01-01 00:00:01.5,10,0\n2024-01-01 00:00:00.5,20,5\n"
    )
    t = load_azure()
    np.testing.assert_array_equal(t.arrival_s, [0.0, 1.0])  # sorted and re-based
    np.testing.assert_array_equal(t.prompt_len, [20, 10])
    np.testing.assert_array_equal(t.output_len, [5, 1])  # zero output clipped to one
    with pytest.raises(FileNotFoundError, match=r"azure_code_2023\.csv"):
        load_azure(kind="code")


@pytest.mark.parametrize("loader", [load_azure, load_mooncake, load_claude_code, load_lengths, load_csv_trace])
def test_missing_file_names_it(tmp_path, loader):
    missing = tmp_path / "nope.data"
    with pytest.raises(FileNotFoundError, match=r"nope\.data"):
        loader(missing)


AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,10,5\n"


@pytest.mark.parametrize(
    "text,line,what",
    [
        (AZ + "2023-11-16 18:17:04.0,abc,5\n", 3, "ContextTokens"),
        (AZ + "\n2023-11-16 18:17:04.0,10\n", 4, "fields"),
        (AZ + "2023-11-16 18:17:04.0,10,5\nnot-a-time,1,1\n", 4, "TIMESTAMP"),
        (AZ + "2023-11-16 18:17:04.0,0,5\n", 3, "prompt length"),
        (AZ + "2023-11-16 18:17:04.0,10,-2\n", 3, "output length"),
        (AZ + "2023-11-16 18:17:04.0,10,2.5\n", 3, "whole"),
        ("TIMESTAMP,ContextTokens\n", 1, "GeneratedTokens"),
    ],
)
def test_malformed_azure_rows(tmp_path, text, line, what):
    p = tmp_path / "az.csv"
    p.write_text(text)
    with pytest.raises(ValueError, match=f"az.csv: line {line}: .*{what}"):
        load_azure(p)


@pytest.mark.parametrize(
    "bad,what",
    [
        ('{"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": [0]', "invalid JSON"),
        ('{"timestamp": 5, "input_length": "10", "output_length": 1, "hash_ids": [0]}', "input_length"),
        ('{"timestamp": 5, "input_length": 10, "output_length": 1}', "hash_ids"),
        ('{"timestamp": 5, "input_length": 0, "output_length": 1, "hash_ids": []}', "prompt length"),
        ("[1, 2]", "JSON object"),
    ],
)
def test_malformed_mooncake_rows(tmp_path, bad, what):
    good = '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n'
    p = tmp_path / "mc.jsonl"
    p.write_text(good + "\n" + good + bad + "\n")
    with pytest.raises(ValueError, match=f"mc.jsonl: line 4: .*{what}"):
        load_mooncake(p)


def test_malformed_claude_rows(tmp_path):
    (tmp_path / "claude_code_sessions.csv").write_text("trace,duration_s\na,10\n")
    p = tmp_path / "cc.jsonl.gz"
    rows = [
        {"trace": "a", "t_s": 0, "input_tokens": 5, "output_tokens": 1},
        {"trace": "zzz", "t_s": 1, "input_tokens": 5, "output_tokens": 1},
    ]
    with gzip.open(p, "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"cc\.jsonl\.gz: line 2: session 'zzz'"):
        load_claude_code(p)


def test_malformed_length_and_simple_rows(tmp_path):
    p = tmp_path / "len.csv"
    p.write_text("num_prefill_tokens,num_decode_tokens\n5,5\n7,\n")
    with pytest.raises(ValueError, match=r"len\.csv: line 3: num_decode_tokens"):
        load_lengths(p)
    q = tmp_path / "simple.csv"
    q.write_text("arrival_s,prompt_len,output_len\n0.5,10,2\n-1,3,3\n")
    with pytest.raises(ValueError, match=r"simple\.csv: line 3: arrival_s"):
        load_csv_trace(q)


def test_simple_csv_trace(tmp_path):
    p = tmp_path / "simple.csv"
    p.write_text("arrival_s,prompt_len,output_len\n2.5,10,2\n0.5,3,3\n")
    t = load_csv_trace(p)
    assert t.name == "simple"
    np.testing.assert_array_equal(t.arrival_s, [0.5, 2.5])
    np.testing.assert_array_equal(t.prompt_len, [3, 10])


def test_unknown_kinds():
    for call in (
        lambda: load_azure(kind="chat"),
        lambda: load_mooncake(kind="toolagent"),
        lambda: load_lengths(kind="lmsys"),
    ):
        with pytest.raises(ValueError, match="valid"):
            call()


def test_claude_code_sessions_chain_each_agent_closed_loop(tmp_path):
    (tmp_path / "claude_code_sessions.csv").write_text("trace,duration_s\na,100.0\nb,50.0\n")
    rows = [
        # session a: the main agent's three turns (the third without a think time), a sub-agent's one
        ("a", "main", 0.0, 2.0, 0.0, 128, 64, [[1, 2]]),
        ("a", "agent_001", 1.0, 1.0, 0.0, 64, 10, [[50, 1]]),
        ("a", "main", 10.0, 3.0, 100.0, 256, 64, [[1, 4]]),  # its think time counts from further back
        ("a", "main", 20.0, None, None, 300, 10, [[1, 4]]),
        ("b", "main", 0.0, 1.0, 0.0, 64, 10, [[1, 1]]),
    ]
    reqs = tmp_path / "r.jsonl"
    reqs.write_text(
        "".join(
            json.dumps(
                {
                    "trace": s,
                    "agent": a,
                    "t_s": t,
                    "api_time_s": api,
                    "think_time_s": think,
                    "input_tokens": n,
                    "output_tokens": o,
                    "prefix_hit_blocks": 0,
                    "block_size": 64,
                    "hash_runs": runs,
                }
            )
            + "\n"
            for s, a, t, api, think, n, o, runs in rows
        )
    )
    t = load_claude_code(reqs, with_hashes=True, sessions=True, seed=0)
    order = np.lexsort((t.arrival_s, t.session))
    by_session = [(int(t.session[i]), float(t.think_time_s[i]), int(t.prompt_len[i])) for i in order]
    # main of a: its t_s gaps less the previous api times (10 - 2, 20 - 10 - 3)
    assert by_session == [(0, 0.0, 128), (0, 8.0, 256), (0, 7.0, 300), (1, 0.0, 64), (2, 0.0, 64)]
    first = int(order[0])
    assert len(t.hash_ids[first]) == (128 + 64) // 64  # grown over its answer by its successor's ids
    assert load_claude_code(reqs, seed=0).session is None
