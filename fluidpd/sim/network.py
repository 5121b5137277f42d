"""KV transfers between workers over links with bandwidth and a per-class cap."""

from __future__ import annotations

from dataclasses import dataclass, field

from fluidpd.world.links import HANDOFF, MIGRATION

__all__ = ["HANDOFF", "MIGRATION", "Network", "NetworkConfig"]


@dataclass(slots=True)
class NetworkConfig:
    """Link speeds (bytes/s) and the share of a link each transfer class may use."""

    intra_node_bw: float
    inter_node_bw: float
    latency_s: float = 10e-6
    class_caps: dict = field(default_factory=lambda: {HANDOFF: 1.0, MIGRATION: 0.4})

    def __post_init__(self) -> None:
        if self.intra_node_bw <= 0 or self.inter_node_bw <= 0:
            raise ValueError("link bandwidths must be positive")
        for cls, cap in self.class_caps.items():
            if not 0 < cap <= 1:
                raise ValueError(f"cap of {cls} must be in (0, 1]")


@dataclass(slots=True)
class Network:
    """Transfers of one class into one worker are served FIFO at that class's capped rate."""

    config: NetworkConfig
    busy_until: dict = field(default_factory=dict)  # (dst, class) -> time the channel frees
    bytes_moved: dict = field(default_factory=dict)  # class -> bytes

    def link_bw(self, src_node: int, dst_node: int) -> float:
        c = self.config
        return c.intra_node_bw if src_node == dst_node else c.inter_node_bw

    def bandwidth(self, src_node: int, dst_node: int, cls: str) -> float:
        return self.link_bw(src_node, dst_node) * self.config.class_caps[cls]

    def link_s(self, nbytes: float, src_node: int, dst_node: int) -> float:
        """Seconds `nbytes` take over the whole link, uncontended."""
        return self.config.latency_s + nbytes / self.link_bw(src_node, dst_node)

    def schedule(self, now: float, nbytes: float, src_node: int, dst_node: int, dst: int, cls: str) -> float:
        """Book a transfer; returns the time it completes."""
        key = (dst, cls)
        start = max(now, self.busy_until.get(key, 0.0))
        end = start + self.config.latency_s + nbytes / self.bandwidth(src_node, dst_node, cls)
        self.busy_until[key] = end
        self.bytes_moved[cls] = self.bytes_moved.get(cls, 0.0) + nbytes
        return end
