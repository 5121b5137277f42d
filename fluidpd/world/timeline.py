"""Periodic samples of every worker's queue, batch, KV use, role and busy time, for plots."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Timeline:
    """Time series, one row per sample and one column per worker."""

    n_workers: int
    t: list = field(default_factory=list)
    queue: list = field(default_factory=list)
    decoding: list = field(default_factory=list)
    kv_use: list = field(default_factory=list)
    role: list = field(default_factory=list)
    utilization: list = field(default_factory=list)
    _last_busy: list = field(default_factory=list)
    _last_t: float = 0.0

    def sample(self, now: float, workers) -> None:
        busy = [sum(w.busy_s.values()) for w in workers]
        dt = now - self._last_t
        if self._last_busy and dt > 0:
            self.utilization.append([min(1.0, (b - p) / dt) for b, p in zip(busy, self._last_busy)])
        else:
            self.utilization.append([0.0] * len(workers))
        self._last_busy, self._last_t = busy, now
        self.t.append(now)
        self.queue.append([len(w.queue) + len(w.pulls) for w in workers])
        self.decoding.append([w.num_decoding for w in workers])
        self.kv_use.append([w.kv_blocks_used / w.kv_blocks_total for w in workers])
        self.role.append([w.role.value for w in workers])
