"""One bench run: a trace replayed against a loopback server, summarized as a `fluidpd simulate` row."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fluidpd.bench.corpus import load_corpus
from fluidpd.bench.loadgen.aggregate import error_counts, summarize
from fluidpd.bench.loadgen.client import http_client, server_info, tokenize
from fluidpd.bench.loadgen.replay import replay
from fluidpd.bench.loadgen.requests import BenchResult, plan_requests
from fluidpd.bench.loadgen.target import check_loopback
from fluidpd.core.knobs import knob
from fluidpd.core.metrics import Slo
from fluidpd.workload.trace import Trace


@dataclass
class BenchConfig:
    """One replay: the server, the trace, the SLOs and how requests are made."""

    url: str
    trace: Trace
    slo: Slo
    trace_name: str = ""
    model: str | None = knob(None, "model name to send (default: the server's)")
    max_model_len: int | None = knob(
        None, "clip prompt + output to this (--sessions: scale turns to fit it) (default: the server's)"
    )
    seed: int = knob(0, "trace loading and prompt offsets")
    drain_timeout_s: float = knob(
        300.0,
        "seconds after the last arrival (--sessions: after a turn is sent) before unfinished requests count as failed",
        flag="--drain-timeout",
    )
    progress: bool = knob(True, "show a progress bar")
    retries: int = knob(
        2,
        "send a request refused with 429 again after its Retry-After, up to this many times, as OpenAI's clients "
        "do (its TTFT counts from the first send; 0: a 429 is a failure)",
    )
    temperature: float = 0.0
    tokenizer: str | None = knob(
        None, "local tokenizer source ('smollm2', a .gguf, a dir) if the server has no /tokenize"
    )

    def __post_init__(self) -> None:
        if not self.drain_timeout_s > 0:
            raise ValueError(f"drain_timeout_s must be > 0, got {self.drain_timeout_s}")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")


async def run_bench(cfg: BenchConfig) -> tuple[dict, list[BenchResult]]:
    """Replay cfg.trace against cfg.url; (row, per-request results)."""
    base = check_loopback(cfg.url)
    async with http_client() as client:
        info = await server_info(client, base)
        model = cfg.model or info["model"]
        ids, mml = await _corpus_ids(client, base, model, cfg.tokenizer)
        max_len = cfg.max_model_len or info.get("max_model_len") or mml
        plan = plan_requests(cfg.trace, ids, max_len, cfg.seed)
        results, wall = await replay(
            client,
            base,
            model,
            plan.requests,
            drain_timeout_s=cfg.drain_timeout_s,
            progress=cfg.progress,
            temperature=cfg.temperature,
            retries=cfg.retries,
        )
    row = summarize(results, cfg.slo, info.get("policy") or "server")
    sent = [r.send_s for r in results if not math.isnan(r.send_s)]
    lag = [r.send_s - q.arrival_s for r, q in zip(results, plan.requests) if not math.isnan(r.send_s)]
    row.update(
        {
            "wall_s": wall,
            "clipped_prompts": plan.clipped_prompts,
            "clipped_outputs": plan.clipped_outputs,
            "max_model_len": max_len,
            "model": model,
            "trace": cfg.trace_name or cfg.trace.name,
            "offered_rate_rps": len(sent) / cfg.trace.duration_s if cfg.trace.duration_s > 0 else float(len(sent)),
            "max_send_lag_s": float(np.max(lag)) if lag else 0.0,
            "errors": error_counts(results),
            "retried": sum(1 for r in results if r.retries),
        }
    )
    return row, results


async def _corpus_ids(client, base: str, model: str, tokenizer: str | None) -> tuple[list[int], int | None]:
    """The corpus as token ids (by the server's /tokenize, or `tokenizer` here), and the server's max_model_len."""
    import httpx

    text = load_corpus()
    if tokenizer:
        return _local_tokenize(tokenizer, text), None
    try:
        return await tokenize(client, base, model, text)
    except httpx.HTTPStatusError as exc:
        raise ValueError(
            f"the server cannot tokenize ({exc.response.status_code} from /tokenize); "
            f"pass --tokenizer with the served model's tokenizer"
        ) from None


def _local_tokenize(source: str, text: str) -> list[int]:
    from fluidpd.engine.tokenizer import Tokenizer

    if source == "smollm2":
        from fluidpd.engine.loaders import smollm2_gguf

        source = smollm2_gguf()
    return Tokenizer.load(source).encode(text, add_special_tokens=False)
