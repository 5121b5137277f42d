"""Every workload under one name: `load_trace("azure_conv")`, `load_trace("my_trace.csv", rate=4)`."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import fluidpd.workload.loaders as loaders
from fluidpd.core.knobs import flag_values
from fluidpd.core.registry import Registry
from fluidpd.workload.claude_code import load_claude_code
from fluidpd.workload.datacenter import datacenter
from fluidpd.workload.datacenter_config import DatacenterConfig
from fluidpd.workload.files import read_header, read_jsonl
from fluidpd.workload.hot_prefix import hot_prefix
from fluidpd.workload.loaders import AZURE_COLUMNS, DEFAULT_LENGTH_RATE, LENGTH_COLUMNS, SIMPLE_COLUMNS
from fluidpd.workload.synth import phase_shift
from fluidpd.workload.trace import Trace

# name -> load(rate, seed, **kw): a trace with its own clock is rescaled to `rate` (req/s) when given;
# a length-only trace gets an arrival process at `rate` (default DEFAULT_LENGTH_RATE)
TRACES: Registry[Callable[..., Trace]] = Registry("trace")


def _timed(load: Callable[..., Trace]) -> Callable[..., Trace]:
    return lambda rate, seed, **kw: _at_rate(load(seed, **kw), rate)


def _lengths(kind: str) -> Callable[..., Trace]:
    return lambda rate, seed, **kw: loaders.load_length_trace(kind=kind, rate=_length_rate(rate), seed=seed, **kw)


TRACES.add("azure_conv", _timed(lambda seed, **kw: loaders.load_azure(kind="conv", **kw)))
TRACES.add("azure_code", _timed(lambda seed, **kw: loaders.load_azure(kind="code", **kw)))
TRACES.add("mooncake_conv", _timed(lambda seed, **kw: loaders.load_mooncake(kind="conversation", seed=seed, **kw)))
TRACES.add("mooncake_synth", _timed(lambda seed, **kw: loaders.load_mooncake(kind="synthetic", seed=seed, **kw)))
TRACES.add("claude_code", _timed(lambda seed, **kw: load_claude_code(seed=seed, **kw)))
for _kind in ("sharegpt", "arxiv_sum", "bwb"):
    TRACES.add(_kind, _lengths(_kind))
TRACES.add("phase_shift", _timed(lambda seed, **kw: phase_shift(seed=seed, **kw)))
# a Poisson process of its own: `rate` is its rate (default the generator's), not a rescaling
TRACES.add(
    "hot_prefix", lambda rate, seed, **kw: hot_prefix(**({} if rate is None else {"rate": rate}), seed=seed, **kw)
)

# datacenter traffic drawn from a real trace (kw: DatacenterConfig's fields); `rate` is its mean rate
TRACES.add(
    "datacenter",
    lambda rate, seed, **kw: _datacenter(
        DatacenterConfig(**kw) if rate is None else DatacenterConfig(rate=rate, **kw), seed
    ),
)
# loader options a datacenter source is read with (Mooncake's conversation clock comes in ~3 s steps)
DATACENTER_SOURCE_OPTIONS = {"mooncake_conv": {"spread_quantized": True}}

# loader options that make a trace closed-loop sessions with block ids (prefix reuse across turns)
SESSION_OPTIONS = {
    "claude_code": {"sessions": True, "with_hashes": True},
    "mooncake_conv": {"sessions": True},
    "mooncake_synth": {"sessions": True},
    "datacenter": {},  # always sessions with block ids
}


def session_options(name: str) -> dict:
    """`load_trace` options for `name` as sessions; a ValueError for a trace that has none."""
    if name not in SESSION_OPTIONS:
        raise ValueError(f"trace {name!r} has no sessions; these do: {', '.join(SESSION_OPTIONS)}")
    return dict(SESSION_OPTIONS[name])


def trace_flags(name: str, args: argparse.Namespace) -> dict:
    """`load_trace` options for `name` from a command's parsed flags (DatacenterConfig's --dc-* for datacenter)."""
    return flag_values(args, DatacenterConfig) if name == "datacenter" else {}


def load_trace(name_or_path: str | os.PathLike, *, rate: float | None = None, seed: int = 0, **kw) -> Trace:
    """A named workload (TRACES) or a trace file, with `kw` passed to its loader.

    rate (req/s): for length-only traces, the rate of their arrival process (default DEFAULT_LENGTH_RATE = 2);
    for traces with their own clock, time is rescaled so the mean rate equals `rate` (default: as recorded).
    """
    key = str(name_or_path)
    if key in TRACES:
        return TRACES.build(key, rate, seed, **kw)
    path = Path(name_or_path)
    if path.is_file():
        return _load_file(path, rate, seed, kw)
    if os.sep in key or "/" in key or path.suffix:
        raise FileNotFoundError(f"trace file not found: {path}")
    raise ValueError(f"unknown trace {key!r}; valid names: {', '.join(TRACES)} (or a path to a trace file)")


def _load_file(path: Path, rate: float | None, seed: int, kw: dict) -> Trace:
    if path.name.endswith((".jsonl", ".jsonl.gz", ".json")):
        first = next(read_jsonl(path), (1, {}))[1]
        if "input_length" in first:
            return _at_rate(loaders.load_mooncake(path, seed=seed, **kw), rate)
        if "input_tokens" in first and "t_s" in first:
            return _at_rate(load_claude_code(path, seed=seed, **kw), rate)
        raise ValueError(
            f"{path}: unrecognised JSON-lines trace (expected Mooncake or Claude Code fields), "
            f"first record has keys {sorted(first)}"
        )
    header = set(read_header(path))
    if header >= set(AZURE_COLUMNS):
        return _at_rate(loaders.load_azure(path, **kw), rate)
    if header >= set(LENGTH_COLUMNS):
        return loaders.load_length_trace(path, rate=_length_rate(rate), seed=seed, **kw)
    if header >= set(SIMPLE_COLUMNS):
        return _at_rate(loaders.load_csv_trace(path, **kw), rate)
    raise ValueError(
        f"{path}: unrecognised trace header {sorted(header)}; expected {', '.join(AZURE_COLUMNS)} "
        f"(Azure), {', '.join(LENGTH_COLUMNS)} (lengths only) or {', '.join(SIMPLE_COLUMNS)}"
    )


def _datacenter(cfg: DatacenterConfig, seed: int) -> Trace:
    return datacenter(_datacenter_source(cfg.source), cfg, seed)


@lru_cache(maxsize=4)
def _datacenter_source(name: str) -> Trace:
    return TRACES.build(name, None, 0, **DATACENTER_SOURCE_OPTIONS.get(name, {}))


def _length_rate(rate: float | None) -> float:
    return DEFAULT_LENGTH_RATE if rate is None else rate


def _at_rate(trace: Trace, rate: float | None) -> Trace:
    if rate is None:
        return trace
    if not (rate > 0) or trace.mean_rate == 0:
        raise ValueError(f"cannot rescale trace {trace.name!r} (mean rate {trace.mean_rate:g}) to rate {rate}")
    return trace.scale_rate(rate / trace.mean_rate)
