"""The runtime's side of n > 1 requests: one world Request and one engine request id; each choice's
tokens stream as TokenEvents with its index, each choice's last event carries its finish_reason."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from fluidpd.runtime.api import TokenEvent
from fluidpd.runtime.live import Live, first_event_extras, rescoring

if TYPE_CHECKING:
    from fluidpd.core.request import Request
    from fluidpd.engine.outputs import StepOutput
    from fluidpd.world.worker import WorkerState


def engine_args(live: Live) -> tuple[list[int], object, list[list[int] | None]]:
    """(prompt, params, produced) to add a group to an engine: each choice re-added with the tokens it
    already streamed (None: it finished), so a restart repeats and loses none."""
    n = live.params.n  # type: ignore[attr-defined]
    if not live.choices:
        live.choices = [[] for _ in range(n)]
    params = replace(live.params, prompt_logprobs=rescoring(live))  # type: ignore[type-var]
    produced = [None if j in live.choice_reasons else list(live.choices[j]) for j in range(n)]
    return list(live.prompt_ids), params, produced


def on_output(w: WorkerState, live: Live, out: StepOutput, stopped: set[int]) -> None:
    """One engine output of a group: the choice's tokens go out; a choice that ends before the others
    frees its own KV in the world's view (`drop_sequence`); the group's end stops the request."""
    if out.prompt_logprobs:
        live.prompt_logprobs = (live.prompt_logprobs or []) + out.prompt_logprobs
    j = out.index
    if out.new_token_ids:
        first, plp = first_event_extras(live)
        live.choices[j].extend(out.new_token_ids)
        event = TokenEvent(list(out.new_token_ids), logprobs=out.logprobs, cached_tokens=first, prompt_logprobs=plp)
        event.index = j
        live.stream.put(event)
    if out.finished and j not in live.choice_reasons and not live.aborted:
        reason = "stop" if out.finish_reason == "stop" else "length"
        live.choice_reasons[j] = reason
        live.stream.put(TokenEvent([], reason, index=j))
        if not out.group_finished and live.request.live > 1:
            w.drop_sequence(live.request)
    if out.group_finished or live.aborted:
        stopped.add(live.request.id)
        if out.group_finished:
            live.finish_reason = live.choice_reasons.get(0, "length")
            live.engine_worker = -1


def restarting(req: Request) -> None:
    """A group with tokens out starts over: its engine prefills the prompt, then forks and computes each
    choice's tokens, which may take the world one step more than a single sequence's recompute (the
    choices sample in that step); its engine, not the world's count, ends it, so the world allows one
    more token (each choice still stops at its own max_tokens)."""
    if req.n > 1 and req.generated:
        req.output_len += 1


def end_events(live: Live, reason: str) -> list[TokenEvent]:
    """The events that end a request the world finished: one per choice that has not ended yet (an
    "abort" ends them all at once)."""
    n = live.request.n
    if n == 1 or reason == "abort":
        return [TokenEvent([], reason)]
    return [TokenEvent([], reason, index=j) for j in range(n) if j not in live.choice_reasons]
