"""FluidPD's thresholds and timers (the seed's decision logic), as one typed config."""

from __future__ import annotations

from dataclasses import dataclass, field

from fluidpd.core.knobs import knob
from fluidpd.policy.fluidrole import FluidRoleConfig
from fluidpd.policy.fluidtoken_config import FluidTokenConfig

FCFS, LATE_LAST = "fcfs", "late-last"


@dataclass(slots=True)
class FluidConfig:
    """The seed's thresholds and timers (defaults documented in the README)."""

    alpha: float = knob(0.5, "DPI: weight of step latency vs KV use")
    theta_d_low: float = knob(0.8, "FluidToken borrows only while DPI is below this")
    theta_p_high: float = knob(1.5, "sustained prefill deficit: PPI above this ...")
    theta_d_idle: float = knob(0.8, "... while DPI is below this")
    theta_d_high: float = knob(0.85, "sustained decode deficit: DPI above this ...")
    theta_p_idle: float = knob(0.5, "... while PPI is below this")
    tau_persist_s: float = knob(1.0, "seconds a deficit must persist before a role switch")
    tau_residence_s: float = knob(5.0, "seconds a worker keeps a role before it may switch again")
    drain_timeout_s: float = knob(30.0, "a FluidRole drain longer than this rolls back (0: never)")
    decode_kv_share: float = knob(0.8, "a decode worker may leave only if the rest hold decode's KV within this share")
    horizon_s: float = knob(30.0, "a decode -> prefill switch needs a prefill deficit predicted this far ahead")
    switch_cost_s: float = knob(
        2.0, "a role switch costs this many seconds of one worker: it must gain more over the horizon"
    )
    queue_order: str = knob(
        LATE_LAST, "prefill queues: fcfs, or late-last (requests already past SLO_TTFT wait behind the rest)"
    )
    pool_size: int = knob(64, "fluidpd-pools: workers per pool, each with its own control loop")
    pool_rebalance_s: float = knob(1.0, "fluidpd-pools: seconds between moves of a worker across pools")
    ppi_cap: float = 10.0  # the PPI scan stops here: past it every decision is the same
    history_s: float = 0.1  # PPI/DPI samples kept for timelines
    token: FluidTokenConfig = field(default_factory=FluidTokenConfig)
    role: FluidRoleConfig = field(default_factory=FluidRoleConfig)

    def __post_init__(self) -> None:
        if not 0 <= self.alpha <= 1:
            raise ValueError("alpha must be in [0, 1]")
        if self.tau_persist_s < 0 or self.tau_residence_s < 0 or self.drain_timeout_s < 0:
            raise ValueError("tau_persist_s, tau_residence_s and drain_timeout_s must be >= 0")
        if self.queue_order not in (FCFS, LATE_LAST):
            raise ValueError(f"queue_order must be {FCFS} or {LATE_LAST}, not {self.queue_order!r}")
        if not 0 < self.decode_kv_share <= 1:
            raise ValueError("decode_kv_share must be in (0, 1]")
        if self.ppi_cap <= 0 or self.history_s <= 0 or self.horizon_s <= 0 or self.switch_cost_s < 0:
            raise ValueError("ppi_cap, history_s and horizon_s must be > 0, switch_cost_s >= 0")
        if self.pool_size < 4 or self.pool_rebalance_s <= 0:
            raise ValueError("pool_size must be >= 4 and pool_rebalance_s > 0")
