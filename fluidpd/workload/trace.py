"""The Trace: a workload as three aligned arrays (arrival time, prompt length, output length)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np


@dataclass(slots=True, eq=False)
class Trace:
    """A workload: per-request arrival time (s, sorted, non-decreasing), prompt and output lengths in tokens."""

    name: str
    arrival_s: np.ndarray  # float64, >= 0, non-decreasing
    prompt_len: np.ndarray  # int64, >= 1
    output_len: np.ndarray  # int64, >= 1 (the first token is produced by prefill)
    # per request: prefix-block hash ids, equal ids meaning equal prefixes; with sessions, the full blocks of
    # its context (prompt, then answer); else of its prompt (the last may name a partial block)
    hash_ids: list | None = None
    hash_block_size: int | None = None  # tokens per hash block (Mooncake 512, Claude Code 64)
    span_s: float | None = None  # nominal end time (e.g. a window's length); None: the last arrival
    # closed-loop sessions: a request with session >= 0 is its session's next turn, sent its think
    # time after the session's previous request completes (its arrival_s is the open-loop time)
    session: np.ndarray | None = None  # int64 session id per request (-1: not in a session)
    think_time_s: np.ndarray | None = None  # float64 pause after the previous turn's answer
    n: np.ndarray | None = None  # int64 sequences sampled per request (one prefill, n decodes); None: 1 each
    constrained: np.ndarray | None = None  # bool per request: a grammar masks its output (structured outputs)

    def __post_init__(self) -> None:
        self.arrival_s = np.asarray(self.arrival_s, dtype=np.float64)
        self.prompt_len = _as_lengths(self.prompt_len, "prompt_len")
        self.output_len = _as_lengths(self.output_len, "output_len")
        n = self.arrival_s.shape
        if self.arrival_s.ndim != 1 or self.prompt_len.shape != n or self.output_len.shape != n:
            raise ValueError(
                f"trace {self.name!r}: arrival_s, prompt_len and output_len must be 1-D of equal length, "
                f"got {self.arrival_s.shape}, {self.prompt_len.shape}, {self.output_len.shape}"
            )
        if n[0]:
            if not np.isfinite(self.arrival_s).all() or self.arrival_s[0] < 0:
                raise ValueError(f"trace {self.name!r}: arrival times must be finite and >= 0")
            if (np.diff(self.arrival_s) < 0).any():
                raise ValueError(f"trace {self.name!r}: arrival times must be sorted (non-decreasing)")
            if self.prompt_len.min() < 1 or self.output_len.min() < 1:
                raise ValueError(f"trace {self.name!r}: prompt and output lengths must be >= 1 token")
        if self.hash_ids is not None and len(self.hash_ids) != n[0]:
            raise ValueError(f"trace {self.name!r}: {len(self.hash_ids)} hash_ids lists for {n[0]} requests")
        self._check_sessions(n[0])
        if self.n is not None:
            self.n = np.asarray(self.n, dtype=np.int64)
            if self.n.shape != n or (n[0] and self.n.min() < 1):
                raise ValueError(f"trace {self.name!r}: n must hold one count >= 1 per request")
        if self.constrained is not None:
            self.constrained = np.asarray(self.constrained, dtype=bool)
            if self.constrained.shape != n:
                raise ValueError(f"trace {self.name!r}: constrained must hold one flag per request")
        if self.span_s is not None and (not np.isfinite(self.span_s) or (n[0] and self.span_s < self.arrival_s[-1])):
            raise ValueError(f"trace {self.name!r}: span_s={self.span_s} ends before the last arrival")

    def _check_sessions(self, n: int) -> None:
        if (self.session is None) != (self.think_time_s is None):
            raise ValueError(f"trace {self.name!r}: session and think_time_s come together")
        if self.session is None or self.think_time_s is None:
            return
        self.session = np.asarray(self.session, dtype=np.int64)
        self.think_time_s = np.asarray(self.think_time_s, dtype=np.float64)
        if self.session.shape != (n,) or self.think_time_s.shape != (n,):
            raise ValueError(f"trace {self.name!r}: session and think_time_s need one entry per request")
        if n and (not np.isfinite(self.think_time_s).all() or self.think_time_s.min() < 0):
            raise ValueError(f"trace {self.name!r}: think times must be finite and >= 0")

    @property
    def has_sessions(self) -> bool:
        return self.session is not None and bool((self.session >= 0).any())

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    @property
    def duration_s(self) -> float:
        if self.span_s is not None:
            return float(self.span_s)
        return float(self.arrival_s[-1]) if len(self) else 0.0

    @property
    def mean_rate(self) -> float:
        d = self.duration_s
        return len(self) / d if d > 0 else 0.0

    def scale_rate(self, x: float) -> Trace:
        """Compress time by `x` (x=2 doubles the request rate; sessions' think times shrink alike)."""
        if not x > 0 or not np.isfinite(x):
            raise ValueError(f"rate scale must be a positive finite number, got {x}")
        span = None if self.span_s is None else self.span_s / x
        t = self._replace(self.arrival_s / x, slice(None), span)
        if t.think_time_s is not None:  # a closed loop's pauses compress with its clock
            t.think_time_s = t.think_time_s / x
        return t

    def window(self, start_s: float, duration_s: float) -> Trace:
        """Requests arriving in [start_s, start_s + duration_s), re-based so start_s becomes 0."""
        if not duration_s > 0:
            raise ValueError(f"window duration must be > 0, got {duration_s}")
        lo, hi = np.searchsorted(self.arrival_s, [start_s, start_s + duration_s], side="left")
        return self._replace(self.arrival_s[lo:hi] - start_s, slice(lo, hi), float(duration_s))

    def shaped(
        self, rate_scale: float, duration_s: float | None = None, max_requests: int | None = None, start_s: float = 0.0
    ) -> Trace:
        """Rate-scale by `rate_scale`, keep [start_s, start_s + duration_s) (re-based to 0), then
        at most the first `max_requests`."""
        t = self.scale_rate(rate_scale)
        if duration_s:
            t = t.window(start_s, duration_s)
        elif start_s:
            raise ValueError("a window start needs a duration")
        return t.head(max_requests) if max_requests is not None and len(t) > max_requests else t

    def clipped(self, context: int) -> tuple[Trace, int]:
        """(the trace with every prompt + output cut to `context` tokens, how many requests that
        touched), as a client clips to a server's max_model_len: the output keeps at least one token
        and at most `context` - 1, the prompt its leading tokens (and so its block ids' prefix)."""
        output = np.minimum(np.maximum(self.output_len, 1), context - 1)
        prompt = np.maximum(np.minimum(self.prompt_len, context - output), 1)
        touched = int(((prompt != self.prompt_len) | (output != self.output_len)).sum())
        return replace(self, prompt_len=prompt, output_len=output), touched

    def head(self, n: int) -> Trace:
        """The first `n` requests."""
        if n < 0:
            raise ValueError(f"head needs n >= 0, got {n}")
        return self._replace(self.arrival_s[:n], slice(0, n), None)

    def shift(self, offset_s: float) -> Trace:
        """Delay every arrival by `offset_s` seconds."""
        span = None if self.span_s is None else self.span_s + offset_s
        return self._replace(self.arrival_s + offset_s, slice(None), span)

    def sampled(self, n: int = 1, constrained: float = 0.0, seed: int = 0) -> Trace:
        """The same requests, each sampling `n` sequences from its one prefill (a request group when > 1),
        a `constrained` share of them (drawn with `seed`) under a grammar (structured outputs)."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        t = replace(self, n=np.full(len(self), n, dtype=np.int64) if n > 1 else self.n)
        if constrained:
            t.constrained = draw_constrained(len(self), constrained, np.random.default_rng(seed))
        return t

    def _replace(self, arrival_s: np.ndarray, rows: slice, span_s: float | None) -> Trace:
        hashes = None if self.hash_ids is None else self.hash_ids[rows]
        session = None if self.session is None else self.session[rows]
        think = None if self.think_time_s is None else self.think_time_s[rows]
        if span_s is not None and len(arrival_s):
            span_s = max(span_s, float(arrival_s[-1]))  # guard against float rounding at the edge
        return Trace(
            self.name,
            arrival_s,
            self.prompt_len[rows],
            self.output_len[rows],
            hashes,
            self.hash_block_size,
            span_s,
            session,
            think,
            None if self.n is None else self.n[rows],
            None if self.constrained is None else self.constrained[rows],
        )


def draw_constrained(count: int, share: float, rng: np.random.Generator) -> np.ndarray:
    """`count` flags, each true with probability `share`: which requests a grammar constrains."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"the constrained share must be in [0, 1], got {share}")
    return rng.random(count) < share


def compose(phases: list[Trace], gap_s: float = 0.0, name: str | None = None) -> Trace:
    """Concatenate traces in time: each phase starts `gap_s` after the previous one's duration ends."""
    if not phases:
        raise ValueError("compose needs at least one phase")
    if gap_s < 0:
        raise ValueError(f"gap_s must be >= 0, got {gap_s}")
    offsets = np.concatenate([[0.0], np.cumsum([p.duration_s + gap_s for p in phases])])
    hash_lists = [p.hash_ids for p in phases if p.hash_ids is not None]
    keep_hashes = len(hash_lists) == len(phases) and len({p.hash_block_size for p in phases}) == 1
    hashes = [h for ids in hash_lists for h in ids] if keep_hashes else None
    arrival_s = np.concatenate([p.arrival_s + off for p, off in zip(phases, offsets)])
    span_s = float(offsets[-1] - gap_s)
    return Trace(
        name or "+".join(p.name for p in phases),
        arrival_s,
        np.concatenate([p.prompt_len for p in phases]),
        np.concatenate([p.output_len for p in phases]),
        hashes,
        phases[0].hash_block_size if keep_hashes else None,
        max(span_s, float(arrival_s[-1])) if len(arrival_s) else span_s,
    )


def _as_lengths(x, field: str) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype.kind == "f":
        if not (np.isfinite(a).all() and (a == np.round(a)).all()):
            raise ValueError(f"{field} must hold whole token counts")
    elif a.dtype.kind not in "iub" and a.size:
        raise ValueError(f"{field} must be integer token counts, got dtype {a.dtype}")
    return a.astype(np.int64, copy=False)
