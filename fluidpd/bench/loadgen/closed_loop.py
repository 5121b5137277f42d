"""The closed loop: each session's next turn is sent its think time after the previous answer completes,
carrying the whole conversation so far (the model's actual answers included); sessions run concurrently
from their own start times. Time comes from a Clock, so tests can run it on a fake one."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from fluidpd.bench.loadgen.requests import BenchResult
from fluidpd.bench.loadgen.sessions import SessionPlan, Turn


class Clock(Protocol):
    """Now, and waiting."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class WallClock:
    """The host's monotonic clock."""

    def now(self) -> float:
        return time.perf_counter()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(seconds, 0.0))


@dataclass(slots=True)
class TurnResult:
    """One sent turn: what the client saw of its request, and the answer it got."""

    session: int
    turn: int
    result: BenchResult
    answer: str = ""
    messages: list[dict[str, str]] | None = None  # what was sent: the conversation so far


Send = Callable[[Turn, list[dict[str, str]]], Awaitable[TurnResult]]


async def run_session(turns: list[Turn], send: Send, clock: Clock, t0: float, out: list[TurnResult]) -> None:
    """Send a session's turns in order, each after the previous one's answer and its think time; when a
    turn fails the session ends, its later turns recorded as failed (never sent)."""
    history: list[dict[str, str]] = []
    for k, turn in enumerate(turns):
        if k == 0:
            await clock.sleep(t0 + turn.start_s - clock.now())
            history = list(turn.messages)
        else:
            await clock.sleep(turn.think_s)
            history = [*history, {"role": "assistant", "content": out[-1].answer}, *turn.messages]
        done = await send(turn, history)
        out.append(done)
        if not done.result.ok:
            for later in turns[k + 1 :]:
                res = BenchResult(later.index, later.prompt_tokens, later.max_tokens)
                res.error = f"not sent: turn {turn.turn + 1} of its session failed"
                out.append(TurnResult(later.session, later.turn, res))
            return


async def replay_sessions(
    plan: SessionPlan, send: Send, clock: Clock | None = None, *, progress: bool = True
) -> list[TurnResult]:
    """Every session of `plan` concurrently from its start time; results ordered by session and turn."""
    from tqdm import tqdm

    clock = clock or WallClock()
    bar = tqdm(
        total=plan.n_turns,
        desc="sessions",
        unit="turn",
        file=sys.stderr,
        disable=not progress,
        mininterval=0.5,
        dynamic_ncols=True,
    )

    async def counted(turn: Turn, messages: list[dict[str, str]]) -> TurnResult:
        try:
            return await send(turn, messages)
        finally:
            bar.update(1)

    outs: list[list[TurnResult]] = [[] for _ in plan.sessions]
    t0 = clock.now()
    try:
        await asyncio.gather(*(run_session(s, counted, clock, t0, o) for s, o in zip(plan.sessions, outs)))
    finally:
        bar.close()
    return [r for o in outs for r in o]
