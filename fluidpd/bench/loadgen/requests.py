"""The requests of a replay (made from a trace and the corpus) and what the client saw of each."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fluidpd.bench.corpus import PromptMaker
from fluidpd.workload.trace import Trace


@dataclass(slots=True)
class BenchRequest:
    """One request to send: when, its prompt token ids and how many tokens to generate."""

    index: int
    arrival_s: float  # offset from the start of the run
    prompt_ids: list[int]
    max_tokens: int


@dataclass(slots=True)
class BenchResult:
    """What the client saw of one request: send, token and finish times (from the run's start), or an error."""

    index: int
    prompt_len: int
    max_tokens: int
    send_s: float = math.nan
    token_s: list[float] = field(default_factory=list)  # arrival time of every token
    finish_s: float = math.nan
    finish_reason: str | None = None
    error: str | None = None
    usage_prompt_tokens: int | None = None  # the server's usage.prompt_tokens, when it reports usage
    cached_tokens: int = 0  # usage.prompt_tokens_details.cached_tokens (absent: 0)
    output_ids: list[int] = field(default_factory=list)  # the tokens' ids, where the chunks carry them
    retries: int = 0  # times it was sent again after a 429

    @property
    def ok(self) -> bool:
        return self.error is None and self.finish_reason is not None and bool(self.token_s)


@dataclass
class Plan:
    """The requests of a replay, and how many had their prompt or output clipped to max_model_len."""

    requests: list[BenchRequest]
    clipped_prompts: int = 0
    clipped_outputs: int = 0


def plan_requests(trace: Trace, corpus_ids: list[int], max_model_len: int | None, seed: int = 0) -> Plan:
    """Prompts and output lengths of every request, clipped so prompt + output <= max_model_len."""
    maker = PromptMaker(corpus_ids, seed)
    plan = Plan([])
    for i, (t, p, o) in enumerate(zip(trace.arrival_s, trace.prompt_len, trace.output_len)):
        p, o = int(p), max(int(o), 1)
        if max_model_len:
            if o > max_model_len - 1:
                o = max(max_model_len - 1, 1)
                plan.clipped_outputs += 1
            if p + o > max_model_len:
                p = max(max_model_len - o, 1)
                plan.clipped_prompts += 1
        plan.requests.append(BenchRequest(i, float(t), maker.make(p), o))
    return plan
