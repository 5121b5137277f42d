"""This host's engine profile kept across `fluidpd serve` starts: what changes the key, what a broken file does."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from types import SimpleNamespace

import pytest

from fluidpd.core.knobs import add_flags, flag_values
from fluidpd.core.polynomial import Polynomial
from fluidpd.engine.config import EngineConfig
from fluidpd.runtime.config import RuntimeConfig
from fluidpd.runtime.profile import EngineProfile
from fluidpd.runtime.profile_cache import load_profile, profile_key, store_profile

PROFILE = EngineProfile(
    ((16, 0.01), (512, 0.9)), ((16, 0.004), (512, 0.8)), 0.012, Polynomial((1e-6, 1e-3, 0.0), 0.005),
    Polynomial((2e-6, 0.0)), 256,
)  # fmt: skip
INFO = SimpleNamespace(threads=2, quantization="gguf", attention="paged", device="cpu")


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FLUIDPD_CACHE", str(tmp_path))
    return tmp_path


def test_a_stored_profile_comes_back_equal_and_fits_evaluate_the_same():
    key = profile_key(EngineConfig(), INFO)
    assert load_profile(key) is None
    store_profile(key, PROFILE)
    got, when = load_profile(key)
    assert got == PROFILE and got.prefill_time(300) == PROFILE.prefill_time(300) and when.endswith("Z")
    assert got.chunk_time.floor == float("-inf")


def test_the_key_follows_what_step_times_depend_on(tmp_path):
    base = profile_key(EngineConfig(), INFO)
    assert profile_key(EngineConfig(), SimpleNamespace(**vars(INFO))) == base
    store = replace(EngineConfig(), kv_store="/dev/shm/one-run", kv_store_bytes=1 << 20)
    assert profile_key(replace(store, kv_store="/dev/shm/another-run"), INFO) == profile_key(store, INFO)
    assert profile_key(replace(EngineConfig(), quantization="gguf-q8"), INFO) != base
    assert profile_key(replace(EngineConfig(), kv_cache_dtype="float32"), INFO) != base
    assert profile_key(EngineConfig(), SimpleNamespace(**{**vars(INFO), "threads": 1})) != base
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    first = profile_key(EngineConfig(model=str(model)), INFO)
    os.utime(model, ns=(1, 1))  # the same path, another file
    assert profile_key(EngineConfig(model=str(model)), INFO) != first


def test_a_broken_file_is_a_miss_and_the_next_store_replaces_it(cache):
    key = profile_key(EngineConfig(), INFO)
    store_profile(key, PROFILE)
    (path,) = (cache / "profiles").iterdir()
    path.write_text('{"measured_at": "x", "profile": {"prefill_points": [[1]]}}')
    assert load_profile(key) is None
    store_profile(key, PROFILE)
    assert load_profile(key)[0] == PROFILE and [p.name for p in (cache / "profiles").iterdir()] == [path.name]


def test_the_flag_turns_it_off():
    p = argparse.ArgumentParser()
    add_flags(p, RuntimeConfig)
    assert flag_values(p.parse_args([]), RuntimeConfig)["profile_cache"] is True
    assert flag_values(p.parse_args(["--no-profile-cache"]), RuntimeConfig)["profile_cache"] is False
