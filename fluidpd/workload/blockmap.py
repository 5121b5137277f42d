"""A trace's block ids on a world's KV block size, and the hit rate an infinite cache would reach.

A trace names the blocks of a request's context with ids of `trace_block` tokens (Mooncake 512,
Claude Code 64) in which equal ids mean equal prefixes. A world block k (tokens [k*b, (k+1)*b)) is
named by the trace block holding its last token and its offset from that block's first world block:
equal names mean the trace blocks up to there are equal, so its tokens are. When b divides the trace
block (16 into 512: 32 sub-blocks) that is the exact split; when it does not (e.g. 24 into 64), a world
block that straddles two trace blocks is named by the second, which is exact too, only conservative
(two requests that differ in the second trace block's later tokens share less than they could).

Which tokens the ids name (`named_tokens`): in a trace with sessions, full blocks of each request's
context, prompt then answer (`chat_sessions`, `chain_sessions`, Claude Code's sessions); else its
prompt only (Mooncake's raw ids, whose last id may name a partial prompt block). Only world blocks
wholly inside the named tokens get ids.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from fluidpd.workload.trace import Trace


def named_tokens(trace: Trace, i: int) -> int:
    """How many leading tokens of request `i`'s context its ids may name."""
    prompt = int(trace.prompt_len[i])
    return prompt + int(trace.output_len[i]) if trace.session is not None else prompt


def world_block_ids(ids, trace_block: int, block: int, tokens: int) -> np.ndarray:
    """Ids of the full `block`-token blocks among the first `tokens` tokens the trace ids name."""
    if trace_block < 1 or block < 1:
        raise ValueError(f"block sizes must be >= 1, got {trace_block} and {block}")
    ids = np.asarray(ids, dtype=np.int64)
    n = min(len(ids) * trace_block, tokens) // block
    k = np.arange(n, dtype=np.int64)
    idx = ((k + 1) * block - 1) // trace_block
    if trace_block % block == 0:
        per = trace_block // block
        return ids[idx] * per + k % per
    per = trace_block // block + 2  # offsets run 0 .. trace_block // block + 1
    return ids[idx] * per + (k - idx * trace_block // block)


def trace_block_ids(trace: Trace, block: int) -> Iterator[list[int]]:
    """Each request's world block ids (`world_block_ids`), in trace order; empty lists without ids."""
    if trace.hash_ids is None or trace.hash_block_size is None:
        yield from ([] for _ in range(len(trace)))
        return
    for i, ids in enumerate(trace.hash_ids):
        yield world_block_ids(ids, trace.hash_block_size, block, named_tokens(trace, i)).tolist()


def oracle_hit_tokens(trace: Trace, block: int, order: list[int] | None = None) -> np.ndarray:
    """Per request: the prompt tokens an infinite cache shared by all workers would skip, the requests
    arriving in `order` (trace indices; default trace order; a request not in it gets 0): a request's
    leading block is reusable if an earlier one held that id, and so on while every block before it
    is; at most all but its last prompt token, as the cache."""
    ids = list(trace_block_ids(trace, block))
    prompts = trace.prompt_len.tolist()
    out = np.zeros(len(ids), dtype=np.int64)
    seen: set[int] = set()
    for i in range(len(ids)) if order is None else order:
        limit, n = (prompts[i] - 1) // block, 0
        for h in ids[i]:
            if n >= limit or h not in seen:
                break
            n += 1
        out[i] = n * block
        seen.update(ids[i])
    return out


def oracle_hits(
    trace: Trace, block: int, order: list[int] | None = None, counted: set[int] | None = None
) -> tuple[int, int]:
    """(prompt tokens an infinite cache would skip, prompt tokens) over the requests in `order` (trace
    indices in the order they arrived; default every request in trace order), counting those in
    `counted` (default all; e.g. the ones a run admitted): `oracle_hit_tokens`, summed."""
    hits = oracle_hit_tokens(trace, block, order)
    rows = np.arange(len(trace)) if order is None else np.asarray(order, dtype=np.int64)
    if counted is not None:
        rows = rows[np.isin(rows, np.fromiter(counted, dtype=np.int64, count=len(counted)))]
    return int(hits[rows].sum()), int(trace.prompt_len[rows].sum())
