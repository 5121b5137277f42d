"""`fluidpd serve --placement`: the served cluster's starting split from this host's profile."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from fluidpd.cli import build_parser
from fluidpd.cli.serve import configs
from fluidpd.cli.serve_placement import placed_runtime
from fluidpd.runtime.ray_links import RayLinks


def _placed(*argv: str, links=None):
    args = build_parser().parse_args(["serve", *argv])
    engine, runtime, _ = configs(args)
    return placed_runtime(args, engine, runtime, links)


def _attainment(why: str) -> float:
    return float(re.search(r"static-pd attainment ([0-9.]+)%", why).group(1))


def test_auto_picks_a_split_by_simulating_this_host():
    runtime, why = _placed("--workers", "4", "--policy", "static-pd", "--placement", "auto")
    k = runtime.scheduling.prefill_workers
    assert 1 <= k <= 3 and why.startswith(f"placement: {k}P:{4 - k}D (auto: static-pd attainment")
    looser, _ = _placed("--workers", "4", "--policy", "static-pd", "--placement", "auto", "--ttft-slo", "60")
    assert 1 <= looser.scheduling.prefill_workers <= 3


@pytest.mark.slow
def test_a_place_file_sets_the_share(tmp_path):
    out = tmp_path / "place.json"
    cmd = [sys.executable, "-m", "fluidpd.cli", "place", "--model", "smollm2-135m", "--dtype", "fp32"]
    cmd += ["--gpu", "cpu-host", "--nodes", "1", "--gpus-per-node", "4", "--trace", "azure_conv"]
    cmd += ["--duration", "300", "--ttft-slo", "20", "--tpot-slo", "0.5", "--rate", "0.2", "--out", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    share = json.loads(out.read_text())
    runtime, why = _placed("--workers", "4", "--placement", str(out))
    p = runtime.scheduling.prefill_workers
    assert 1 <= p <= 3 and f"from {out}" in why
    assert share  # the file the split came from


def test_without_the_flag_nothing_changes_and_bad_uses_fail():
    runtime, why = _placed("--workers", "4")
    assert why is None and runtime.scheduling.prefill_workers == 0
    with pytest.raises(ValueError, match="workers >= 2"):
        _placed("--workers", "1", "--placement", "auto")
    with pytest.raises(ValueError, match="P/D policy"):
        _placed("--workers", "4", "--policy", "chunked", "--placement", "auto")


def test_auto_on_ray_nodes_moves_kv_over_the_measured_link():
    """Workers on two Ray nodes whose link was measured slow: the search simulates each worker on
    its bundle's node, so KV handed across nodes costs seconds and the best split attains less."""
    argv = ("--workers", "4", "--policy", "static-pd", "--placement", "auto", "--ttft-slo", "10")
    _, local = _placed(*argv)
    slow = RayLinks(nodes=[0, 1, 0, 1], bandwidth={"object_store": 2e6}, nbytes=8 << 20)  # 2 MB/s
    _, across = _placed(*argv, links=slow)
    one_node = RayLinks(nodes=[0, 0, 0, 0])  # nothing measured: the host profile's link
    _, same = _placed(*argv, links=one_node)
    assert same == local
    assert _attainment(across) < _attainment(local) - 5
