"""Offline batch generation: queue every prompt on an engine and step it until all have finished."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any, Protocol

from fluidpd.engine.outputs import RequestOutput, StepOutput
from fluidpd.engine.prompts import Prompt
from fluidpd.engine.sampling import SamplingParams


class Steppable(Protocol):
    """What offline generation needs of an engine (LLMEngine): queue a request, step, its scheduler."""

    scheduler: Any

    def add_request(
        self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None, *, chat: bool = False
    ) -> str: ...

    def step(self) -> list[StepOutput]: ...


def generate(
    engine: Steppable,
    prompts: Prompt | list[Prompt],
    params: SamplingParams | Seq[SamplingParams] | None,
    chat: bool,
    use_tqdm: bool,
) -> list[RequestOutput]:
    """Run prompts to completion (continuous batching); outputs in prompt order."""
    if isinstance(prompts, str) or (prompts and isinstance(prompts[0], (int, dict))):
        prompts = [prompts]
    plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
    if len(plist) != len(prompts):
        raise ValueError(f"{len(plist)} sampling params for {len(prompts)} prompts")
    rids = [engine.add_request(p, sp, chat=chat) for p, sp in zip(prompts, plist)]
    want, done = set(rids), {}
    bar = _progress(len(rids)) if use_tqdm else None
    while len(done) < len(rids):
        forking = any(g.detached for g in getattr(engine, "groups", {}).values())  # n > 1: forks next step
        if not engine.scheduler.has_work() and not engine.scheduler.dropped and not forking:
            raise RuntimeError("engine has no work left but requests are unfinished")
        for o in engine.step():
            if o.group_finished and o.request_id in want:
                done[o.request_id] = o.output
                if bar is not None:
                    bar.update(1)
    if bar is not None:
        bar.close()
    return [done[r] for r in rids]


def _progress(total: int):
    from tqdm import tqdm

    return tqdm(total=total, desc="generate", unit="req")
