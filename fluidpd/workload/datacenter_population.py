"""One user population of the datacenter generator: arrivals, lengths and sessions drawn from a trace.

Arrivals: BOOT_BLOCK-gap runs of the source's inter-arrival gaps (over their mean), drawn with
replacement and strung together, scaled so `n` arrivals fill the window, then warped by the daily cycle.

Sessions: the population's requests are dealt round-robin to `lanes` users, about think_s * rate of
them, so a user's consecutive requests are that many arrivals apart; each user's requests are cut into
sessions of geometric length (mean `turns`). A session's (prompt, output) pairs are sorted by prompt,
so later turns hold the longer contexts, and a turn stays in the session only if its prompt holds the
previous turn's prompt and answer and at least one new token; otherwise it opens a chain of its own.
A chain is a session's run of nested turns: each turn's context extends the previous one's. The
population keeps the source's lengths as a multiset; only which request gets which pair changes.
A turn's think time is its open-loop gap to the previous turn (service time included, an upper bound).
Each chain opens with one of the population's `prefixes` system prompts (Zipf(ZIPF_S) popularity), of
the source's prompt-length quantile at U(PREFIX_QUANTILES).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from fluidpd.workload.hot_prefix import zipf_shares
from fluidpd.workload.trace import Trace

if TYPE_CHECKING:
    from fluidpd.workload.datacenter_config import DatacenterConfig

BOOT_BLOCK = 256  # consecutive source gaps drawn together
ZIPF_S = 1.1  # popularity of a population's system prompts
PREFIX_QUANTILES = (0.05, 0.25)  # a system prompt's length: the source's prompt quantile at U(lo, hi)


@dataclass(slots=True, eq=False)
class Population:
    """One population's requests in arrival order, and its chains of nested turns."""

    arrival_s: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    think_s: np.ndarray
    session: np.ndarray  # per request: population-local session id, -1 for a one-turn chain
    chain: np.ndarray  # per request: population-local chain
    n_sessions: int
    chain_prefix: np.ndarray  # per chain: which system prompt it opens with
    chain_system_tokens: np.ndarray  # per chain: tokens of that prompt its contexts hold
    chain_tokens: np.ndarray  # per chain: its last turn's context (prompt + answer)


def population(source: Trace, n: int, cfg: DatacenterConfig, rng: np.random.Generator) -> Population:
    """`n` requests of one population (see the module doc)."""
    span = cfg.duration_s
    if n == 0:
        none, ints = np.empty(0), np.empty(0, np.int64)
        return Population(none, ints, ints, none, ints, ints, 0, ints, ints, ints)
    t = cfg.warp(_operational_times(source.arrival_s, n, span, rng))
    pick = rng.integers(0, len(source), n)
    prompt, output = source.prompt_len[pick], source.output_len[pick]
    lanes = max(1, round(cfg.think_s * n / span))
    rows = -(-n // lanes)
    grid = np.arange(rows * lanes).reshape(rows, lanes).T.ravel()
    perm = grid[grid < n]  # lane by lane, each lane's requests in arrival order
    new = (perm < lanes) | (rng.random(n) < 1.0 / cfg.turns)
    candidate = np.cumsum(new) - 1
    by_prompt = np.argsort((candidate << 32) | prompt[perm], kind="stable")
    c, o = prompt[perm][by_prompt], output[perm][by_prompt]
    start = new.copy()
    start[1:] |= c[1:] <= c[:-1] + o[:-1]
    chain = np.cumsum(start) - 1
    tl = t[perm]
    think = np.where(start, 0.0, tl - np.concatenate([[0.0], tl[:-1]]))
    first = np.flatnonzero(start)
    last = np.append(first[1:], n) - 1
    turns = np.diff(np.append(first, n))
    sid = np.cumsum(turns > 1) - 1
    session = np.where(turns > 1, sid, -1)[chain]
    lens = np.quantile(source.prompt_len, rng.uniform(*PREFIX_QUANTILES, cfg.prefixes)).astype(np.int64)
    prefix = rng.choice(cfg.prefixes, size=len(first), p=zipf_shares(cfg.prefixes, ZIPF_S))
    back = np.empty_like(perm)
    back[perm] = np.arange(n)  # request i (in arrival order) sits at back[i] in lane order
    return Population(
        t,
        c[back],
        o[back],
        think[back],
        session[back],
        chain[back],
        n_sessions=int(sid[-1] + 1),
        chain_prefix=prefix,
        chain_system_tokens=np.minimum(lens[prefix], c[first]),
        chain_tokens=c[last] + o[last],
    )


def _operational_times(source_t: np.ndarray, n: int, span: float, rng: np.random.Generator) -> np.ndarray:
    """`n` sorted times in [0, span) whose gaps are BOOT_BLOCK-runs of the source's gaps, scaled to fit."""
    gaps = np.diff(source_t)
    unit = gaps / gaps.mean()
    block = min(BOOT_BLOCK, len(unit))
    starts = rng.integers(0, len(unit) - block + 1, -(-(n + 1) // block))
    drawn = unit[(starts[:, None] + np.arange(block)).ravel()[: n + 1]]
    cum = np.cumsum(drawn)
    return cum[:n] * (span / cum[n]) if cum[n] > 0 else np.linspace(0.0, span, n, endpoint=False)
