import numpy as np
import pytest

from fluidpd.workload import DEFAULT_LENGTH_RATE, TRACES, load_azure, load_trace


def test_every_name_loads():
    for name in TRACES:
        t = load_trace(name, rate=3.0)
        assert len(t) > 0 and (np.diff(t.arrival_s) >= 0).all()
        assert t.mean_rate == pytest.approx(3.0, rel=0.05), name


def test_rate_rescales_timed_traces():
    raw = load_trace("azure_code")
    assert len(raw) == 8819 and raw.mean_rate == pytest.approx(2.567, abs=0.001)
    doubled = load_trace("azure_code", rate=2 * raw.mean_rate)
    assert doubled.duration_s == pytest.approx(raw.duration_s / 2)
    np.testing.assert_array_equal(doubled.prompt_len, raw.prompt_len)


def test_length_only_default_rate_and_kwargs():
    t = load_trace("sharegpt", seed=1)
    assert len(t) == 30731 and t.mean_rate == pytest.approx(DEFAULT_LENGTH_RATE, rel=0.03)
    short = load_trace("bwb", rate=10.0, duration_s=50.0, seed=1)
    assert short.duration_s == 50.0 and 300 < len(short) < 700


def test_seed_reaches_random_loaders():
    a = load_trace("mooncake_conv", seed=1, spread_quantized=True)
    b = load_trace("mooncake_conv", seed=2, spread_quantized=True)
    assert not np.array_equal(a.arrival_s, b.arrival_s)
    assert not np.array_equal(load_trace("phase_shift", seed=1).arrival_s, load_trace("phase_shift", seed=2).arrival_s)


def test_paths_are_detected_by_format(tmp_path):
    from fluidpd.workload import trace_dir

    d = trace_dir()
    assert len(load_trace(d / "azure_conv_2023.csv")) == 19366
    assert load_trace(str(d / "mooncake_synthetic.jsonl")).hash_block_size == 512
    assert len(load_trace(d / "vidur_arxiv_summarization_lengths.csv", rate=4.0)) == 28257
    assert len(load_trace(d / "claude_code_requests.jsonl.gz")) == 49334
    simple = tmp_path / "mine.csv"
    simple.write_text("arrival_s,prompt_len,output_len\n0,100,10\n2,200,20\n")
    t = load_trace(simple)
    assert len(t) == 2 and t.duration_s == 2.0
    assert load_trace(simple, rate=2.0).duration_s == pytest.approx(1.0)


def test_unknown_formats_and_names(tmp_path):
    odd = tmp_path / "odd.csv"
    odd.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="unrecognised trace header"):
        load_trace(odd)
    odd_json = tmp_path / "odd.jsonl"
    odd_json.write_text('{"x": 1}\n')
    with pytest.raises(ValueError, match="unrecognised JSON-lines"):
        load_trace(odd_json)
    with pytest.raises(ValueError, match="valid names: azure_conv, azure_code"):
        load_trace("lmsys")
    with pytest.raises(FileNotFoundError, match=r"missing\.csv"):
        load_trace(tmp_path / "missing.csv")
    with pytest.raises(ValueError):
        load_trace("azure_conv", rate=0.0)
    with pytest.raises(ValueError):
        load_trace("sharegpt", rate=-1.0)


def test_names_are_consistent_with_loaders():
    assert load_trace("azure_conv").name == load_azure(kind="conv").name == "azure_conv"
    assert TRACES.names() == (
        "azure_conv",
        "azure_code",
        "mooncake_conv",
        "mooncake_synth",
        "claude_code",
        "sharegpt",
        "arxiv_sum",
        "bwb",
        "phase_shift",
        "hot_prefix",
        "datacenter",
    )
