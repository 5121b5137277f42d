"""What a placement search is asked: the cluster, the target rate and attainment, and its effort."""

from __future__ import annotations

from dataclasses import dataclass

from fluidpd.core.knobs import knob

ALGORITHMS = ("1", "2", "auto")


@dataclass(slots=True)
class PlaceConfig:
    """Cluster shape, target and search effort of one `fluidpd place` run."""

    nodes: int = knob(1, "nodes N (an instance spans at most all of them)")
    gpus_per_node: int = knob(8, "GPUs per node M")
    rate: float | None = knob(None, "target rate R, req/s (default: the history window's mean rate)")
    attainment: float = knob(0.9, "share of requests that must meet both SLOs")
    algorithm: str = knob("auto", "1 (high node-affinity), 2 (low), or auto from the KV traffic", choices=ALGORITHMS)
    max_segments: int = knob(
        1, "Algorithm 2: up to this many prefill and decode segments per node (1: the paper's 1:1)"
    )
    requests: int = knob(400, "requests simulated per rate tried")
    iters: int = knob(5, "bisection steps of each rate search")
    jobs: int = knob(0, "processes scoring candidates (0: one per core)")
    prune: bool = knob(True, "Algorithm 2: skip units whose segments alone cannot beat the best unit")
    kv_link_share: float = 0.5  # auto: Algorithm 1 while one prefill instance's KV stream fits this share of the NIC

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1 or self.max_segments < 1:
            raise ValueError("nodes, gpus_per_node and max_segments must be >= 1")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate must be > 0, got {self.rate}")
        if not 0 < self.attainment <= 1:
            raise ValueError(f"attainment must be in (0, 1], got {self.attainment}")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}, got {self.algorithm!r}")
        if self.requests < 10 or self.iters < 1 or self.jobs < 0:
            raise ValueError("requests must be >= 10, iters >= 1 and jobs >= 0")
        if not 0 < self.kv_link_share <= 1:
            raise ValueError("kv_link_share must be in (0, 1]")

    def ratios(self) -> list[tuple[int, int]]:
        """Algorithm 2's (prefill, decode) segments per node."""
        k = self.max_segments
        return [(a, b) for a in range(1, k + 1) for b in range(1, k + 1)]
