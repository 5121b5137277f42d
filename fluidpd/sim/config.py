"""Simulated cluster configuration."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from fluidpd.core.knobs import knob


@dataclass(slots=True)
class SimConfig:
    """Cluster shape, memory split, noise and run limits of one simulation."""

    n_workers: int = knob(8, "engine instances", flag="--workers")
    tp: int = knob(1, "GPUs per worker (tensor parallel)")
    ep: int = knob(1, "of a worker's tp GPUs, how many split a mixture's experts (expert parallel; divides tp)")
    gpus_per_node: int = knob(8, "GPUs per node (KV crosses the NIC between nodes)")
    # the node of each worker where a measured placement says (a Ray cluster's bundles); empty:
    # workers fill nodes of `gpus_per_node` GPUs in order
    worker_nodes: tuple[int, ...] = ()
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
    enable_prefix_caching: bool = knob(
        True, "reuse cached KV of a shared prefix (traces with block ids: Mooncake, Claude Code, sessions)"
    )
    kv_offloading_size: float = knob(
        0.0, "GiB of host memory per worker for KV evicted from the device (0: no host tier; as vLLM's flag)"
    )
    kv_offloading_pooled: bool = knob(False, "one host tier per node, shared by its workers (Mooncake Store's shape)")
    kv_offloading_reused_only: bool = knob(False, "offload a block only the second time it is evicted")
    kv_offloading_bw: float = 0.0  # host <-> device bytes/s of a KV load (0: the accelerator's PCIe link)
    remap_s: float = 0.015  # FluidRole phase 2 (the seed: 10-25 ms)
    dispatch_s: float = 0.020  # FluidRole phase 3 (the seed: 15-30 ms)
    route_s: float = 0.002  # FluidRole phase 4 (the seed: sub-5 ms)
    # step slowdown while k workers run steps at once (index k-1; beyond: grows with k), by step
    # kind; a host profile fills them (workers sharing CPU cores), GPUs keep 1
    contention_decode: tuple[float, ...] = (1.0,)
    contention_prefill: tuple[float, ...] = (1.0,)
    # ... of a decode step among k - 1 prefills, and of a prefill among k - 1 decodes (empty: as
    # among its own kind); a mix interpolates by the share of the others of the other kind
    contention_decode_cross: tuple[float, ...] = ()
    contention_prefill_cross: tuple[float, ...] = ()
    # a host profile's measured step noise (seconds added to a step: its samples' excess over their
    # median, drawn uniformly; replaces the log-normal factor) and the runtime's dispatch overhead
    # per step (plan to the worker, result back to the coordinator), by step kind
    step_noise_s: tuple[float, ...] = ()
    dispatch_decode_s: float = 0.0
    dispatch_prefill_s: float = 0.0
    # the share of a KV move's link time its source and its destination spend copying (a CPU
    # transport: the copy runs in the worker between its steps, so its next step waits for it);
    # GPUs move KV by DMA and keep 0
    kv_export_share: float = 0.0
    kv_import_share: float = 0.0
    # the host ran this much slower (> 1) or faster than its profile, by step kind, as a window
    # the runtime served just before says (shared machines change speed over hours)
    step_scale_decode: float = 1.0
    step_scale_prefill: float = 1.0

    def __post_init__(self) -> None:
        if self.n_workers < 1 or self.tp < 1 or self.gpus_per_node < 1:
            raise ValueError("workers, tp and gpus_per_node must be >= 1")
        if self.ep < 1 or self.tp % self.ep:
            raise ValueError(f"ep must be a positive divisor of tp={self.tp}, got {self.ep}")
        if self.worker_nodes and len(self.worker_nodes) != self.n_workers:
            raise ValueError(f"worker_nodes names {len(self.worker_nodes)} nodes for {self.n_workers} workers")
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if not 0 <= self.scratch_fraction < self.gpu_memory_utilization:
            raise ValueError("scratch_fraction must be in [0, gpu_memory_utilization)")
        if self.kv_offloading_size < 0 or self.kv_offloading_bw < 0:
            raise ValueError("kv_offloading_size and kv_offloading_bw must be >= 0")
        if self.step_jitter_cv < 0 or self.drain_s < 0 or self.sample_s <= 0:
            raise ValueError("step_jitter_cv and drain_s must be >= 0, sample_s > 0")
        if not 0 < self.prefill_kv_fraction <= 1:
            raise ValueError("prefill_kv_fraction must be in (0, 1]")
        if min(self.remap_s, self.dispatch_s, self.route_s) < 0:
            raise ValueError("phase durations must be >= 0")
        if not self.contention_decode or not self.contention_prefill:
            raise ValueError("contention factors need at least the k = 1 entry")
        tables = (
            self.contention_decode,
            self.contention_prefill,
            self.contention_decode_cross,
            self.contention_prefill_cross,
        )
        if min(x for t in tables for x in t) <= 0:
            raise ValueError("contention factors must be > 0")
        if min(self.dispatch_decode_s, self.dispatch_prefill_s) < 0:
            raise ValueError("dispatch overheads must be >= 0")
        if not (0 <= self.kv_export_share <= 1 and 0 <= self.kv_import_share <= 1):
            raise ValueError("KV copy shares must be in [0, 1]")
        if min(self.step_scale_decode, self.step_scale_prefill) <= 0:
            raise ValueError("step scales must be > 0")

    def phase_s(self, phase: str) -> float:
        return {"remap": self.remap_s, "dispatch": self.dispatch_s, "route": self.route_s}[phase]

    @property
    def contended(self) -> bool:
        """Whether steps slow each other down (workers sharing a host's cores)."""
        return (self.contention_decode, self.contention_prefill) != ((1.0,), (1.0,))

    def compute_slots(self) -> int:
        """Prefill steps that run at once at full speed (within 10% of alone) on a host whose
        workers share its cores; 0 where they do not (each has its own device)."""
        if not self.contended:
            return 0
        return max(1, sum(1 for _ in itertools.takewhile(lambda f: f <= 1.1, self.contention_prefill)))

    def contention(self, decode_only: bool, busy: int, cross: int = 0) -> float:
        """Slowdown of a step while `busy` workers (itself included) run steps, `cross` of them
        of the other kind (prefill-carrying vs decode-only)."""
        same = _factor(self.contention_decode if decode_only else self.contention_prefill, busy)
        table = self.contention_decode_cross if decode_only else self.contention_prefill_cross
        if not cross or not table or busy <= 1:
            return same
        x = min(cross / (busy - 1), 1.0)
        return (1 - x) * same + x * _factor(table, busy)

    def node_of(self, worker: int) -> int:
        if self.worker_nodes:
            return self.worker_nodes[worker]
        return worker * self.tp // self.gpus_per_node


def _factor(f: tuple[float, ...], busy: int) -> float:
    """Entry k - 1 of a contention table; beyond its end it grows with k."""
    if busy <= len(f):
        return f[max(busy, 1) - 1]
    return f[-1] * busy / len(f)
