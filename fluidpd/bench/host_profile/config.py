"""What `fluidpd profile` measures (its parts) and how often (ProfileConfig), on a CPU host or one GPU."""

from __future__ import annotations

from dataclasses import dataclass

from fluidpd.core.knobs import knob

PROFILE_VERSION = 2
PARTS = ("steps", "jitter", "kv_transfer", "fluidrole", "dispatch", "contention")
# what every profile measures; the others may be left at their neutral value, marked not measured
REQUIRED_PARTS = ("steps", "jitter", "kv_transfer", "fluidrole")
# one GPU process: contention between CPU worker processes, and the process backend's per-step
# overhead (each worker would load its own copy of the model on the one GPU) are not measured
GPU_PARTS = REQUIRED_PARTS


@dataclass
class ProfileConfig:
    """What `fluidpd profile` measures, and how often."""

    workers: int = knob(4, "contention: time steps while 1..N worker processes are busy at once")
    repeats: int = knob(5, "timed steps per point (their median is the point)")
    chunks: tuple[int, ...] = (8, 32, 128, 256, 512, 1024, 2048)
    priors: tuple[int, ...] = (0, 512, 1536)
    batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    contexts: tuple[int, ...] = (64, 256, 1024, 2048)
    max_decode_tokens: int = knob(
        8192, "largest decode batch x context profiled (on a GPU also capped by the KV its memory holds)"
    )
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
    setup_tokens: int = 2048  # tokens per (untimed) prefill step that brings a decode batch to its context
    gpu_kv_share: float = 0.6  # a GPU: share of the memory free after the weights the profiled KV may take

    def __post_init__(self) -> None:
        if (
            min(self.workers, self.repeats, self.transfer_repeats, self.dispatch_steps, self.contention_rounds) < 1
            or self.jitter_steps < 10
            or self.contention_s <= 0
            or self.step_tokens < 2
            or self.setup_tokens < 1
            or not 0 < self.gpu_kv_share < 1
        ):
            raise ValueError(
                "workers, repeats, transfer_repeats, dispatch_steps and contention_rounds must be >= 1, "
                "jitter_steps >= 10, contention_s > 0, step_tokens >= 2, setup_tokens >= 1, gpu_kv_share in (0, 1)"
            )


# one GPU (Llama-3.1-8B's shape in bf16 on an H100 or H200): chunks to 8k tokens alone and after
# 4k of context, decode batches to 256 at contexts to 4k (as many as the KV its memory holds)
GPU_GRID = dict(
    chunks=(128, 256, 512, 1024, 2048, 4096, 8192),
    priors=(0, 4096),
    batches=(1, 4, 16, 64, 128, 256),
    contexts=(128, 1024, 4096),
    max_decode_tokens=256 * 4096,
    mixed_chunks=(128, 512),
    mixed_batches=(1, 16),
    mixed_context=1024,
    transfer_tokens=(64, 256, 1024, 4096),  # as many as /dev/shm holds (a container's may be 64 MB)
    setup_tokens=16384,
)


def gpu_config(**knobs) -> ProfileConfig:
    """The GPU grid (GPU_GRID), with `knobs` (ProfileConfig fields) over it."""
    return ProfileConfig(**(GPU_GRID | knobs))
