"""A served session replay as a simulator trace: every turn's prompt rebuilt token for token as the server
built it (the chat template over the messages sent), its answer's token ids, both named by the engine's
chained block hashes, so the simulator's prefix cache sees exactly the blocks the server's could share.

Per turn (trace order = send order): arrival its send time (from the first send), prompt_len the rebuilt
prompt's ids, output_len the answer's ids, hash_ids the block hashes of prompt + answer (a session trace
names its context's full blocks), session as sent, think time the client's pause after the previous
turn's answer (its send time less that answer's finish).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from fluidpd.bench.loadgen.closed_loop import TurnResult
from fluidpd.core.blockhash import block_hashes
from fluidpd.workload.trace import Trace

EncodeChat = Callable[[list[dict[str, str]]], list[int]]


@dataclass
class ReplayTrace:
    """The trace, its turns in trace order, and what rebuilding the prompts found."""

    trace: Trace
    turns: list[TurnResult]
    prompt_ids: list[list[int]]
    # (session, turn, rebuilt prompt tokens, the server's usage.prompt_tokens) where they differ
    mismatches: list[tuple[int, int, int, int]] = field(default_factory=list)
    # per turn: leading prompt tokens equal to its session's previous prompt + answer (0: opening turns)
    history_match: list[int] = field(default_factory=list)
    skipped: int = 0  # turns left out: failed, or sent without messages or answer ids


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two id lists."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def replay_trace(
    results: list[TurnResult], encode_chat: EncodeChat, block: int = 16, name: str = "replay"
) -> ReplayTrace:
    """The session trace of `results` (turns that completed, with the messages sent and the answer's ids)."""
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    kept = [t for t in results if t.result.ok and t.messages is not None and t.result.output_ids]
    kept.sort(key=lambda t: (t.result.send_s, t.session, t.turn))
    if not kept:
        raise ValueError("no completed turn carries its messages and answer ids")
    t0 = kept[0].result.send_s
    out = ReplayTrace(
        Trace(name, np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64)),
        kept,
        [],
        skipped=len(results) - len(kept),
    )
    last: dict[int, tuple[list[int], float]] = {}  # session -> (previous context ids, its answer's finish)
    arrival, prompt_len, output_len, hashes, think = [], [], [], [], []
    for t in kept:
        r = t.result
        assert t.messages is not None
        ids = list(encode_chat(t.messages))
        if r.usage_prompt_tokens is not None and r.usage_prompt_tokens != len(ids):
            out.mismatches.append((t.session, t.turn, len(ids), r.usage_prompt_tokens))
        context = ids + list(r.output_ids)
        prev = last.get(t.session)
        out.history_match.append(common_prefix(prev[0], ids) if prev else 0)
        think.append(max(r.send_s - prev[1], 0.0) if prev else 0.0)
        last[t.session] = (context, r.finish_s)
        arrival.append(r.send_s - t0)
        prompt_len.append(len(ids))
        output_len.append(len(r.output_ids))
        hashes.append(np.array(block_hashes(context, block), dtype=np.int64))
        out.prompt_ids.append(ids)
    out.trace = Trace(
        name,
        np.array(arrival),
        np.array(prompt_len),
        np.array(output_len),
        hashes,
        block,
        None,
        np.array([t.session for t in kept]),
        np.array(think),
    )
    return out
