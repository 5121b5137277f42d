"""This host's capacity, and the load a real-engine benchmark replays at, so that a figure means the
same on a fast and a slow machine.

Speed: `fluidpd serve` measures its engine at startup (a 512-token prefill and a one-request decode
step at the threads a worker runs; `/v1/admin/cluster` `profile`). Against the committed `cpu-host`
profile's prediction of the same two steps they are the simulator's step scales for this host.

Load: the requests of a window of a trace (`Window`: the same requests on every host) replay at a
rate scale. The capacity-relative rate is a share of the saturation rate: the highest rate scale
at which static-pd at its best split keeps >= 90% joint attainment on the history window (the
requests just before the evaluated ones), searched in simulation on this host's scaled profile
(`fluidpd.bench.saturation`), as the simulated KV experiment chooses its loads.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

from fluidpd.bench.saturation import Probe, search
from fluidpd.core.metrics import Slo
from fluidpd.latency.shape import StepShape
from fluidpd.policy.base import PolicyConfig
from fluidpd.sim.config import SimConfig
from fluidpd.sim.run import Setup, simulate
from fluidpd.specs.hardware import get_hardware
from fluidpd.specs.models import get_model
from fluidpd.workload.registry import load_trace
from fluidpd.workload.trace import Trace

PREFILL_KV_FRACTION = 0.5  # RuntimeConfig's default, given to the simulator
PROBES = 7


@dataclass(frozen=True, slots=True)
class Window:
    """The requests of `name` arriving in [start_s, start_s + span_s) of the trace's own clock."""

    name: str
    start_s: float
    span_s: float

    @classmethod
    def parse(cls, spec: str, duration_s: float) -> tuple[Window, float]:
        """`NAME:RATE@START` with `duration_s` (START and the duration on the rate-scaled clock, as
        `fluidpd bench` and the runtime benchmarks write them): the window and RATE."""
        name, _, rest = spec.partition(":")
        rate_text, _, start_text = (rest or "1").partition("@")
        rate = float(rate_text)
        if not rate > 0 or not duration_s > 0:
            raise ValueError(f"{spec!r}: the rate scale and the duration must be > 0")
        return cls(name, float(start_text or 0) * rate, duration_s * rate), rate

    def at(self, rate: float, max_requests: int | None = None, max_model_len: int | None = None) -> Trace:
        """The window's requests replayed at `rate` (its arrivals re-based to 0), clipped to
        `max_model_len` as the bench client clips them."""
        trace = load_trace(self.name).shaped(rate, self.span_s / rate, max_requests, self.start_s / rate)
        return trace.clipped(max_model_len)[0] if max_model_len else trace

    def before(self) -> Window:
        """The history window: as long, just before."""
        return Window(self.name, max(0.0, self.start_s - self.span_s), min(self.span_s, self.start_s))

    def after(self, span_s: float) -> Window:
        """`span_s` of the trace's own clock right after the window (a calibration window)."""
        return Window(self.name, self.start_s + self.span_s, span_s)

    def spec(self, rate: float) -> str:
        """The `NAME:RATE@START` the window is at `rate`."""
        return f"{self.name}:{rate:.4g}@{self.start_s / rate:.6g}"


@dataclass(frozen=True, slots=True)
class HostSpeed:
    """This host's engine as a served worker runs it, and the simulator's step scales that match it."""

    prefill_512_s: float
    decode_step_s: float
    threads: int
    scales: dict  # {"decode": x, "prefill": y}: measured over the cpu-host profile's prediction

    @classmethod
    def of(cls, profile: dict, workers: int, slo: Slo) -> HostSpeed:
        """From a server's `/v1/admin/cluster` `profile`."""
        model = host_setup(workers, slo).roofline()
        prefill, decode = StepShape(), StepShape()
        prefill.add_chunk(512, 0)
        decode.add_decodes(1, 5)  # the profile's decode: a 4-token prompt and its first token
        scales = {
            "decode": profile["decode_step_s"] / model.step_time(decode),
            "prefill": profile["prefill_512_s"] / model.step_time(prefill),
        }
        return cls(profile["prefill_512_s"], profile["decode_step_s"], int(profile.get("threads", 0)), scales)

    @classmethod
    def median_of(cls, profiles: list[dict], workers: int, slo: Slo) -> HostSpeed:
        """From several servers' profiles (a benchmark's runs): their median."""
        keys = ("prefill_512_s", "decode_step_s")
        return cls.of(profiles[0] | {k: statistics.median(p[k] for p in profiles) for k in keys}, workers, slo)

    @classmethod
    def measure(cls, workers: int, slo: Slo, quantization: str = "auto") -> HostSpeed:
        """Measure this host as `fluidpd serve --workers N [--quantization Q]` does at startup (SmolLM2)."""
        from fluidpd.engine.config import EngineConfig
        from fluidpd.runtime.build import measure_host
        from fluidpd.runtime.config import RuntimeConfig

        runtime = RuntimeConfig(workers=workers)
        profile = measure_host(EngineConfig(quantization=quantization), runtime)
        return cls.of(profile.summary(runtime.worker_threads), workers, slo)

    @property
    def prefill_tok_s(self) -> float:
        return 512 / self.prefill_512_s

    def describe(self) -> str:
        return (
            f"prefill {self.prefill_tok_s:.0f} tok/s (512 tokens in {self.prefill_512_s:.2f} s), decode step "
            f"{self.decode_step_s * 1e3:.1f} ms, {self.threads} thread(s) a worker; step scales vs cpu-host: "
            f"prefill {self.scales['prefill']:.2f}, decode {self.scales['decode']:.2f}"
        )

    def as_json(self) -> dict:
        return asdict(self) | {"prefill_tok_s": self.prefill_tok_s}


