"""Simulated cluster configuration."""

from __future__ import annotations

from dataclasses import dataclass

from fluidpd.core.knobs import knob


@dataclass(slots=True)
class SimConfig:
    """Cluster shape, memory split, noise and run limits of one simulation."""

    n_workers: int = knob(8, "engine instances", flag="--workers")
    tp: int = knob(1, "GPUs per worker (tensor parallel)")
    gpus_per_node: int = knob(8, "GPUs per node (KV crosses the NIC between nodes)")
    block_size: int = 16
    gpu_memory_utilization: float = knob(0.95, "share of GPU memory the engine may use (as vLLM)")
    scratch_fraction: float = 0.02  # of GPU memory kept for activations
    step_jitter_cv: float = knob(
        0.0, "step-time noise: coefficient of variation of a log-normal factor", flag="--jitter-cv"
    )
    seed: int = knob(0, "seed of the trace sampling and step noise")
    drain_s: float = 1800.0  # time after the last arrival for requests to finish
    sample_s: float = 1.0  # timeline sampling period
    prefill_kv_fraction: float = knob(1.0, "share of a prefill worker's arena kept for KV (the rest is scratch)")
    hold_first_token: bool = knob(True, "release a handed-off request's first token with its first decode step")
    remap_s: float = 0.015  # FluidRole phase 2 (the seed: 10-25 ms)
    dispatch_s: float = 0.020  # FluidRole phase 3 (the seed: 15-30 ms)
    route_s: float = 0.002  # FluidRole phase 4 (the seed: sub-5 ms)
    # step slowdown while k workers run steps at once (index k-1; beyond: grows with k), by step
    # kind; a host profile fills them (workers sharing CPU cores), GPUs keep 1
    contention_decode: tuple[float, ...] = (1.0,)
    contention_prefill: tuple[float, ...] = (1.0,)

    def __post_init__(self) -> None:
        if self.n_workers < 1 or self.tp < 1 or self.gpus_per_node < 1:
            raise ValueError("workers, tp and gpus_per_node must be >= 1")
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if not 0 <= self.scratch_fraction < self.gpu_memory_utilization:
            raise ValueError("scratch_fraction must be in [0, gpu_memory_utilization)")
        if self.step_jitter_cv < 0 or self.drain_s < 0 or self.sample_s <= 0:
            raise ValueError("step_jitter_cv and drain_s must be >= 0, sample_s > 0")
        if not 0 < self.prefill_kv_fraction <= 1:
            raise ValueError("prefill_kv_fraction must be in (0, 1]")
        if min(self.remap_s, self.dispatch_s, self.route_s) < 0:
            raise ValueError("phase durations must be >= 0")
        if not self.contention_decode or not self.contention_prefill:
            raise ValueError("contention factors need at least the k = 1 entry")
        if min(*self.contention_decode, *self.contention_prefill) <= 0:
            raise ValueError("contention factors must be > 0")

    def phase_s(self, phase: str) -> float:
        return {"remap": self.remap_s, "dispatch": self.dispatch_s, "route": self.route_s}[phase]

    def contention(self, decode_only: bool, busy: int) -> float:
        """Slowdown of a step that starts while `busy` workers (itself included) run steps."""
        f = self.contention_decode if decode_only else self.contention_prefill
        if busy <= len(f):
            return f[max(busy, 1) - 1]
        return f[-1] * busy / len(f)

    def node_of(self, worker: int) -> int:
        return worker * self.tp // self.gpus_per_node
