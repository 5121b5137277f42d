"""Workloads: real traces (Azure, Mooncake, Claude Code, length-only files), arrival processes, synthetic mixes,
datacenter traffic drawn from a real trace."""

from fluidpd.workload.arrivals import arrival_times, gamma, onoff, poisson
from fluidpd.workload.claude_code import DEFAULT_CLAUDE_CONCURRENCY, load_claude_code
from fluidpd.workload.datacenter import datacenter
from fluidpd.workload.datacenter_config import DatacenterConfig
from fluidpd.workload.files import trace_dir
from fluidpd.workload.hot_prefix import hot_prefix, zipf_shares
from fluidpd.workload.loaders import (
    DEFAULT_LENGTH_RATE,
    load_azure,
    load_csv_trace,
    load_length_trace,
    load_lengths,
    load_mooncake,
    spread_steps,
)
from fluidpd.workload.registry import TRACES, load_trace
from fluidpd.workload.sampling import resample, sample_requests
from fluidpd.workload.synth import fixed_lengths, phase_shift, sample_lengths, synthetic
from fluidpd.workload.trace import Trace, compose

__all__ = [
    "DEFAULT_CLAUDE_CONCURRENCY",
    "DEFAULT_LENGTH_RATE",
    "TRACES",
    "DatacenterConfig",
    "Trace",
    "arrival_times",
    "compose",
    "datacenter",
    "fixed_lengths",
    "gamma",
    "hot_prefix",
    "load_azure",
    "load_claude_code",
    "load_csv_trace",
    "load_length_trace",
    "load_lengths",
    "load_mooncake",
    "load_trace",
    "onoff",
    "phase_shift",
    "poisson",
    "resample",
    "sample_lengths",
    "sample_requests",
    "spread_steps",
    "synthetic",
    "trace_dir",
    "zipf_shares",
]
