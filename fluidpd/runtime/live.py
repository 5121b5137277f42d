"""A request as the runtime keeps it: ids, tokens, the stream its tokens go to."""

from __future__ import annotations

from dataclasses import dataclass, field

from fluidpd.core.blockhash import ROOT, block_hashes
from fluidpd.core.request import Request


@dataclass(slots=True, eq=False)
class Live:
    """What the runtime keeps of a request besides the shared Request: ids, tokens, its stream."""

    request: Request
    prompt_ids: list[int]
    params: object
    stream: object
    out_ids: list[int] = field(default_factory=list)
    engine_id: str = ""
    engine_worker: int = -1  # the engine that holds it now (-1: none)
    admissions: int = 0
    aborted: bool = False
    finish_reason: str | None = None
    error: str | None = None  # why its engine refused it
    planned_cached: int = -1  # the cache hit its admission planned on its engine (-1: not admitted yet)
    step_timeouts: int = 0  # steps prefilling it that ran over the step timeout (their workers were lost)
    prompt_logprobs: list | None = None  # scored by the worker that prefilled, sent with its first event
    choices: list[list[int]] = field(default_factory=list)  # n > 1: each choice's tokens (out_ids stays empty)
    choice_reasons: dict[int, str] = field(default_factory=dict)  # n > 1: the choices that finished, why

    @property
    def sent_any(self) -> bool:
        return bool(self.out_ids) or any(self.choices)


def rescoring(live: Live) -> int | None:
    """The prompt_logprobs a (re)admission asks its engine for: the request's own until its first event went
    out (a restart before that scores anew, what a lost attempt scored is dropped), then none (a recompute
    scores nothing again)."""
    live.prompt_logprobs = None
    return None if live.sent_any else live.params.prompt_logprobs  # type: ignore[attr-defined]


def first_event_extras(live: Live) -> tuple[int | None, list | None]:
    """What an event carries beside its tokens: on the request's first, its prefix-cache hit and its prompt
    logprobs (those scored so far leave the Live)."""
    first = None if live.sent_any else live.request.cached_tokens
    plp, live.prompt_logprobs = live.prompt_logprobs, None
    return first, plp


def extend_hashes(live: Live, block_size: int) -> None:
    """Hash the blocks its answer has filled, so they stay cached where it finishes (the next turn
    of a conversation sends them back as its prompt). Only the new blocks' tokens are read."""
    hashes = live.request.block_hashes
    assert isinstance(hashes, list)  # the coordinator gives a runtime request a list to extend
    done, prompt = len(hashes), live.prompt_ids
    if (len(prompt) + len(live.out_ids)) // block_size > done:
        start = done * block_size
        tail = prompt[start:] + live.out_ids[max(0, start - len(prompt)) :]
        hashes.extend(block_hashes(tail, block_size, 0, hashes[-1] if done else ROOT))
