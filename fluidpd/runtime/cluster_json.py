"""A worker and a role transition as `/v1/admin/cluster` shows them."""

from __future__ import annotations

import os

from fluidpd.core.memory import rss_bytes
from fluidpd.core.metrics import hit_rate


def worker_json(w, backend, transition=None) -> dict:
    """`w` (a WorkerState) run by `backend`; `transition`: the role switch under way on it, if any."""
    pid = backend.pid
    return {
        "id": w.id,
        "pid": pid,  # its process (in-process workers: this one's)
        "role": w.role.value,
        "routable": w.routable,
        "transition": transition_json(transition) if transition is not None and not transition.done else None,
        "queue": len(w.queue),
        "running": w.num_running,
        "waiting": w.num_waiting,
        "decoding": len(w.decoding),
        "held": len(w.held),
        "pulls": len(w.pulls),
        "kv_blocks_used": w.kv_blocks_used,
        "kv_blocks_total": w.kv_blocks_total,
        "step_time_ewma_s": w.step_time_ewma_s,
        "steps": w.steps,
        "tokens_out": w.tokens_out,
        "borrowed_chunks": w.borrowed_chunks,  # FluidToken: prefill chunks it ran as a decode worker
        "preemptions": w.preemptions,
        "prefix_cache": {
            "cached_blocks": w.cache.num_cached,
            "queries": w.prefix_cache_queries,
            "hits": w.prefix_cache_hits,
            "store_hits": w.host_hits,  # of the hits, tokens loaded from the node's KV store
            "hit_rate": hit_rate(w.prefix_cache_hits, w.prefix_cache_queries),
            "corrections": w.prefix_cache_corrections,  # admissions where the engine held less than this view
        },
        "rss_bytes": rss_bytes(pid) if pid is not None else 0,  # its process's (in-process: this one's)
        "own_process": pid is not None and pid != os.getpid(),
    }


def transition_json(t) -> dict:
    """A FluidRole transition (fluidpd.policy.fluidrole.RoleTransition)."""
    return {
        "worker": t.worker,
        "from": t.src_role.value,
        "to": t.dst_role.value,
        "reason": t.reason,
        "began_s": t.began_s,
        "phase": t.phase,
        "epoch": t.epoch,
        "done": t.done,
        "durations_s": t.durations(),
        "total_s": t.total_s if t.done else None,
    }
