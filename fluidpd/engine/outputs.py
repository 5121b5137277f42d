"""What the engine hands back: a finished request, one step's per-request output, step and resize timings, stats."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fluidpd.engine.sampling_params import TokenLogprob

if TYPE_CHECKING:
    from fluidpd.engine.sequence import Sequence


@dataclass
class RequestOutput:
    """A finished request: its prompt, its output tokens and text, and why it stopped."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str | None
    finish_reason: str | None
    logprobs: list[TokenLogprob] | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at its first admission
    prompt_logprobs: list[TokenLogprob | None] | None = None  # one per prompt token (None first), when asked
    index: int = 0  # its choice in an n > 1 request
    samples: list[RequestOutput] | None = None  # n > 1: every choice by index (this one's fields: choice 0's)

    @property
    def outputs(self) -> list[RequestOutput]:
        """Its sampled sequences by index (vLLM's RequestOutput.outputs): itself when n == 1."""
        return self.samples if self.samples is not None else [self]

    @classmethod
    def of(cls, seq: Sequence, text: str | None) -> RequestOutput:
        return cls(
            seq.request_id,
            seq.token_ids[: seq.prompt_len],
            list(seq.output_token_ids),
            text,
            seq.finish_reason,
            seq.logprobs,
            seq.num_preemptions,
            seq.num_cached_tokens,
            seq.prompt_logprobs,
            max(seq.index, 0),
        )


@dataclass
class StepOutput:
    """What one step did to one request's sequence: 0 or 1 new token, and whether it finished (an n > 1
    request gives one per choice that got a token; `group_finished` when its last choice ends)."""

    request_id: str
    new_token_ids: list[int]
    num_computed: int
    finished: bool = False
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] | None = None
    output: RequestOutput | None = None  # the whole output, once finished
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache, in the step that admitted it
    num_loaded_tokens: int = 0  # of those, loaded from the KV store
    prompt_logprobs: list[TokenLogprob | None] | None = None  # the prompt tokens this step scored (prompt_logprobs)
    index: int = 0  # the choice (sequence) of an n > 1 request this output is of
    group_finished: bool = False  # the request (every choice) has left the engine


TRAFFIC = (  # KVTierActivity's counters of the store's traffic
    "loaded_blocks",
    "loaded_bytes",
    "load_s",
    "offloaded_blocks",
    "offloaded_bytes",
    "offload_s",
    "checksum_failures",
    "evicted_blocks",
)


@dataclass
class KVTierActivity:
    """What happened to an engine's KV tiers since its last report: the store's traffic (this
    engine's share), its occupancy, and block residency samples by tier ("device", "store")."""

    loaded_blocks: int = 0
    loaded_bytes: int = 0
    load_s: float = 0.0
    offloaded_blocks: int = 0
    offloaded_bytes: int = 0
    offload_s: float = 0.0
    checksum_failures: int = 0
    evicted_blocks: int = 0
    store_used_blocks: int = 0
    store_capacity_blocks: int = 0
    reuse_gaps_s: dict[str, list[float]] = field(default_factory=dict)  # seconds a cached block sat before a hit
    idle_before_evict_s: dict[str, list[float]] = field(default_factory=dict)  # ... before it was evicted


@dataclass
class StepResult:
    """The outputs of one `run_step` and where its time went."""

    outputs: list[StepOutput]
    step_s: float  # wall time of the whole step (planning excluded)
    forward_s: float  # batch building + forward + logits to host
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    cpu_s: float = 0.0  # CPU time of the calling thread over the step (cpu_s / step_s: the share of a core it got)
    kv_tiers: KVTierActivity | None = None  # with prefix caching: what the step did to the KV tiers


@dataclass
class ResizeResult:
    """One `resize_kv`: the pool before and after, the live blocks it moved, its time."""

    old_blocks: int
    new_blocks: int
    moved_blocks: int
    seconds: float


@dataclass
class EngineStats:
    """The engine's KV pool, queues and memory split at one moment."""

    num_kv_blocks: int
    num_free_blocks: int
    num_used_blocks: int
    max_kv_blocks: int
    num_waiting: int
    num_running: int
    block_size: int
    block_bytes: int
    arena_bytes: int
    kv_bytes: int
    scratch_bytes: int
    weight_bytes: int = 0
    prefix_cache_queries: int = 0  # tokens: prompts of requests at their first admission (cumulative)
    prefix_cache_hits: int = 0  # tokens: of those, served from the cache
    num_cached_blocks: int = 0  # blocks indexed by hash, live or evictable
    num_evictable_blocks: int = 0  # free blocks that still hold a cached prefix (counted in num_free_blocks)
    prefix_cache_store_hits: int = 0  # tokens: of the hits, loaded from the KV store
    kv_store_blocks: int = 0  # blocks the node's KV store holds now (0: no store)
    kv_store_capacity_blocks: int = 0
