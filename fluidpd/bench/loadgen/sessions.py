"""A session trace as turns to send: opening prompts that follow the trace's block ids, later turns'
new input, every length scaled so the longest turn fits the served model's context.

A session's first turn is its system message (the blocks it shares with another session's first turn,
block for block from the start: a shared system prompt) and a user message (its other blocks, then
text for the tokens past its last full block). Block id -> text is fixed, so equal ids give identical
text and a shared prefix tokenises the same. A later turn adds one user message of the trace's new
input (its prompt beyond the previous turn's prompt and answer); the history and the model's actual
answers are added when it is sent (closed_loop).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from fluidpd.bench.loadgen.words import WordSource
from fluidpd.workload.trace import Trace

CONTEXT_FILL = 0.85  # of max_model_len: room for the word-count estimate
MESSAGE_TOKENS = 8  # chat-template tokens around each message (role markers), an upper estimate


@dataclass(slots=True)
class Turn:
    """One turn to send: its request in the trace, its session and position, when, what it adds."""

    index: int  # the request's index in the trace
    session: int
    turn: int  # 0: the session's opening turn
    start_s: float  # the session's start (offset from the run's start); used by the opening turn
    think_s: float  # pause after the previous answer completes (later turns)
    messages: list[dict[str, str]]  # opening turn: system and user messages; later: the new user message
    max_tokens: int
    prompt_tokens: int  # the trace's prompt length, scaled


@dataclass
class SessionPlan:
    """The sessions of a replay at one context scale; turns that would not fit the context are dropped."""

    sessions: list[list[Turn]]
    scale: float
    dropped_turns: int = 0
    shared_blocks: int = 0  # blocks of the longest opening prefix shared between sessions
    notes: list[str] = field(default_factory=list)

    @property
    def n_turns(self) -> int:
        return sum(len(s) for s in self.sessions)


def session_rows(trace: Trace, n_sessions: int | None = None) -> list[list[int]]:
    """Request indices of each session, in order; sessions sorted by start, the first `n_sessions`.
    Requests outside a session (id -1) are one-turn sessions."""
    ids = trace.session if trace.session is not None else np.full(len(trace), -1)
    groups: dict[int, list[int]] = {}
    for i, s in enumerate(ids.tolist()):
        groups.setdefault(s if s >= 0 else -1 - i, []).append(i)
    rows = sorted(groups.values(), key=lambda r: (float(trace.arrival_s[r[0]]), r[0]))
    return rows[:n_sessions] if n_sessions is not None else rows


def plan_sessions(
    trace: Trace,
    words: WordSource,
    max_model_len: int | None,
    *,
    n_sessions: int | None = None,
    context_scale: float | None = None,
    seed: int = 0,
) -> SessionPlan:
    """The turns of the first `n_sessions` sessions; lengths x `context_scale` (None: the largest scale
    <= 1 at which every turn's prompt + answer, and MESSAGE_TOKENS per message, fit CONTEXT_FILL of
    max_model_len)."""
    if context_scale is not None and not (context_scale > 0 and math.isfinite(context_scale)):
        raise ValueError(f"context_scale must be > 0, got {context_scale}")
    rows = session_rows(trace, n_sessions)
    if not rows:
        raise ValueError("the trace holds no requests")
    budget = CONTEXT_FILL * max_model_len if max_model_len else math.inf
    scale = context_scale if context_scale is not None else _fitting_scale(trace, rows, budget)
    block = trace.hash_block_size or 0
    used = _opening_blocks(trace, rows) if block and trace.hash_ids is not None else Counter()
    plan = SessionPlan([], scale)
    for s, r in enumerate(rows):
        turns: list[Turn] = []
        for k, i in enumerate(r):
            prompt, out = int(trace.prompt_len[i]), int(trace.output_len[i])
            if (prompt + out) * scale + template_tokens(k) > budget:
                plan.dropped_turns += len(r) - k  # the session's context ends here
                break
            if k == 0:
                messages, n_sys = _opening(trace, i, s, used, scale, words, seed)
                plan.shared_blocks = max(plan.shared_blocks, n_sys)
            else:
                j = r[k - 1]
                new = prompt - int(trace.prompt_len[j] + trace.output_len[j])
                n = words.word_count(max(new, 1) * scale)
                messages = [{"role": "user", "content": words.chunk(("new", seed, s, k), n)}]
            think = float(trace.think_time_s[i]) if trace.think_time_s is not None and k else 0.0
            start = float(trace.arrival_s[r[0]])
            sized = max(round(out * scale), 1), max(round(prompt * scale), 1)
            turns.append(Turn(i, s, k, start, think, messages, *sized))
        if turns:
            plan.sessions.append(turns)
    if plan.dropped_turns:
        fill = f"{CONTEXT_FILL:.0%} of max_model_len {max_model_len}"
        plan.notes.append(f"{plan.dropped_turns} turns dropped: their prompt and answer pass {fill}")
    return plan


def _fitting_scale(trace: Trace, rows: list[list[int]], budget: float) -> float:
    """The largest scale <= 1 at which every turn's prompt + answer and template fit `budget` tokens."""
    room = [
        (budget - template_tokens(k)) / int(trace.prompt_len[i] + trace.output_len[i])
        for r in rows
        for k, i in enumerate(r)
        if budget > template_tokens(k)
    ]
    return min([1.0, *room])


def template_tokens(turn: int) -> int:
    """The chat template's estimated tokens in turn `turn`'s (0-based) prompt and answer: a system and
    a user message, two more per earlier turn, and the answer's."""
    return MESSAGE_TOKENS * (3 + 2 * turn)


def _opening_blocks(trace: Trace, rows: list[list[int]]) -> Counter:
    """How many sessions open with each (position, block id)."""
    assert trace.hash_ids is not None
    return Counter((j, b) for r in rows for j, b in enumerate(np.asarray(trace.hash_ids[r[0]]).tolist()))


def _opening(
    trace: Trace, i: int, session: int, used: Counter, scale: float, words: WordSource, seed: int
) -> tuple[list[dict[str, str]], int]:
    """System message: the blocks shared with another session from the start; user message: the rest
    of the prompt. Also how many blocks the system message holds."""
    block = trace.hash_block_size or 0
    prompt = int(trace.prompt_len[i])
    ids = np.asarray(trace.hash_ids[i]).tolist() if trace.hash_ids is not None and block else []
    full = min(len(ids), prompt // block) if block else 0
    counts = _block_words(full, block, scale, words.tokens_per_word)
    texts = [words.chunk(("block", seed, ids[j]), counts[j]) for j in range(full)]
    n_sys = 0
    while n_sys < full and used[(n_sys, ids[n_sys])] > 1:
        n_sys += 1
    tail = words.word_count((prompt - full * block) * scale)
    rest = [*texts[n_sys:], words.chunk(("tail", seed, session), tail)]
    system = " ".join(t for t in texts[:n_sys] if t)
    user = " ".join(t for t in rest if t) or words.chunk(("tail", seed, session), 1)
    messages = [{"role": "system", "content": system}] if system else []
    return [*messages, {"role": "user", "content": user}], n_sys


def _block_words(n_blocks: int, block: int, scale: float, tokens_per_word: float) -> list[int]:
    """Words of each block at `scale`: block j covers words [round(j x w), round((j + 1) x w)) of the
    prompt, w = block x scale / tokens_per_word, so a block's word count depends only on its position."""
    w = block * scale / tokens_per_word
    edges = np.round(np.arange(n_blocks + 1) * w).astype(np.int64)
    return np.diff(edges).tolist()
