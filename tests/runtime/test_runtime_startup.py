"""Starting the serving runtime: worker 0 tells what every worker serves and profiles its engine (the
`profile` call); with the process backend the coordinator's process reads the tokenizer only."""

from __future__ import annotations

import json
import re

import pytest

from fluidpd.engine.config import EngineConfig
from fluidpd.engine.model_source import smollm2_gguf
from fluidpd.runtime import backend, profile_cache
from fluidpd.runtime.build import build_coordinator
from fluidpd.runtime.config import RuntimeConfig
from fluidpd.runtime.inprocess import InProcessWorker
from fluidpd.runtime.profile import EngineProfile

SHAPE = dict(  # a 2-layer model over SmolLM2's vocabulary and context
    architectures=["LlamaForCausalLM"],
    vocab_size=49152,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    """EngineConfig fields of a dummy model whose directory holds its config.json and SmolLM2's tokenizer.json."""
    from fluidpd.engine.tokenizer import Tokenizer

    d = tmp_path_factory.mktemp("tiny")
    (d / "config.json").write_text(json.dumps(SHAPE))
    Tokenizer.load(smollm2_gguf()).tk.save(str(d / "tokenizer.json"))
    return dict(model=str(d), load_format="dummy")


def test_the_profile_call_measures_a_throwaway_engine_and_leaves_the_workers_as_it_was(tiny):
    w = InProcessWorker(0, EngineConfig(**tiny), num_threads=1)
    w.start()
    try:
        before = w.submit("stats").result()
        profile = w.submit("profile").result()
        after = w.submit("stats").result()
    finally:
        w.close()
    assert isinstance(profile, EngineProfile)
    assert [n for n, _ in profile.prefill_points] == [16, 64, 128, 256, 512]
    assert profile.decode_step_s > 0 and profile.prefill_batch_tokens in (16, 64, 128, 256, 512)
    assert after == before  # no KV used, nothing cached, no prefix cache queries counted


@pytest.fixture
def profiles(tmp_path, monkeypatch):
    """An empty profile cache of this test's own (the kernels' cache stays where it is)."""
    monkeypatch.setattr(profile_cache, "cache_root", lambda: tmp_path)
    return tmp_path / "profiles"


@pytest.mark.parametrize("kind", ["inprocess", "process"])
def test_worker_0_sizes_max_model_len_and_profiles_for_the_coordinator(tiny, kind, profiles):
    logs: list[str] = []
    runtime = RuntimeConfig(workers=1, backend=kind, threads=1)
    coord = build_coordinator(EngineConfig(**tiny), runtime, log=logs.append)
    try:
        info = coord.backends[0].info
        assert coord.max_model_len == 8192 and coord.kv_blocks == 512 == info.stats.num_kv_blocks
        assert coord.vocab_size == 49152 and coord.kv_bytes_per_token == info.stats.block_bytes / 16
        assert coord.tokenizer.encode("The capital of France is") == [504, 3575, 282, 4649, 314]
        assert [n for n, _ in coord.profile.prefill_points] == [16, 64, 128, 256, 512]
        text = "\n".join(logs)
        assert re.search(
            r"loaded \S+ in [\d.]+ s \([\w-]+ weights, \w+ decode attention\); max_model_len 8192: "
            r"the model's context \(one worker's KV \(512 blocks x 16 tokens\) holds 8192 tokens\)",
            text,
        ), text
        assert "profiling step times ..." in logs
        assert re.search(r"profile: f_P\(512\) = \d+ ms, decode step [\d.]+ ms, L_m = \d+ tokens", text), text
        shared = ", one shared process" if kind == "inprocess" else ""
        assert re.search(
            rf"started 1 {kind} worker\(s\) \(1 torch thread\(s\) each\) in [\d.]+ s, policy colocated; "
            rf"resident memory per worker \(GiB{shared}\): [\d.]+",
            text,
        ), text
        order = ["loaded ", "profiling step times", "profile: ", "started "]
        at = [next(i for i, m in enumerate(logs) if m.startswith(k)) for k in order]
        assert at == sorted(at), logs
    finally:
        for b in coord.backends:
            b.close()


def test_a_restart_reuses_this_hosts_profile_unless_told_not_to_or_the_host_changed(tiny, profiles, monkeypatch):
    """Whether a decode step now is within PROFILE_DRIFT of the kept one's is the machine's business: the test
    sets the factor so that every step is (reuse), then so that none is (measured again)."""

    def start(**kw):
        logs: list[str] = []
        coord = build_coordinator(EngineConfig(**tiny), RuntimeConfig(workers=1, backend="inprocess", threads=1, **kw),
                                  log=logs.append)  # fmt: skip
        coord.backends[0].close()
        return coord.profile, logs

    first, logs = start()
    assert "profiling step times ..." in logs and len(list(profiles.iterdir())) == 1
    monkeypatch.setattr(profile_cache, "PROFILE_DRIFT", float("inf"))
    again, logs = start()
    assert again == first and "profiling step times ..." not in logs
    assert any(m.startswith("profile: this host's, measured ") for m in logs), logs
    measured, logs = start(profile_cache=False)
    assert "profiling step times ..." in logs and isinstance(measured, EngineProfile)
    monkeypatch.setattr(profile_cache, "PROFILE_DRIFT", 0.5)  # no ratio lies in [2, 0.5]
    _, logs = start()
    assert any(m.startswith("profile kept from ") for m in logs) and "profiling step times ..." in logs, logs


def test_a_given_profile_is_not_measured_again(tiny):
    logs: list[str] = []
    given = EngineProfile(((16, 0.01),), ((16, 0.01),), 0.02, *_fits(), 64)
    runtime = RuntimeConfig(workers=1, backend="inprocess", threads=1)
    coord = build_coordinator(EngineConfig(**tiny), runtime, log=logs.append, profile=given)
    try:
        assert coord.profile is given and "profiling step times ..." not in logs
    finally:
        coord.backends[0].close()


def test_a_max_model_len_no_worker_holds_is_refused_and_the_workers_closed(tiny, monkeypatch):
    made: list = []
    make = backend.make_worker
    monkeypatch.setattr(backend, "make_worker", lambda *a, **kw: made.append(make(*a, **kw)) or made[-1])
    runtime = RuntimeConfig(workers=1, backend="inprocess", threads=1)
    with pytest.raises(ValueError, match="num-kv-blocks"):
        build_coordinator(EngineConfig(**tiny, num_kv_blocks=8, max_model_len=1024), runtime, log=lambda m: None)
    assert len(made) == 1 and not made[0].alive


def test_a_model_without_a_tokenizer_is_refused_before_any_worker_starts(monkeypatch):
    def no_workers(*a, **kw):
        raise AssertionError("a worker was made")

    monkeypatch.setattr(backend, "make_worker", no_workers)
    for kind in ("process", "inprocess"):
        config = EngineConfig(model="smollm2-135m", load_format="dummy", model_overrides={"num_hidden_layers": 1})
        with pytest.raises(ValueError, match="serving needs a tokenizer: smollm2-135m has none"):
            build_coordinator(config, RuntimeConfig(workers=1, backend=kind), log=lambda m: None)


def _fits():
    from fluidpd.core.polynomial import Polynomial

    return Polynomial((0.0, 1e-3, 0.0), 0.0), Polynomial((0.0, 1e-3, 0.0), 0.0)
