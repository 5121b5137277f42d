"""A tiny deterministic World for the lifecycle tests: no latency model, no engine.

A step costs 1 ms plus 10 us per token; a KV move costs 1 ms; FluidRole's phases 1 ms each.
Requests arrive at given times. `refuse` maps request ids to a token count: every step that
runs such a request once it has generated that many tokens fails (as an engine that refused it
would make it), to exercise `World.step_failed`.
"""

from __future__ import annotations

from fluidpd.core.metrics import MetricsCollector, Slo
from fluidpd.core.polynomial import Polynomial
from fluidpd.core.request import Request
from fluidpd.policy.base import PolicyConfig
from fluidpd.policy.costs import CostModel
from fluidpd.policy.registry import POLICIES, make_policy
from fluidpd.policy.view import blocks_for
from fluidpd.world.events import EventKind, EventLoop
from fluidpd.world.lifecycle import World

SLO = Slo(ttft_s=1.0, tbt_s=0.05)
COSTS = CostModel(SLO, Polynomial((1e-5, 1e-3)), Polynomial((1e-5, 1e-3)))


class TinyWorld(World):
    """A World on a virtual clock whose steps cost a fixed formula."""

    def __init__(
        self,
        policy: str,
        workers: int,
        kv_blocks: int,
        *,
        prefill_workers: int = 1,
        refuse: dict[int, int] | None = None,
        block_size: int = 16,
        router: str = "",
    ):
        config = PolicyConfig(prefill_workers=prefill_workers, prefill_batch_tokens=256, chunk_budget=64, router=router)
        pol = make_policy(policy, config, costs=COSTS if POLICIES.get(policy).needs_costs else None)
        super().__init__(
            pol, 1.0, kv_blocks, MetricsCollector(SLO, finished=[]), workers, block_size, lambda i: 0, EventLoop()
        )
        self.refuse = refuse or {}
        self.failures: list[tuple[int, str]] = []
        self.ended: list[int] = []  # every request id, once per end (finish, failure, rejection)
        self.last_arrival = 0.0
        if pol.uses_tick:
            self.loop.at(0.0, EventKind.CONTROL, self._control)

    def active(self) -> bool:
        return bool(self.outstanding) or self.loop.now < self.last_arrival

    def arrive(self, reqs: list[Request]) -> None:
        for req in reqs:
            self.last_arrival = max(self.last_arrival, req.arrival_s)
            self.loop.at(req.arrival_s, EventKind.ARRIVAL, self._arrive, req)

    def _arrive(self, req: Request) -> None:
        self.outstanding += 1
        self.submit(req)

    def run(self, until: float = 600.0) -> None:
        self.loop.run(until)

    def kick(self, w) -> None:
        if not w.busy and not (w.transfers_in or w.transfers_out):
            assert w.kv_blocks_used == expected_blocks(w), f"worker {w.id}: KV accounting drifted"
        super().kick(w)

    def execute(self, w, plan, shape) -> None:
        ran = [r for r, _ in plan.chunks] + (list(w.decoding.values()) if plan.decode else [])
        bad = [(r, f"request {r.id} refused") for r in ran if self.refuse.get(r.id, 1 << 30) <= r.generated]
        if bad:
            self.loop.at(self.loop.now + 1e-3, EventKind.STEP_END, lambda _: self.step_failed(w, plan, bad))
            return
        d = 1e-3 + 1e-5 * shape.tokens
        self.loop.at(self.loop.now + d, EventKind.STEP_END, lambda _: self.step_end(w, plan, d))

    def transfer(self, req, src, dst, tokens, cls, done, arg, skip_blocks=0) -> None:
        self.loop.at(self.loop.now + 1e-3, EventKind.TRANSFER_END, done, arg)

    def run_phase(self, a, kv_blocks: int) -> None:
        self.loop.at(self.loop.now + 1e-3, EventKind.TRANSFER_END, self.phase_end, a)

    def finish(self, req: Request) -> None:
        super().finish(req)
        self.ended.append(req.id)

    def fail(self, req: Request, reason: str) -> None:
        super().fail(req, reason)
        self.failures.append((req.id, reason))
        self.ended.append(req.id)

    def reject(self, req: Request) -> None:
        super().reject(req)
        self.ended.append(req.id)


def expected_blocks(w) -> int:
    """The KV blocks worker `w` should hold between steps, recomputed from its requests: each one's
    private blocks, plus the cached blocks they hold, counted once however many share them."""
    held = w.cache.held
    admitted = [r for r in w.queue if r.worker == w.id]
    live = [*w.decoding.values(), *w.incoming, *w.held.values()]
    refs: dict[int, int] = {}
    for r in [*admitted, *live]:
        for h in r.block_hashes[: held.get(r.id, 0)] if hasattr(r, "block_hashes") else ():
            refs[h] = refs.get(h, 0) + 1
    assert refs == w.cache.refs, f"worker {w.id}: cache references drifted"
    private = sum(blocks_for(r.prefill_target, w.block_size) - held.get(r.id, 0) for r in admitted)
    return private + sum(w.blocks_of(r) - held.get(r.id, 0) for r in live) + len(refs)


def requests(n: int, prompt: int = 40, output: int = 20, gap_s: float = 0.002) -> list[Request]:
    """`n` requests `gap_s` apart, prompt and output lengths varying deterministically around the given ones."""
    return [Request(i, i * gap_s, prompt + 7 * (i % 5), output + 3 * (i % 4)) for i in range(n)]
