"""How the serving runtime is run: workers, policy, SLOs, and the policy's own configs."""

from __future__ import annotations

from dataclasses import dataclass, field

from fluidpd.core.cpu import worker_threads
from fluidpd.core.knobs import knob
from fluidpd.core.metrics import Slo
from fluidpd.policy.base import PolicyConfig
from fluidpd.policy.fluidconfig import FluidConfig
from fluidpd.policy.registry import POLICIES

BACKENDS = ("process", "inprocess", "ray")


@dataclass(slots=True)
class RuntimeConfig:
    """Workers, the policy that runs them, its SLOs (CPU-sized defaults) and its knobs."""

    workers: int = knob(1, "engine workers, one engine each")
    threads: int = knob(0, "torch threads per worker (0: the usable cores split evenly between a machine's workers)")
    policy: str | None = knob(None, f"one of {', '.join(POLICIES)} (default: colocated for one worker, else fluidpd)")
    backend: str = knob(
        "process", "worker backend: a process per worker, threads of this process, or Ray actors", choices=BACKENDS
    )
    address: str = knob("", "--backend ray: the Ray cluster (auto, HOST:PORT; empty: start one on this machine)")
    ttft_slo_s: float = knob(5.0, "TTFT SLO, seconds", flag="--ttft-slo")
    tbt_slo_s: float = knob(0.5, "time-between-tokens SLO, seconds", flag="--tbt-slo")
    prefill_kv_fraction: float = knob(0.5, "share of a prefill worker's arena kept for KV (the rest is scratch)")
    heartbeat_timeout_s: float = knob(1.0, "a worker that answers no heartbeat for this long is lost")
    step_timeout_s: float = knob(60.0, "a worker whose step runs longer than this is lost")
    prefill_chunk_tokens: int = knob(
        512,
        "a step prefills at most this many tokens (a longer prompt takes a step per chunk, as vLLM's chunked "
        "prefill), so a long prompt's steps stay far inside --step-timeout-s (on a GPU, raise it: 2048-8192)",
    )
    replace_workers: bool = knob(True, "start a replacement for a lost worker")
    admit_ttft_factor: float = knob(
        0.8,
        "refuse (429) a request when the queue in front of it would push its predicted TTFT over this many "
        "TTFT SLOs (never for its own length: an idle server admits every request; 0: admit all)",
    )
    admit_max_prefill_s: float = knob(
        0.0,
        "a hard limit: refuse (400, prefill_limit_exceeded) a request whose own prefill is predicted over "
        "this many seconds, whatever the load (0: none; such a request is served best effort)",
    )
    step_log: str = knob("", "write one JSON line per engine step to this file (shape, engine and wall time)")
    kv_offloading_size: float = knob(
        0.0,
        "GiB of host memory per worker for a node-shared KV store behind the workers' arenas (0: none): "
        "a request's full KV blocks are written there when it ends, any worker of the node loads them back "
        "for a later prompt that starts with them (needs prefix caching)",
    )
    max_waiting: int = knob(512, "refuse (429) new requests while this many wait for their first token")
    profile_cache: bool = knob(
        True,
        "reuse this host's engine profile (step times) from $FLUIDPD_CACHE/profiles when the engine config, model "
        "file, threads, CPU, torch and engine code are the same (--no-profile-cache: measure it again)",
    )
    request_traces: int = knob(256, "keep the timelines of the last N requests for /v1/admin/traces (0: none)")
    otlp_traces_endpoint: str = knob(
        "",
        "export every request's timeline as OpenTelemetry spans to this OTLP/HTTP endpoint, e.g. "
        "http://127.0.0.1:4318/v1/traces (empty: off; needs fluidpd[otel])",
    )
    scheduling: PolicyConfig = field(default_factory=PolicyConfig)
    fluid: FluidConfig = field(default_factory=FluidConfig)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.policy is None:
            self.policy = "colocated" if self.workers == 1 else "fluidpd"
        POLICIES.get(self.policy).router_of(self.scheduling)
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0 (0: cores // workers), got {self.threads}")
        if self.admit_ttft_factor < 0 or self.admit_max_prefill_s < 0 or self.max_waiting < 1:
            raise ValueError("admit_ttft_factor and admit_max_prefill_s must be >= 0, and max_waiting >= 1")
        if self.request_traces < 0:
            raise ValueError(f"request_traces must be >= 0, got {self.request_traces}")
        if self.kv_offloading_size < 0:
            raise ValueError(f"kv_offloading_size must be >= 0 GiB, got {self.kv_offloading_size}")
        if self.prefill_chunk_tokens < 1:
            raise ValueError(f"prefill_chunk_tokens must be >= 1, got {self.prefill_chunk_tokens}")
        if self.heartbeat_timeout_s <= 0 or self.step_timeout_s <= 0:
            raise ValueError("heartbeat_timeout_s and step_timeout_s must be > 0")
        if not 0 < self.prefill_kv_fraction <= 1:
            raise ValueError("prefill_kv_fraction must be in (0, 1]")
        _ = self.slo  # validates the SLOs

    @property
    def worker_threads(self) -> int:
        """Torch threads of each worker when all `workers` share this machine."""
        return worker_threads(self.workers, self.threads)

    @property
    def slo(self) -> Slo:
        return Slo(self.ttft_slo_s, self.tbt_slo_s)
