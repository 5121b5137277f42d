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
        self._top = min(40000, engine.model_config.vocab_size - 1)  # token ids drawn from [100, top]
        self._cuda = engine.arena.device.type == "cuda"
        self._live: set[str] = set()  # requests made here and not aborted

    def request(self, prompt_len: int, computed: int) -> str:
        """A request of `prompt_len` random tokens whose first `computed` are prefilled (in chunks
        of at most 2048); with computed == prompt_len it has sampled its first token and decodes."""
        return self.requests(1, prompt_len, computed, 2048)[0]

    def requests(self, count: int, prompt_len: int, computed: int, step_tokens: int = 2048) -> list[str]:
        """`count` requests as `request` makes them, prefilled together: each untimed step takes
        up to `step_tokens` tokens of as many of them as fit (a decode batch's setup in a few steps)."""
        from fluidpd.engine.plan import PrefillChunk, StepPlan
        from fluidpd.engine.sampling import SamplingParams

        rids = []
        for _ in range(count):
            self._n += 1
            ids = [self.rng.randint(min(100, self._top), self._top) for _ in range(prompt_len)]
            params = SamplingParams(max_tokens=1 << 20, ignore_eos=True)
            rids.append(self.engine.add_request(ids, params, f"profile-{self._n}"))
        self._live.update(rids)
        left = dict.fromkeys(rids, computed)
        while any(left.values()):
            chunks, room = [], step_tokens
            for rid in (r for r in rids if left[r]):
                c = min(left[rid], room)
                chunks.append(PrefillChunk(rid, c))
                left[rid] -= c
                room -= c
                if not room:
                    break
            self.engine.run_step(StepPlan(prefills=chunks))
        return rids

    def ctx_sum(self, rids: list[str]) -> int:
        """KV tokens a decode step of `rids` attends to."""
        return sum(self.engine.request(r).num_computed + 1 for r in rids)

    def timed(self, plan) -> float:
        """Seconds of one `run_step(plan)` (on a GPU it ends synchronised: its tokens are read back)."""
        if self._cuda:  # nothing queued before the step counts against it
            import torch

            torch.cuda.synchronize(self.engine.arena.device)
        t0 = time.perf_counter()
        self.engine.run_step(plan)
        return time.perf_counter() - t0

    def warm(self, tokens: int) -> None:
        """One untimed prefill of `tokens` tokens and decode step (a GPU's first kernels load and tune)."""
        from fluidpd.engine.plan import StepPlan

        rid = self.request(tokens, tokens)
        self.engine.run_step(StepPlan(decodes=[rid]))
        self.abort([rid])

    def abort(self, rids) -> None:
        for r in rids:
            self.engine.abort(r)
            self._live.discard(r)

    def recover(self) -> None:
        """After a step that raised (out of memory): every request made here aborted, the GPU's cache emptied."""
        self.abort(list(self._live))
        if self._cuda:
            import torch

            torch.cuda.empty_cache()


def with_blocks(engine_config, blocks: int):
    """`engine_config` with room for at least `blocks` KV blocks, whatever its arena."""
    return replace(engine_config, num_kv_blocks=max(engine_config.num_kv_blocks or 0, blocks), arena_bytes=None)
