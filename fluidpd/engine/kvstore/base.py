"""A second KV tier behind the engine's arena: blocks named by their chained hash, copied out of the
arena when a sequence releases them and back in when a later request's prefix is there.

SGLang's `BaseKVManager` shape: one abstract store, one module per backend (`shm`: a node-shared
shared-memory store). Torch-free: blocks are raw bytes (numpy uint8 rows of `block_bytes`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(slots=True)
class StoreStats:
    """What one process did with the store (its own counters; `used_blocks` and `capacity_blocks` are the store's)."""

    capacity_blocks: int = 0
    used_blocks: int = 0
    block_bytes: int = 0
    offloaded_blocks: int = 0  # written by this process (a block already there is only refreshed)
    offloaded_bytes: int = 0
    offload_s: float = 0.0
    loaded_blocks: int = 0  # read back into an arena
    loaded_bytes: int = 0
    load_s: float = 0.0
    checksum_failures: int = 0  # blocks whose bytes failed their checksum on load: recomputed, never served
    evicted_blocks: int = 0  # blocks this process's writes displaced
    reuse_gaps_s: list[float] = field(default_factory=list)  # per loaded block: seconds since last written or used
    idle_before_evict_s: list[float] = field(default_factory=list)  # per evicted block: seconds it sat unused


class KVStore(ABC):
    """Blocks of `block_bytes` bytes by hash; bounded, least recently used evicted first."""

    block_bytes: int
    stats: StoreStats

    @abstractmethod
    def put(self, hashes: Sequence[int], fill: Callable[[int, np.ndarray], None]) -> int:
        """Store the blocks named `hashes`, the first least recent: `fill(i, out)` copies block i's
        bytes into `out` (uint8 [block_bytes]), called only for those not stored yet; the others are
        only refreshed. Returns how many were written."""

    @abstractmethod
    def get(self, hashes: Sequence[int], dest: Sequence[np.ndarray]) -> int:
        """Copy the leading run of `hashes` held and intact into `dest` (uint8 rows); how many.
        Those blocks become the most recent. A block that fails its check ends the run (counted)."""

    @abstractmethod
    def report(self) -> StoreStats:
        """A copy of `stats` and the occupancy now, with the residency samples since the last report
        (taken out of `stats`)."""

    @abstractmethod
    def __len__(self) -> int:
        """Blocks held now."""

    @abstractmethod
    def close(self) -> None:
        """Detach this process (the store lives on for the others)."""