def server_profile(url: str) -> dict:
    """What a running `fluidpd serve` measured of this host at startup (`/v1/admin/cluster` `profile`)."""
    import json
    import urllib.request

    with urllib.request.urlopen(url.rstrip("/") + "/v1/admin/cluster", timeout=30) as r:
        return json.loads(r.read())["profile"]


def host_setup(
    workers: int,
    slo: Slo,
    scales: dict | None = None,
    prefill_workers: int = 1,
    prefill_kv_fraction: float = PREFILL_KV_FRACTION,
) -> Setup:
    """The simulator's setup of `fluidpd serve --workers N` with SmolLM2 on this host: the cpu-host
    profile at `scales`, the served SLOs, KV share and starting split."""
    scales = scales or {"decode": 1.0, "prefill": 1.0}
    sim = SimConfig(
        n_workers=workers,
        prefill_kv_fraction=prefill_kv_fraction,
        step_scale_decode=scales["decode"],
        step_scale_prefill=scales["prefill"],
    )
    return Setup(
        get_model("smollm2-135m", "fp32"),
        get_hardware("cpu-host"),
        slo,
        sim=sim,
        policy=PolicyConfig(prefill_workers=prefill_workers),
    )


def saturation_rate(
    window: Window,
    workers: int,
    slo: Slo,
    speed: HostSpeed,
    start_rate: float,
    max_requests: int | None = None,
    max_model_len: int | None = None,
    probes: int = PROBES,
) -> dict:
    """The saturation search on `window`'s history at this host's speed (see the module)."""

    def best_static(rate: float) -> Probe:
        scores = split_attainment(window.before().at(rate, max_requests, max_model_len), workers, slo, speed)
        best = max(scores, key=lambda k: scores[k])
        return Probe(rate, scores[best], f"static-pd {best}P{workers - best}D")

    return search(start_rate, probes, best_static)


def split_attainment(history: Trace, workers: int, slo: Slo, speed: HostSpeed) -> dict[int, float]:
    """Joint attainment of static-pd at every split (prefill workers 1..N-1) on `history`, simulated
    at this host's speed: what DistServe tunes its split on."""
    if len(history) == 0:
        raise ValueError(f"{history.name}: the history window holds no requests")
    return {
        k: simulate(history, "static-pd", host_setup(workers, slo, speed.scales, prefill_workers=k)).summary[
            "attainment"
        ]
        for k in range(1, workers)
    }


def best_split(window: Window, rate: float, workers: int, slo: Slo, speed: HostSpeed, **clip) -> int:
    """The prefill workers of static-pd's best split on `window`'s history at `rate` (ties: fewer)."""
    scores = split_attainment(window.before().at(rate, **clip), workers, slo, speed)
    return max(scores, key=lambda k: (scores[k], -k))


@dataclass(frozen=True, slots=True)
class Load:
    """The rate a benchmark replays its window at, and where it came from."""

    rate: float
    share: float | None  # of the saturation rate (None: a fixed rate)
    saturation: dict | None = None

    def describe(self) -> str:
        if self.share is None or self.saturation is None:
            return f"rate scale {self.rate:.4g} (fixed)"
        sat = self.saturation
        reached = "" if sat["reached"] else " (not reached: the lowest rate tried)"
        best = max((p for p in sat["probes"] if p["load"] == sat["saturation_load"]), key=lambda p: p["attainment"])
        return (
            f"rate scale {self.rate:.4g} = {self.share:g} x this host's saturation {sat['saturation_load']:.4g}"
            f"{reached} (the highest rate at which static-pd's best split, {best['best']}, keeps >= "
            f"{sat['target_attainment']:.0%} joint attainment on the history window, simulated at this host's speed)"
        )

    def as_json(self) -> dict:
        return {"rate": self.rate, "share": self.share, "saturation": self.saturation}


def load_for(
    window: Window,
    workers: int,
    slo: Slo,
    speed: HostSpeed,
    reference_rate: float,
    share: float | None,
    fixed_rate: float | None = None,
    max_requests: int | None = None,
    max_model_len: int | None = None,
) -> Load:
    """A fixed rate if one is given, else `share` of the saturation rate (searched from `reference_rate`)."""
    if fixed_rate is not None:
        return Load(fixed_rate, None)
    if share is None or not share > 0 or not math.isfinite(share):
        raise ValueError(f"a capacity share must be > 0, got {share}")
    sat = saturation_rate(window, workers, slo, speed, reference_rate, max_requests, max_model_len)
    return Load(share * sat["saturation_load"], share, sat)
