"""The Claude Code agentic-session trace (kv-cache-tester) on a synthesised global clock, open or closed loop."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path

import numpy as np

from fluidpd.workload.arrivals import Seed
from fluidpd.workload.files import field, read_csv, read_jsonl, trace_file
from fluidpd.workload.loaders import check_lengths, line_error, sorted_trace
from fluidpd.workload.trace import Trace

CLAUDE_CODE_FILE, CLAUDE_CODE_SESSIONS = "claude_code_requests.jsonl.gz", "claude_code_sessions.csv"
CLAUDE_BLOCK = 64  # tokens per Claude Code hash block
DEFAULT_CLAUDE_CONCURRENCY = 64.0  # mean number of concurrently active Claude Code sessions


def load_claude_code(
    path: str | Path | None = None,
    sessions_path: str | Path | None = None,
    *,
    concurrency: float = DEFAULT_CLAUDE_CONCURRENCY,
    uncached_only: bool = False,
    with_hashes: bool = False,
    sessions: bool = False,
    seed: Seed = 0,
) -> Trace:
    """Claude Code agentic sessions (kv-cache-tester, Callan Fox) on a synthesised global clock.

    Sessions start as a Poisson process of rate concurrency / mean session duration (in a seeded random
    order), so `concurrency` sessions are active on average; a request arrives at its session's start plus
    its `t_s`. uncached_only: prompt = input tokens not covered by the session's prefix cache
    (input - prefix_hit_blocks * block_size). with_hashes: keep per-request 64-token block ids as int64
    arrays, made unique across sessions (about 8 bytes per block: ~0.75 GB for the whole file).
    sessions: closed loop: each agent of a session (the main one, each sub-agent) is a chain of requests
    in `seq` order, the next sent its think time after the previous one's answer: its `t_s` gap less the
    previous `api_time_s` (the file's `think_time_s` agrees on 99.99% of the pairs with both; a few count
    from an earlier request, e.g. 3,558 s for a 22 s gap); where `api_time_s` is missing, `think_time_s`
    capped by the gap. A chain's first request keeps its clock time.
    With hashes, a request's ids are extended over its answer by its successor's, where that extends it.
    """
    if not (concurrency > 0 and np.isfinite(concurrency)):
        raise ValueError(f"concurrency must be > 0, got {concurrency}")
    p, sp = _claude_files(path, sessions_path)
    table = read_csv(sp, ("trace", "duration_s"))
    index = {s: i for i, s in enumerate(table.strings("trace"))}
    durations = table.numbers("duration_s")
    rows = _claude_rows(p, sp, index, uncached_only, with_hashes, sessions)
    prompt_len, output_len = check_lengths(
        np.array(rows.prompt, np.int64), np.array(rows.output, np.int64), line_error(p, rows.lines)
    )
    starts = _session_starts(durations, concurrency, seed, sp)
    t = starts[np.array(rows.session, np.int64)] + np.array(rows.t_s, np.float64)
    name = "claude_code_uncached" if uncached_only else "claude_code"
    chains = _claude_chains(rows, prompt_len, output_len, with_hashes) if sessions else None
    return sorted_trace(
        name,
        t - t.min() if len(t) else t,
        prompt_len,
        output_len,
        rows.hashes if with_hashes else None,
        CLAUDE_BLOCK if with_hashes else None,
        chains,
    )


def _claude_files(path: str | Path | None, sessions_path: str | Path | None) -> tuple[Path, Path]:
    """(requests file, sessions file): the sessions file beside a given requests file unless given itself."""
    p = trace_file(path, CLAUDE_CODE_FILE)
    sp = trace_file(
        sessions_path if sessions_path is not None or path is None else Path(path).parent / CLAUDE_CODE_SESSIONS,
        CLAUDE_CODE_SESSIONS,
    )
    return p, sp


@dataclass
class _ClaudeRows:
    """The columns of the Claude Code requests file, one entry per request in file order."""

    session: list[int] = dc_field(default_factory=list)  # index into the sessions file
    t_s: list[float] = dc_field(default_factory=list)
    prompt: list[int] = dc_field(default_factory=list)
    output: list[int] = dc_field(default_factory=list)
    hashes: list[np.ndarray] = dc_field(default_factory=list)
    lines: list[int] = dc_field(default_factory=list)
    agent: list[str] = dc_field(default_factory=list)
    think_s: list[float | None] = dc_field(default_factory=list)
    api_s: list[float | None] = dc_field(default_factory=list)


def _claude_rows(
    p: Path, sp: Path, index: dict[str, int], uncached_only: bool, with_hashes: bool, sessions: bool
) -> _ClaudeRows:
    rows = _ClaudeRows()
    for line, obj in read_jsonl(p):
        sid = field(obj, "trace", str, p, line)
        if sid not in index:
            raise ValueError(f"{p}: line {line}: session {sid!r} is not in {sp}")
        rows.session.append(index[sid])
        rows.t_s.append(field(obj, "t_s", float, p, line))
        n_in = field(obj, "input_tokens", int, p, line)
        if uncached_only:
            n_in -= field(obj, "prefix_hit_blocks", int, p, line) * field(obj, "block_size", int, p, line)
        rows.prompt.append(max(n_in, 1) if uncached_only else n_in)
        rows.output.append(field(obj, "output_tokens", int, p, line))
        if with_hashes:
            try:
                rows.hashes.append(_expand_runs(field(obj, "hash_runs", list, p, line), index[sid]))
            except (TypeError, ValueError) as e:
                raise ValueError(f"{p}: line {line}: bad hash_runs ({e})") from None
        if sessions:
            rows.agent.append(str(obj.get("agent", "main")))
            rows.think_s.append(_optional_seconds(obj, "think_time_s", p, line))
            rows.api_s.append(_optional_seconds(obj, "api_time_s", p, line))
        rows.lines.append(line)
    return rows


def _optional_seconds(obj: dict, key: str, p: Path, line: int) -> float | None:
    v = obj.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (np.isfinite(v) and v >= 0):
        raise ValueError(f"{p}: line {line}: {key} must be a number of seconds >= 0, got {v!r}")
    return float(v)


def _claude_chains(
    rows: _ClaudeRows, prompt: np.ndarray, output: np.ndarray, extend: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(session id, think time) per row: one session per (session file row, agent), in file order (each
    session's rows are sorted by time, so an agent's are in `seq` order); `extend`: a row's ids grow
    over its answer from its successor's ids where those extend them."""
    session, think = np.empty(len(rows.lines), np.int64), np.zeros(len(rows.lines))
    chains: dict[tuple[int, str], int] = {}
    last: dict[int, int] = {}  # chain -> its latest row
    for i, key in enumerate(zip(rows.session, rows.agent)):
        c = chains.setdefault(key, len(chains))
        session[i] = c
        j = last.get(c)
        last[c] = i
        if j is None:
            continue
        gap, api, noted = rows.t_s[i] - rows.t_s[j], rows.api_s[j], rows.think_s[i]
        if api is not None:
            think[i] = max(gap - api, 0.0)
        else:
            think[i] = gap if noted is None else min(noted, gap)
        prev, cur = rows.hashes[j], rows.hashes[i]
        answer = int(prompt[j] + output[j]) // CLAUDE_BLOCK
        if extend and answer > len(prev) and np.array_equal(cur[: len(prev)], prev):
            rows.hashes[j] = cur[:answer]
    return session, think


def _session_starts(durations: np.ndarray, concurrency: float, seed: Seed, sp: Path) -> np.ndarray:
    """Session start times: a Poisson process of rate concurrency / mean duration, in a seeded random order."""
    if len(durations) and not (durations > 0).any():
        raise ValueError(f"{sp}: no session has a positive duration_s")
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(durations.mean() / concurrency, len(durations)) if len(durations) else np.empty(0)
    starts = np.empty(len(durations))
    starts[rng.permutation(len(durations))] = np.cumsum(gaps) - (gaps[0] if len(gaps) else 0.0)
    return starts


def _expand_runs(runs: list, session: int) -> np.ndarray:
    ids = [np.arange(s, s + k, dtype=np.int64) for s, k in runs]
    return (np.concatenate(ids) if ids else np.empty(0, np.int64)) + (session << 32)
