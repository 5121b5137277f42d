"""What the control plane sees of the cluster, and what it may ask for.

The simulator and the real runtime both implement `WorkerView` and `ClusterView`; the
policy package reads them and never touches a world's internals.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from fluidpd.core.piece import PrefillPiece
from fluidpd.core.request import Request


class Role(str, Enum):  # noqa: UP042 - StrEnum would change str() and f-strings of a member
    """A worker's role: a prefill or decode instance, or a colocated replica doing both."""

    PREFILL = "prefill"
    DECODE = "decode"
    COLOCATED = "colocated"


class WorkerView(Protocol):
    """Read-only state of one worker (one engine instance, one or more GPUs)."""

    id: int
    role: Role
    node: int
    routable: bool  # False while FluidRole drains it
    block_size: int
    kv_blocks_total: int
    kv_blocks_used: int
    pull_blocks_pending: int  # blocks promised to KV pulls queued on this worker
    queued_tokens: int  # prefill tokens still to compute for `queue`
    queued_cached: int  # of those, the cached prefixes of unstarted requests expected to be skipped
    decode_ctx_sum: int
    num_prefilling: int  # admitted requests (KV allocated) whose prefill is unfinished
    step_time_ewma_s: float  # measured time of recent decode-only steps (T_iter)
    transfers_out: int  # KV transfers leaving this worker, in flight
    transfers_in: int  # KV transfers arriving at this worker, in flight
    role_since: float  # when the worker took its current role

    @property
    def queue(self) -> Sequence[Request | PrefillPiece]: ...  # waiting and partly prefilled requests, FIFO

    @property
    def decoding(self) -> Mapping[int, Request]: ...  # requests decoding here, by id

    @property
    def num_decoding(self) -> int: ...

    @property
    def num_held(self) -> int: ...  # prefilled requests whose KV waits here to be pulled

    @property
    def free_blocks(self) -> int: ...

    @property
    def queued_uncached(self) -> int: ...  # queued_tokens - queued_cached

    @property
    def num_cached_blocks(self) -> int: ...  # KV blocks held by hash, live or evictable

    @property
    def evictable_blocks(self) -> int: ...  # cached blocks no request holds (counted as free)

    def sync_decoding(self) -> None: ...  # bring the decoding requests' token counts up to date first

    # leading tokens of req whose KV is cached here (blocks: cached_blocks(req), when the caller matched it)
    def cached_tokens(self, req: Request, blocks: tuple[int, int] | None = None) -> int: ...

    def cached_blocks(self, req: Request) -> tuple[int, int]: ...  # (device, host tier) blocks of them


class ClusterView(Protocol):
    """Read-only state of the cluster at `now` (virtual or wall clock, seconds)."""

    @property
    def now(self) -> float: ...

    @property
    def workers(self) -> Sequence[WorkerView]: ...


@dataclass(slots=True)
class StepPlan:
    """The content of one engine iteration: prefill chunks and whether decodes run."""

    chunks: list[tuple[Request | PrefillPiece, int]] = field(default_factory=list)
    decode: bool = False

    @property
    def prefill_tokens(self) -> int:
        return sum(c for _, c in self.chunks)

    @property
    def kind(self) -> str:
        """prefill, decode or mixed (prefill chunks fused into a decode step)."""
        return "mixed" if self.chunks and self.decode else ("decode" if self.decode else "prefill")

    def __bool__(self) -> bool:
        return bool(self.chunks) or self.decode


def blocks_for(tokens: int, block_size: int) -> int:
    """KV blocks holding `tokens` tokens."""
    return -(-tokens // block_size)


def group_blocks(prompt_len: int, live: int, stored: int, block_size: int) -> int:
    """KV blocks of a request group whose `live` sequences hold `stored` tokens each: the prompt's full
    blocks once, the rest per sequence."""
    full = prompt_len // block_size
    return full + live * (blocks_for(stored, block_size) - full)
