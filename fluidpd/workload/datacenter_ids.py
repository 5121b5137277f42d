"""Block ids of the datacenter generator's requests, laid out once per chain of nested turns.

A request's ids name the full ID_BLOCK-token blocks of its context (prompt, then answer), as in every
session trace. A chain's contexts nest, so a block position names the same tokens in every one of its
turns: block k is named by (PREFIX_TAG, the population's system prompt, k) while the chain's first
prompt holds that whole block of the system prompt, else by (CHAIN_TAG, the chain, k). Populations
number their system prompts apart, so no two populations share a block. Each chain's ids are one run
of a flat array; a request's ids are a view of its chain's leading blocks (no copy per request).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from fluidpd.workload.datacenter_population import Population

ID_BLOCK = 64  # tokens per block id (as Claude Code's trace; blockmap splits them onto a world's blocks)
POS_BITS = 20  # block positions per context: up to 2^20 blocks (67M tokens)
PREFIX_TAG, CHAIN_TAG = 1 << 52, 2 << 52
VIEW_CHUNK = 1 << 20  # requests whose views are made at a time (bounds the temporary Python ints)


def request_ids(pops: list[Population], prefixes: int, order: np.ndarray, context: np.ndarray) -> list[np.ndarray]:
    """Per request in `order` (indices into the populations' concatenated requests), the ids of the full
    blocks of its `context` tokens (`context` already in that order)."""
    blocks = [p.chain_tokens // ID_BLOCK for p in pops]
    if any(len(b) and b.max() >= 1 << POS_BITS for b in blocks):
        raise ValueError(f"a context exceeds {1 << POS_BITS} blocks of {ID_BLOCK} tokens")
    sizes = [int(b.sum()) for b in blocks]
    flat = np.empty(sum(sizes), np.int64)
    first_block, at, chains = [], 0, 0
    for i, (p, b) in enumerate(zip(pops, blocks)):
        starts = np.cumsum(b) - b
        _chain_ids(p, b, starts, chains, i * prefixes, flat[at : at + sizes[i]])
        first_block.append(at + starts[p.chain])
        at, chains = at + sizes[i], chains + len(b)
    lo = np.concatenate(first_block)[order] if first_block else np.empty(0, np.int64)
    hi = lo + context // ID_BLOCK
    out: list[np.ndarray] = []
    for s in range(0, len(lo), VIEW_CHUNK):
        out.extend(flat[a:z] for a, z in zip(lo[s : s + VIEW_CHUNK].tolist(), hi[s : s + VIEW_CHUNK].tolist()))
    return out


def _chain_ids(
    p: Population, blocks: np.ndarray, starts: np.ndarray, chain0: int, prefix0: int, out: np.ndarray
) -> None:
    """Write the chains' ids into `out`: block k of chain c (at starts[c]) is its chain id + k, then the
    system-prompt blocks are overwritten. A running sum of ones with a jump at each chain's start (no
    temporaries as long as `out`)."""
    chain = np.arange(len(blocks), dtype=np.int64)
    held = blocks > 0
    base = (CHAIN_TAG + ((chain0 + chain) << POS_BITS))[held]
    out.fill(1)
    out[starts[held]] = base - np.concatenate([[0], base[:-1] + blocks[held][:-1] - 1])
    np.cumsum(out, out=out)
    system = np.minimum(p.chain_system_tokens // ID_BLOCK, blocks)
    owner = np.repeat(chain, system)
    k = np.arange(len(owner), dtype=np.int64) - np.repeat(np.cumsum(system) - system, system)
    out[starts[owner] + k] = PREFIX_TAG + ((prefix0 + p.chain_prefix[owner]) << POS_BITS) + k
