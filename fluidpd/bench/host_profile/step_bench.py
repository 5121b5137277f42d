"""An engine on this thread with the helpers every measurement uses: requests at a given progress, timed steps."""

from __future__ import annotations

import random
import time
from dataclasses import replace


class StepBench:
    """One engine on this process's thread, with helpers that build and time steps."""

    def __init__(self, engine, seed: int) -> None:
        self.engine = engine
        self.rng = random.Random(seed)
        self._n = 0

    def request(self, prompt_len: int, computed: int) -> str:
        """A request of `prompt_len` random tokens whose first `computed` are prefilled (in chunks
        of at most 2048); with computed == prompt_len it has sampled its first token and decodes."""
        from fluidpd.engine.plan import PrefillChunk, StepPlan
        from fluidpd.engine.sampling import SamplingParams

        self._n += 1
        ids = [self.rng.randint(100, 40000) for _ in range(prompt_len)]
        rid = self.engine.add_request(ids, SamplingParams(max_tokens=1 << 20, ignore_eos=True), f"profile-{self._n}")
        done = 0
        while done < computed:
            c = min(2048, computed - done)
            self.engine.run_step(StepPlan(prefills=[PrefillChunk(rid, c)]))
            done += c
        return rid

    def ctx_sum(self, rids: list[str]) -> int:
        """KV tokens a decode step of `rids` attends to."""
        return sum(self.engine.request(r).num_computed + 1 for r in rids)

    def timed(self, plan) -> float:
        t0 = time.perf_counter()
        self.engine.run_step(plan)
        return time.perf_counter() - t0

    def abort(self, rids) -> None:
        for r in rids:
            self.engine.abort(r)


def with_blocks(engine_config, blocks: int):
    """`engine_config` with room for at least `blocks` KV blocks, whatever its arena."""
    return replace(engine_config, num_kv_blocks=max(engine_config.num_kv_blocks or 0, blocks), arena_bytes=None)
