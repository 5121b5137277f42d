"""`fluidpd profile` on a small grid: every part of the profile is measured and the fit reads it."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace

import pytest

from fluidpd.bench.host_profile.config import PARTS, ProfileConfig
from fluidpd.bench.host_profile.measure import measure_profile, spec_of
from fluidpd.engine.config import EngineConfig
from fluidpd.latency.profiled import fit_steps


@pytest.mark.slow
def test_small_profile_measures_every_part():
    cfg = ProfileConfig(
        workers=2,
        repeats=2,
        chunks=(8, 64),
        priors=(0, 128),
        batches=(1, 4),
        contexts=(64, 128),
        max_decode_tokens=512,  # the grid's largest (4 x 128); FluidRole's remap then moves live blocks
        mixed_context=128,
        mixed_chunks=(32,),
        mixed_batches=(1, 4),
        jitter_steps=10,
        dispatch_steps=3,
        contention_s=0.1,
        contention_rounds=1,
        transfer_tokens=(64, 128),
        step_tokens=64,
    )
    # SmolLM2-135M's shape from the dummy preset: the GGUF's without its tokenizer (which no profile
    # step reads), so each of the four loads (here and three worker processes) skips parsing the GGUF
    engine = EngineConfig(model="smollm2-135m", load_format="dummy", num_kv_blocks=64)
    p = measure_profile(engine, cfg, progress=False)
    kinds = [s["kind"] for s in p["steps"]]
    assert kinds.count("prefill") == 4 and kinds.count("decode") == 4 and kinds.count("mixed") == 2
    assert all(s["seconds"] > 0 and len(s["samples"]) == 2 for s in p["steps"])
    prior = next(s for s in p["steps"] if s["shape"]["prefill_kv_read"] == 128 and s["shape"]["prefill_tokens"] == 64)
    assert prior["shape"]["prefill_attn_pairs"] == 64 * 128 + 64 * 65 / 2
    decode = next(s for s in p["steps"] if s["kind"] == "decode" and s["shape"]["decode_tokens"] == 4)
    assert decode["shape"]["decode_ctx"] >= 4 * 64
    assert p["model"]["spec"] == "smollm2-135m" and p["model"]["kv_blocks"] == 64
    assert p["jitter"]["p999_s"] >= p["jitter"]["p50_s"] > 0
    excess = p["jitter"]["excess_s"]
    assert len(excess) == 10 and excess == sorted(excess) and excess[0] <= 0 <= excess[-1]
    # what the host measures is its business (a loaded host is slower): here, that each part was measured
    assert p["dispatch"]["decode_s"] > 0 and p["dispatch"]["prefill_s"] > 0
    assert p["kv_transfer"]["bandwidth_Bps"] > 0 and len(p["kv_transfer"]["points"]) == 2
    assert 0 < p["kv_transfer"]["export_share"] < 1  # both sides copy
    assert p["fluidrole"]["shrink_s"] > 0
    c = p["contention"]
    assert c["decode"][0] == 1.0 and len(c["decode"]) == len(c["prefill"]) == 2
    assert c["decode_cross"][0] == c["prefill_cross"][0] == 1.0 and len(c["decode_cross"]) == 2
    assert min(c["decode_cross"] + c["prefill_cross"]) > 0
    fit = fit_steps(p["steps"])
    assert math.isfinite(fit.mean_rel_error) and fit.mean_rel_error >= 0
    json.dumps(p)  # the file `fluidpd profile` writes
    again = measure_profile(engine, replace(cfg, jitter_steps=12), progress=False, parts=("jitter",), base=p)
    assert again["steps"] == p["steps"] and again["contention"] == p["contention"]  # kept
    assert again["dispatch"] == p["dispatch"]
    assert len(again["jitter"]["excess_s"]) == 12 and set(again["measured_parts"]) == set(PARTS)


@pytest.mark.slow
def test_spec_of_maps_engine_shapes_to_the_catalogue():
    """The SmolLM2 GGUF's shape (a dummy checkpoint of it) maps to its catalogue spec, and with 3
    layers to none (the profile above reads the spec of its engine's model this way)."""
    from fluidpd.engine.loaders import load_checkpoint

    other = load_checkpoint("smollm2", "dummy", overrides={"num_hidden_layers": 3}).config
    assert other.num_layers == 3 and spec_of(other) is None
    assert spec_of(replace(other, num_layers=30)).name == "smollm2-135m"


def test_profile_cli_rejects_bad_flags(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "fluidpd.cli", "profile", "--workers", "0", "--out", str(tmp_path / "p.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and "workers" in run.stderr
    assert not (tmp_path / "p.json").exists()


@pytest.mark.slow
def test_profile_parts_update_an_existing_profile_only(tmp_path, capsys):
    """In this process: the exit code `python -m fluidpd.cli` passes on is main's (the subprocess test above)."""
    from fluidpd.cli import main

    out = tmp_path / "p.json"
    cmd = ["profile", "--load-format", "dummy", "--out", str(out)]
    assert main([*cmd, "--parts", "jitter"]) == 2 and "does not exist" in capsys.readouterr().err
    out.write_text("{}")
    assert main([*cmd, "--parts", "jitter,bogus"]) == 2
    assert "bogus" in capsys.readouterr().err and out.read_text() == "{}"
