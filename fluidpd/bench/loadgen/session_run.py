"""One session replay: multi-turn chat against a loopback server, summarized per turn."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from fluidpd.bench.corpus import load_corpus
from fluidpd.bench.loadgen.aggregate import error_counts
from fluidpd.bench.loadgen.chat import send_chat
from fluidpd.bench.loadgen.client import http_client, server_info
from fluidpd.bench.loadgen.closed_loop import TurnResult, replay_sessions
from fluidpd.bench.loadgen.requests import BenchResult
from fluidpd.bench.loadgen.run import BenchConfig
from fluidpd.bench.loadgen.sessions import SessionPlan, Turn, plan_sessions
from fluidpd.bench.loadgen.target import check_loopback
from fluidpd.bench.loadgen.turns import by_turn, session_summary
from fluidpd.bench.loadgen.words import DEFAULT_TOKENS_PER_WORD, WordSource
from fluidpd.core.knobs import knob

SAMPLE_WORDS = 2000  # words tokenised to measure the tokenizer's tokens per word


@dataclass
class SessionReplayConfig:
    """How sessions are replayed: how many, at what scale, and how answers end."""

    n_sessions: int = knob(8, "sessions to replay (chat: generated; a trace: its first N by start time)")
    context_scale: float | None = knob(
        None, "multiply every token count by X (default: the largest <= 1 at which every turn fits the context)"
    )
    ignore_eos: bool = knob(True, "generate every answer to the trace's length (vLLM's ignore_eos)")
    tokens_per_word: float | None = knob(
        None, f"tokens per plain word, to size text (default: measured by /tokenize, else {DEFAULT_TOKENS_PER_WORD})"
    )

    def __post_init__(self) -> None:
        if self.n_sessions < 1:
            raise ValueError(f"n_sessions must be >= 1, got {self.n_sessions}")
        if self.context_scale is not None and not self.context_scale > 0:
            raise ValueError(f"context_scale must be > 0, got {self.context_scale}")
        if self.tokens_per_word is not None and not self.tokens_per_word > 0:
            raise ValueError(f"tokens_per_word must be > 0, got {self.tokens_per_word}")


@dataclass
class SessionReport:
    """A session replay's results: the overall row, rows by turn, every turn, and the plan sent."""

    row: dict
    turns: list[dict]
    results: list[TurnResult]
    plan: SessionPlan
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict:
        return {
            "summary": self.row,
            "by_turn": self.turns,
            "turns": [turn_record(r) for r in self.results],
            "notes": self.notes,
        }


def turn_record(t: TurnResult) -> dict:
    """One turn as JSON: its place, times, usage and answer."""
    r = t.result
    ttft = r.token_s[0] - r.send_s if r.ok else None
    gaps = [b - a for a, b in zip(r.token_s, r.token_s[1:])]
    return {
        "session": t.session,
        "turn": t.turn + 1,
        "send_s": r.send_s,
        "ttft_s": ttft,
        "tbt_max_s": max(gaps) if gaps else None,
        "prompt_tokens": r.usage_prompt_tokens,
        "cached_tokens": r.cached_tokens,
        "completion_tokens": len(r.token_s),
        "finish_reason": r.finish_reason,
        "error": r.error,
        "answer": t.answer,
    }


async def run_sessions(cfg: BenchConfig, replay: SessionReplayConfig) -> SessionReport:
    """Replay cfg.trace's sessions (closed loop, chat completions) against cfg.url."""
    base = check_loopback(cfg.url)
    async with http_client() as client:
        info = await server_info(client, base)
        model = cfg.model or info["model"]
        max_len = cfg.max_model_len or info.get("max_model_len")
        text = load_corpus()
        tpw, how = replay.tokens_per_word, "given"
        if tpw is None:
            tpw, how = await _tokens_per_word(client, base, model, text, cfg.tokenizer)
        words = WordSource(text, tpw)
        plan = plan_sessions(
            cfg.trace, words, max_len, n_sessions=replay.n_sessions, context_scale=replay.context_scale, seed=cfg.seed
        )
        start = time.perf_counter()  # the run's start: every time reported is an offset from it
        send = _sender(client, base, model, cfg, replay, start)
        results = await replay_sessions(plan, send, progress=cfg.progress)
    row = session_summary(results, cfg.slo, info.get("policy") or "server")
    row.update(
        {
            "model": model,
            "max_model_len": max_len,
            "trace": cfg.trace_name or cfg.trace.name,
            "context_scale": plan.scale,
            "dropped_turns": plan.dropped_turns,
            "shared_blocks": plan.shared_blocks,
            "tokens_per_word": tpw,
            "errors": error_counts([r.result for r in results]),
            "retried": sum(1 for r in results if r.result.retries),
        }
    )
    notes = [*plan.notes, f"text sized at {tpw:.3f} tokens per word ({how})"]
    return SessionReport(row, by_turn(results, cfg.slo), results, plan, notes)


def _sender(client, base: str, model: str, cfg: BenchConfig, replay: SessionReplayConfig, start: float):
    """What sends one turn (its chat so far) and waits for its answer, times offset from `start`."""

    async def send(turn: Turn, messages: list[dict[str, str]]) -> TurnResult:
        res = BenchResult(turn.index, turn.prompt_tokens, turn.max_tokens)
        answer = ""
        try:
            answer = await asyncio.wait_for(
                send_chat(
                    client,
                    base,
                    model,
                    messages,
                    turn.max_tokens,
                    start,
                    res,
                    temperature=cfg.temperature,
                    ignore_eos=replay.ignore_eos,
                    retries=cfg.retries,
                ),
                cfg.drain_timeout_s,
            )
        except TimeoutError:
            res.error = f"not finished within {cfg.drain_timeout_s:g} s"
        if res.usage_prompt_tokens:
            res.prompt_len = res.usage_prompt_tokens
        return TurnResult(turn.session, turn.turn, res, answer, messages)

    return send


async def _tokens_per_word(client, base: str, model: str, text: str, tokenizer: str | None) -> tuple[float, str]:
    """The tokenizer's tokens per plain word: by the server's /tokenize, else `tokenizer` here, else a default."""
    from fluidpd.bench.loadgen.client import tokenize
    from fluidpd.bench.loadgen.run import _local_tokenize

    sample = " ".join(WordSource(text).words[:SAMPLE_WORDS])
    n_words = len(sample.split())
    if tokenizer:
        return len(_local_tokenize(tokenizer, sample)) / n_words, f"tokenizer {tokenizer}"
    try:
        ids, _ = await tokenize(client, base, model, sample)
        return len(ids) / n_words, "the server's /tokenize"
    except Exception:  # noqa: BLE001 - any OpenAI-compatible server: /tokenize is optional
        return DEFAULT_TOKENS_PER_WORD, "default: the server cannot tokenize"
