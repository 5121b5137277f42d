"""Torch threads per worker: the usable cores split between a machine's workers, or the --threads knob."""

from __future__ import annotations

import argparse
import os

import pytest
import torch

from fluidpd.cli import serve
from fluidpd.core.cpu import usable_cores, worker_threads
from fluidpd.runtime.config import RuntimeConfig
from fluidpd.runtime.inprocess import InProcessWorker
from tests.runtime.rtbackend_help import tiny_config


def test_default_splits_the_usable_cores_between_the_workers():
    cores = usable_cores()
    assert worker_threads(1) == cores
    assert worker_threads(2) == max(1, cores // 2)
    assert worker_threads(cores + 3) == 1  # never none
    assert worker_threads(4, threads=3) == 3  # the knob wins
    assert RuntimeConfig(workers=1).worker_threads == cores
    assert RuntimeConfig(workers=4, threads=2).worker_threads == 2


def test_the_policy_is_told_how_many_steps_the_shared_cores_run_at_once():
    from fluidpd.engine.config import EngineConfig
    from fluidpd.runtime.build import compute_slots

    cores, cpu = usable_cores(), EngineConfig(device="cpu")
    assert compute_slots(RuntimeConfig(workers=4), cpu, 1) == cores
    assert compute_slots(RuntimeConfig(workers=4), cpu, cores + 1) == 1  # threads past the cores: one at a time
    assert compute_slots(RuntimeConfig(workers=4, backend="inprocess"), cpu, 2) == max(1, cores // 2)
    assert compute_slots(RuntimeConfig(workers=4, backend="ray"), cpu, 1) == 0  # nodes of their own
    assert compute_slots(RuntimeConfig(workers=4), EngineConfig(device="cuda"), 1) == 0  # a device each


def test_bad_thread_counts_are_refused():
    with pytest.raises(ValueError, match="threads"):
        RuntimeConfig(threads=-1)
    with pytest.raises(ValueError, match="workers"):
        worker_threads(0)


def test_serve_flag_comes_from_the_config():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    serve.register(sub)
    _, runtime, _ = serve.configs(p.parse_args(["serve", "--threads", "3", "--workers", "2"]))
    assert (runtime.threads, runtime.worker_threads) == (3, 3)
    _, runtime, _ = serve.configs(p.parse_args(["serve"]))
    assert runtime.threads == 0 and runtime.worker_threads == usable_cores()


def test_in_process_worker_sets_its_own_thread_only():
    """Workers of one process share it: each sets the count on its own thread, not the caller's."""
    before = torch.get_num_threads()
    want = 2 if before == 1 else 1
    w = InProcessWorker(0, tiny_config(), num_threads=want, warmup=False)
    try:
        assert w.start().threads == want
    finally:
        w.close()
    assert torch.get_num_threads() == before


def test_a_gguf_worker_is_spawned_with_openmp_threads_that_sleep(monkeypatch):
    from fluidpd.engine.config import EngineConfig
    from fluidpd.runtime.process import child_environ

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    with child_environ(EngineConfig()):  # the shipped GGUF: the gguf kernel's pool beside OpenMP
        assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    assert "OMP_WAIT_POLICY" not in os.environ  # only the child's environment
    with child_environ(EngineConfig(quantization="fp16")):
        assert "OMP_WAIT_POLICY" not in os.environ
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    with child_environ(EngineConfig()):
        assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"  # the user's setting wins
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
