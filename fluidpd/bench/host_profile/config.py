"""What `fluidpd profile` measures (its parts) and how often (ProfileConfig)."""

from __future__ import annotations

from dataclasses import dataclass

from fluidpd.core.knobs import knob

PROFILE_VERSION = 2
PARTS = ("steps", "jitter", "kv_transfer", "fluidrole", "dispatch", "contention")


@dataclass
class ProfileConfig:
    """What `fluidpd profile` measures, and how often."""

    workers: int = knob(4, "contention: time steps while 1..N worker processes are busy at once")
    repeats: int = knob(5, "timed steps per point (their median is the point)")
    chunks: tuple[int, ...] = (8, 32, 128, 256, 512, 1024, 2048)
    priors: tuple[int, ...] = (0, 512, 1536)
    batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    contexts: tuple[int, ...] = (64, 256, 1024, 2048)
    max_decode_tokens: int = knob(8192, "largest decode batch x context profiled")
    mixed_chunks: tuple[int, ...] = (32, 128, 512)
    mixed_batches: tuple[int, ...] = (1, 8)  # decode batches the mixed chunks join ...
    mixed_context: int = 256  # ... at this context (one of `contexts`)
    jitter_steps: int = knob(1000, "repeats of one decode step for the jitter percentiles (and the simulator's noise)")
    dispatch_steps: int = knob(30, "steps of each kind sent to a worker process for the runtime's per-step overhead")
    contention_s: float = knob(2.0, "seconds each contention level runs")
    contention_rounds: int = knob(2, "rounds of the contention levels (each level's median is kept)")
    transfer_tokens: tuple[int, ...] = (128, 512, 2048)
    # the jitter, dispatch and contention steps' context and prefill (FluidRole's remap: twice it)
    step_tokens: int = 256
    # fresh shared-memory segments fault in at 2-5x a memcpy now and then: a median of many
    transfer_repeats: int = knob(9, "KV hand-offs per request size (their median is the point)")

    def __post_init__(self) -> None:
        if (
            min(self.workers, self.repeats, self.transfer_repeats, self.dispatch_steps, self.contention_rounds) < 1
            or self.jitter_steps < 10
            or self.contention_s <= 0
            or self.step_tokens < 2
        ):
            raise ValueError(
                "workers, repeats, transfer_repeats, dispatch_steps and contention_rounds must be >= 1, "
                "jitter_steps >= 10, contention_s > 0, step_tokens >= 2"
            )
