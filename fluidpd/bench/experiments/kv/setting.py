"""The KV-reuse table's cluster, SLOs and workloads (the package docstring gives the reasons)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fluidpd.core.metrics import Slo
from fluidpd.policy.base import PolicyConfig
from fluidpd.sim.config import SimConfig
from fluidpd.sim.run import Setup
from fluidpd.specs.hardware import get_hardware
from fluidpd.specs.models import get_model
from fluidpd.workload import load_trace
from fluidpd.workload.blockmap import oracle_hit_tokens
from fluidpd.workload.claude_code import load_claude_code
from fluidpd.workload.loaders import load_mooncake
from fluidpd.workload.trace import Trace

MODEL, DTYPE, GPU = "llama-3.1-8b", "bf16", "h100"
N_WORKERS = 8
JITTER_CV = 0.05
SLO = Slo(ttft_s=3.0, tbt_s=0.040)
COLD_PROMPT = 100_000  # a Claude Code context, prefilled cold for the TTFT SLO's justification
SHARES = (0.5, 0.8, 0.95)  # evaluated loads, as shares of the best baseline's saturation load


def setup(prefill_workers: int = 2, seed: int = 0, **policy) -> Setup:
    """The KV-reuse cluster (prefix cache on) with a static split and PolicyConfig overrides."""
    return Setup(
        get_model(MODEL, DTYPE),
        get_hardware(GPU),
        SLO,
        SimConfig(n_workers=N_WORKERS, enable_prefix_caching=True, step_jitter_cv=JITTER_CV, seed=seed),
        PolicyConfig(prefill_workers=prefill_workers, **policy),
    )


def context_len() -> int:
    return get_model(MODEL, DTYPE).max_context


@dataclass(frozen=True, slots=True)
class KvWorkload:
    """A session (or shared-prefix) workload, its load knob and its quick / full windows."""

    name: str
    knob: str  # what the load is: concurrent sessions, a rate scale, a request rate
    start_load: float  # where the saturation search begins
    window_s: float
    quick_window_s: float
    offset_s: float  # where the history window begins (the evaluated one follows it)
    about: str

    def raw(self, load: float, end_s: float, seed: int) -> Trace:
        """The whole trace at `load`, long enough to cover [0, end_s) of its clock."""
        if self.name == "claude_code":
            return load_claude_code(with_hashes=True, sessions=True, concurrency=load, seed=seed)
        if self.name == "mooncake_conv":
            return load_mooncake(kind="conversation", sessions=True).scale_rate(load)
        return load_trace("hot_prefix", rate=load, seed=seed, duration_s=end_s)

    def windows(self, load: float, window_s: float, seed: int) -> tuple[Trace, Trace, int]:
        """(history, evaluated, requests the context clip touched in either) at `load`: two
        consecutive `window_s` windows from `offset_s`."""
        raw = self.raw(load, self.offset_s + 2 * window_s, seed)
        history, a = raw.window(self.offset_s, window_s).clipped(context_len())
        trace, b = raw.window(self.offset_s + window_s, window_s).clipped(context_len())
        return history, trace, a + b


WORKLOADS = {
    "claude_code": KvWorkload(
        "claude_code",
        "concurrent sessions",
        64.0,
        1800.0,
        900.0,
        7200.0,
        "Claude Code agentic sessions, closed loop (~100k-token contexts)",
    ),
    "mooncake_conv": KvWorkload(
        "mooncake_conv",
        "rate scale (time compressed by x)",
        1.0,
        300.0,
        90.0,
        0.0,
        "Mooncake conversation sessions, closed loop",
    ),
    "hot_prefix": KvWorkload(
        "hot_prefix",
        "request rate (req/s)",
        64.0,
        120.0,
        10.0,
        0.0,
        "synthetic: 16 hot shared prefixes (Zipf 1.1), unique suffixes",
    ),
}


def oracle_new_tokens(trace: Trace, block: int) -> np.ndarray:
    """Per request: prompt tokens an infinite shared cache would not hold (`blockmap.oracle_hit_tokens`)."""
    return trace.prompt_len - oracle_hit_tokens(trace, block)


def followups(trace: Trace, block: int) -> np.ndarray:
    """Which requests are follow-ups (turn 2+): a later turn of a session in the window; in a trace
    without sessions, one whose leading block an earlier request in the window holds."""
    if trace.has_sessions:
        assert trace.session is not None
        mask = np.zeros(len(trace), dtype=bool)
        seen: set[int] = set()
        for i, s in enumerate(trace.session.tolist()):
            mask[i] = s >= 0 and s in seen
            seen.add(s)
        return mask
    return oracle_new_tokens(trace, block) < trace.prompt_len


def ttft_justification() -> dict:
    """The cold prefill of a 100k-token context and of a typical follow-up's new tokens, one worker alone."""
    r = setup().roofline()
    return {
        "cold_prompt_tokens": COLD_PROMPT,
        "cold_prefill_s": r.prefill_time(COLD_PROMPT),
        "hit_new_tokens": 8192,
        "hit_prefill_s": r.prefill_time(8192),
        "largest_new_tokens_in_slo": _largest_in(r, SLO.ttft_s),
        "slo_ttft_s": SLO.ttft_s,
    }


def _largest_in(r, seconds: float) -> int:
    """The longest prompt (to 1k tokens) that prefills alone within `seconds`."""
    n = 1024
    while n < context_len() and r.prefill_time(n + 1024) <= seconds:
        n += 1024
    return n
