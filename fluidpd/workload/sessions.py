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
