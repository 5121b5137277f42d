"""Multi-turn chat sessions: each turn's prompt is the shared system prompt, the session's history (its
earlier inputs and answers) and a new input; the next turn is sent its think time after the answer.

Returned as a Trace with `session` and `think_time_s`, and block ids (`hash_ids`, `hash_block_size`
tokens each) covering each turn's whole context (prompt, then answer): a block inside the system prompt
is named by its group and position, every later block by its session and position, so equal ids at
equal positions mean equal KV, as in the Mooncake and Claude Code traces.
"""

from __future__ import annotations

import numpy as np

from fluidpd.workload.arrivals import Seed
from fluidpd.workload.trace import Trace

SYSTEM_TAG, SESSION_TAG = 1 << 40, 2 << 40


def chat_sessions(
    n_sessions: int = 8,
    turns: int = 6,
    system_tokens: int = 1000,
    new_tokens: int = 64,
    output_tokens: int = 64,
    think_time_s: float = 1.0,
    *,
    groups: int = 1,
    start_spread_s: float = 0.0,
    block: int = 16,
    seed: Seed = 0,
) -> Trace:
    """`n_sessions` sessions of `turns` turns over `groups` distinct system prompts (session i uses group
    i % groups); fixed input and answer lengths, think times exponential with mean `think_time_s`,
    session starts uniform over `start_spread_s`."""
    for name, v in (("n_sessions", n_sessions), ("turns", turns), ("groups", groups), ("block", block)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    if system_tokens < 0 or new_tokens < 1 or output_tokens < 1:
        raise ValueError("system_tokens must be >= 0, new_tokens and output_tokens >= 1")
    if think_time_s < 0 or start_spread_s < 0:
        raise ValueError("think_time_s and start_spread_s must be >= 0")
    rng = np.random.default_rng(seed)
    starts = np.sort(rng.uniform(0.0, start_spread_s, n_sessions)) if start_spread_s else np.zeros(n_sessions)
    think = rng.exponential(think_time_s, (n_sessions, turns)) if think_time_s else np.zeros((n_sessions, turns))
    think[:, 0] = 0.0
    rows: list[tuple[float, int, int, int, float, np.ndarray]] = []
    for s in range(n_sessions):
        t, history = float(starts[s]), system_tokens
        for k in range(turns):
            t += float(think[s, k])
            prompt = history + new_tokens
            ids = context_ids(system_tokens, s % groups, s, prompt + output_tokens, block)
            rows.append((t, prompt, output_tokens, s, float(think[s, k]), ids))
            history = prompt + output_tokens
    rows.sort(key=lambda r: r[0])
    return Trace(
        f"chat_sessions_{n_sessions}x{turns}",
        np.array([r[0] for r in rows]),
        np.array([r[1] for r in rows]),
        np.array([r[2] for r in rows]),
        [r[5] for r in rows],
        block,
        None,
        np.array([r[3] for r in rows]),
        np.array([r[4] for r in rows]),
    )


def context_ids(system_tokens: int, group: int, session: int, context_tokens: int, block: int) -> np.ndarray:
    """Ids of the full blocks of a session's first `context_tokens` tokens."""
    i = np.arange(context_tokens // block, dtype=np.int64)
    shared = (i + 1) * block <= system_tokens
    return np.where(shared, SYSTEM_TAG + (group << 24) + i, SESSION_TAG + (session << 24) + i)


def chain_sessions(trace: Trace, min_blocks: int = 2) -> Trace:
    """Sessions where a trace's ids show conversations: a request whose ids extend an earlier request's
    full prompt blocks (at least `min_blocks` of them, so a shared system prompt alone is no link)
    continues that request's session when it is its first such successor (a second one starts its own
    session); its think time is its arrival gap to that request, the trace's own service time included
    (an upper bound; the trace does not say how long the answer took). As in every session trace, ids
    name full blocks of a request's context: a partial last prompt block's id is dropped, and the
    earlier request's ids are extended by the successor's over its answer, so that the next turn can
    reuse its decoded KV.

    Needs ids that name prefixes (equal id at a position: equal tokens up to there), as Mooncake's do.
    Requests in no chain keep session -1 (open loop).
    """
    if trace.hash_ids is None or trace.hash_block_size is None:
        raise ValueError(f"trace {trace.name!r} has no block ids to chain")
    if min_blocks < 1:
        raise ValueError(f"min_blocks must be >= 1, got {min_blocks}")
    b = trace.hash_block_size
    prompt, output = trace.prompt_len.tolist(), trace.output_len.tolist()
    ids = [list(map(int, h))[: p // b] for h, p in zip(trace.hash_ids, prompt)]  # a session trace names full blocks
    session, think = _link(ids, prompt, output, trace.arrival_s, b, min_blocks)
    hashes = [np.array(h, np.int64) for h in ids]
    return Trace(
        trace.name,
        trace.arrival_s,
        trace.prompt_len,
        trace.output_len,
        hashes,
        b,
        trace.span_s,
        session,
        think,
    )


def _link(
    ids: list[list[int]], prompt: list[int], output: list[int], arrival_s: np.ndarray, b: int, min_blocks: int
) -> tuple[np.ndarray, np.ndarray]:
    """(session, think time) of each request as `chain_sessions` links them; a continued request's
    `ids` are extended over its answer by its successor's."""
    n = len(ids)
    ends: dict[tuple[int, int], int] = {}  # (full prompt blocks, last full id) -> latest such request
    session, think = np.full(n, -1, np.int64), np.zeros(n)
    continued: set[int] = set()
    sessions = 0
    for i in range(n):
        h = ids[i]
        parent = next((ends[(k, h[k - 1])] for k in range(len(h), min_blocks - 1, -1) if (k, h[k - 1]) in ends), -1)
        if parent >= 0 and parent not in continued:
            continued.add(parent)
            if session[parent] < 0:
                session[parent], sessions = sessions, sessions + 1
            session[i] = session[parent]
            think[i] = arrival_s[i] - arrival_s[parent]
            grown = h[: (prompt[parent] + output[parent]) // b]
            if len(grown) > len(ids[parent]):
                ids[parent] = grown
        full = prompt[i] // b
        if full >= min_blocks:
            ends[(full, h[full - 1])] = i
    return session, think
