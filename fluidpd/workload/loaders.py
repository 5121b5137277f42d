"""Loaders for the shipped trace files (see data/traces/README.md; Claude Code's is in `claude_code`),
each returning a Trace starting at t=0, and the row checks and ordering they share."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from fluidpd.workload.arrivals import Seed
from fluidpd.workload.files import field, read_csv, read_jsonl, trace_file
from fluidpd.workload.sampling import sample_requests
from fluidpd.workload.sessions import chain_sessions
from fluidpd.workload.trace import Trace

AZURE_FILES = {"code": "azure_code_2023.csv", "conv": "azure_conv_2023.csv"}
MOONCAKE_FILES = {"conversation": "mooncake_conversation.jsonl", "synthetic": "mooncake_synthetic.jsonl"}
MOONCAKE_NAMES = {"conversation": "mooncake_conv", "synthetic": "mooncake_synth"}
LENGTH_FILES = {
    "sharegpt": "vidur_sharegpt_8k_lengths.csv",
    "arxiv_sum": "vidur_arxiv_summarization_lengths.csv",
    "bwb": "vidur_bwb_lengths.csv",
}
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
LENGTH_COLUMNS = ("num_prefill_tokens", "num_decode_tokens")
SIMPLE_COLUMNS = ("arrival_s", "prompt_len", "output_len")
MOONCAKE_BLOCK = 512  # tokens per Mooncake hash block
DEFAULT_LENGTH_RATE = 2.0  # req/s for length-only traces when no rate is given

ErrorAt = Callable[[int, str], ValueError]


def load_azure(path: str | Path | None = None, *, kind: str = "conv") -> Trace:
    """Azure LLM inference trace 2023 (Splitwise, ISCA'24): TIMESTAMP, ContextTokens, GeneratedTokens."""
    p = trace_file(path, _pick(AZURE_FILES, kind, "Azure"))
    cols = read_csv(p, AZURE_COLUMNS)
    ts = cols.datetimes("TIMESTAMP")
    prompt, output = check_lengths(cols.counts("ContextTokens"), cols.counts("GeneratedTokens"), cols.error)
    t = (ts - ts.min()).astype(np.int64) / 1e9 if len(ts) else np.empty(0)
    name = f"azure_{kind}" if path is None else p.stem
    return sorted_trace(name, t, prompt, output)


def load_mooncake(
    path: str | Path | None = None,
    *,
    kind: str = "conversation",
    spread_quantized: bool = False,
    sessions: bool = False,
    seed: Seed = 0,
) -> Trace:
    """Mooncake FAST'25 JSON lines: timestamp (ms), input_length, output_length, hash_ids (512-token blocks).

    spread_quantized: the conversation trace's timestamps come in ~3 s steps; spread the requests of each
    step uniformly (seeded) over the step, keeping their order.
    sessions: chain a request whose ids extend an earlier one's into its session, closed loop
    (`chain_sessions`; in the conversation trace 3,974 of 12,031 requests continue one).
    """
    p = trace_file(path, _pick(MOONCAKE_FILES, kind, "Mooncake"))
    ts, prompt, output, hashes, lines = [], [], [], [], []
    for line, obj in read_jsonl(p):
        ts.append(field(obj, "timestamp", float, p, line))
        prompt.append(field(obj, "input_length", int, p, line))
        output.append(field(obj, "output_length", int, p, line))
        hashes.append(field(obj, "hash_ids", list, p, line))
        lines.append(line)
    prompt_len, output_len = check_lengths(np.array(prompt, np.int64), np.array(output, np.int64), line_error(p, lines))
    t = np.array(ts, np.float64) / 1e3
    name = MOONCAKE_NAMES[kind] if path is None else p.stem
    trace = sorted_trace(name, t - t.min() if len(t) else t, prompt_len, output_len, hashes, MOONCAKE_BLOCK)
    if spread_quantized:
        trace.arrival_s = spread_steps(trace.arrival_s, seed)
    return chain_sessions(trace) if sessions else trace


def spread_steps(t: np.ndarray, seed: Seed = 0) -> np.ndarray:
    """Spread requests sharing one quantised timestamp uniformly over the step up to the next timestamp."""
    if len(t) < 2:
        return t.copy()
    values, group = np.unique(t, return_inverse=True)
    gaps = np.diff(values)
    quantum = float(np.median(gaps)) if len(gaps) else 0.0
    step = np.minimum(np.append(gaps, quantum), quantum)[group]
    u = np.random.default_rng(seed).random(len(t))
    u_in_order = u[np.lexsort((u, group))]  # ascending within each group; rows are grouped and sorted
    return t + u_in_order * step


def load_lengths(path: str | Path | None = None, *, kind: str = "sharegpt") -> tuple[np.ndarray, np.ndarray]:
    """(prompt, output) lengths of a vidur/etalon length-only file: num_prefill_tokens, num_decode_tokens."""
    p = trace_file(path, _pick(LENGTH_FILES, kind, "length-only"))
    cols = read_csv(p, LENGTH_COLUMNS)
    return check_lengths(cols.counts("num_prefill_tokens"), cols.counts("num_decode_tokens"), cols.error)


def load_length_trace(
    path: str | Path | None = None,
    *,
    kind: str = "sharegpt",
    rate: float = DEFAULT_LENGTH_RATE,
    n: int | None = None,
    duration_s: float | None = None,
    arrivals: str = "poisson",
    cv: float = 1.0,
    seed: Seed = 0,
) -> Trace:
    """A length-only file (ShareGPT / arXiv summarisation / BWB) paired with seeded arrivals at `rate` req/s.

    All rows in file order by default; with `n` or `duration_s`, lengths are drawn with replacement.
    """
    prompt, output = load_lengths(path, kind=kind)
    name = kind if path is None else Path(path).stem
    return sample_requests(
        prompt, output, rate, n=n, duration_s=duration_s, arrivals=arrivals, cv=cv, seed=seed, name=name
    )


def load_csv_trace(path: str | Path) -> Trace:
    """A plain CSV with columns arrival_s, prompt_len, output_len (arrival times kept as given)."""
    p = trace_file(path, "")
    cols = read_csv(p, SIMPLE_COLUMNS)
    t = cols.numbers("arrival_s")
    bad = np.flatnonzero(t < 0)
    if bad.size:
        raise cols.error(int(bad[0]), f"arrival_s={t[bad[0]]} is negative")
    prompt, output = check_lengths(cols.counts("prompt_len"), cols.counts("output_len"), cols.error)
    return sorted_trace(p.stem, t, prompt, output)


def _pick(files: dict[str, str], kind: str, what: str) -> str:
    if kind not in files:
        raise ValueError(f"unknown {what} trace kind {kind!r}; valid: {', '.join(files)}")
    return files[kind]


def check_lengths(prompt: np.ndarray, output: np.ndarray, error_at: ErrorAt) -> tuple[np.ndarray, np.ndarray]:
    """Prompt >= 1 and output >= 0 or a ValueError naming the row; outputs of 0 become 1."""
    for name, x, low in (("prompt length", prompt, 1), ("output length", output, 0)):
        bad = np.flatnonzero(x < low)
        if bad.size:
            raise error_at(int(bad[0]), f"{name} {x[bad[0]]} is below {low}")
    return prompt, np.maximum(output, 1)


def line_error(path: Path, lines: list[int]) -> ErrorAt:
    """Errors naming the file line of a row (`lines`: the line of each row)."""
    return lambda row, msg: ValueError(f"{path}: line {lines[row]}: {msg}")


def sorted_trace(
    name: str,
    t: np.ndarray,
    prompt: np.ndarray,
    output: np.ndarray,
    hashes: list | None = None,
    block: int | None = None,
    sessions: tuple[np.ndarray, np.ndarray] | None = None,
) -> Trace:
    """The rows as a Trace in arrival order (a stable sort, hashes and sessions reordered with them)."""
    if len(t) and (np.diff(t) < 0).any():
        order = np.argsort(t, kind="stable")
        t, prompt, output = t[order], prompt[order], output[order]
        hashes = None if hashes is None else [hashes[i] for i in order]
        sessions = None if sessions is None else (sessions[0][order], sessions[1][order])
    session, think = sessions if sessions is not None else (None, None)
    return Trace(name, t, prompt, output, hashes, block if hashes is not None else None, None, session, think)
