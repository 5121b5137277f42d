"""Block hashes for prefix caching: a full block is named by a hash chained from its parent's.

vLLM's scheme: hash(block i) = H(hash(block i-1), token ids of block i), so equal hashes mean equal
prefixes, not only equal blocks. H is BLAKE2b (64-bit digest): deterministic across processes (the
engine and the coordinator's World must agree) and, unlike Python's `hash`, not forgeable by a client
who wants another tenant's prefix to collide with theirs. Torch-free: the World and the policy use it.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from hashlib import blake2b

ROOT = 0  # the parent of a sequence's first block


def chain(parent: int, tokens: Sequence[int]) -> int:
    """The hash of a block holding `tokens` whose previous block's hash is `parent`."""
    data = array("q", [parent])
    data.extend(tokens)
    return int.from_bytes(blake2b(data.tobytes(), digest_size=8).digest(), "little", signed=True)


def block_hashes(token_ids: Sequence[int], block_size: int, start: int = 0, parent: int = ROOT) -> list[int]:
    """Chained hashes of the full blocks of `token_ids` from block `start` on (`parent`: block start-1's)."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    out = []
    for i in range(start, len(token_ids) // block_size):
        parent = chain(parent, token_ids[i * block_size : (i + 1) * block_size])
        out.append(parent)
    return out
