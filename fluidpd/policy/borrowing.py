"""FluidToken's borrowing: which queued prompts move onto which decode workers with slack, and KV room for them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from fluidpd.core.request import Request
from fluidpd.policy.actions import Borrow, BorrowSplit
from fluidpd.policy.stepplan import on_time_first
from fluidpd.policy.view import ClusterView, Role, WorkerView, blocks_for

if TYPE_CHECKING:
    from fluidpd.policy.fluidtoken_config import FluidTokenConfig


class Borrowing:
    """Mixin of FluidToken: strip requests from the prefill queues onto decode workers with slack and KV room."""

    if TYPE_CHECKING:  # what FluidToken provides
        config: FluidTokenConfig

        def t_iter(self, w: WorkerView) -> float: ...
        def slack(self, w: WorkerView, forecast: bool = False) -> float: ...
        def has_slack(self, w: WorkerView, slack_s: float) -> bool: ...
        def cost_scale(self, w: WorkerView) -> float: ...
        def chunk_cost(self, batch: int, prior: int, c: int, scale: float = 1.0) -> float: ...
        def chunk_tokens(self, w: WorkerView, prior: int = 0, forecast: bool = False) -> int: ...
        def state_key(self, w: WorkerView) -> tuple: ...

    def init_borrowing(self) -> None:
        self._reserve = 0  # blocks each decode worker keeps free for hand-offs (set by borrow)
        self.borrowed = 0
        self.spread = 0
        # per worker: (state_key, prefill_rate) and (state_key, slack, has_slack), as last computed
        self._rates: dict[int, tuple[tuple, float]] = {}
        self._slacks: dict[int, tuple[tuple, float, bool]] = {}

    def prefill_rate(self, w: WorkerView) -> float:
        """Prompt tokens a second `w` prefills by borrowing when it has KV room (`has_room`): a chunk of
        the size its slack fits in every step (0 without slack). Recomputed only when `w` changed."""
        key = self.state_key(w)
        last = self._rates.get(w.id)
        if last is not None and last[0] == key:
            return last[1]
        c = self.chunk_tokens(w, forecast=True)
        step = self.t_iter(w) + self.chunk_cost(w.num_decoding, 0, c, self.cost_scale(w)) if c else 0.0
        rate = c / step if step > 0 else 0.0  # (a step priced at nothing: nothing decodes, a flat fit)
        self._rates[w.id] = (key, rate)
        return rate

    def slack_of(self, w: WorkerView) -> tuple[float, bool]:
        """(slack(w), has_slack(w, slack(w))), recomputed only when `w` changed."""
        key = self.state_key(w)
        last = self._slacks.get(w.id)
        if last is not None and last[0] == key:
            return last[1], last[2]
        slack = self.slack(w)
        fits = self.has_slack(w, slack)
        self._slacks[w.id] = (key, slack, fits)
        return slack, fits

    def borrow(self, view: ClusterView, late: Callable | None = None) -> list:
        """Strip requests from the head of the prefill queues onto decode workers with slack (with
        `late`, the requests already past their TTFT SLO last: `on_time_first`)."""
        donors = [w for w in view.workers if w.role is Role.PREFILL and w.queue]
        if not donors:
            return []
        heads = {
            w.id: _unstarted_head(on_time_first(w.queue, late, w.num_prefilling), 8) for w in donors
        }  # a few unstarted requests from each queue's head
        owner = {r.id: wid for wid, reqs in heads.items() for r in reqs}
        waiting = sorted(
            (r for reqs in heads.values() for r in reqs),
            key=lambda r: (late is not None and late(r), r.arrival_s, r.id),
        )
        cap = self.config.borrowed_per_worker
        self._reserve = handoff_reserve(view)
        free, slack = [], {}  # nothing changes while borrowing plans: each worker's slack is read once
        for w in view.workers:
            if w.role is Role.DECODE and w.routable and len(w.queue) < cap:
                slack[w.id], fits = self.slack_of(w)
                if fits:
                    free.append(w)
        room = {w.id: self._room(w) for w in free}
        free.sort(key=lambda w: (-room[w.id], w.id))  # most room first: a request's home is the first that fits
        actions: list = []
        for req in waiting:
            if not free:
                break
            home = self._home(req, free, room, slack)
            if home is None:
                continue
            free.remove(home)
            helpers = self._helpers(req, free, room)
            if helpers:
                for h in helpers:
                    free.remove(h)
                actions.append(BorrowSplit(req, owner[req.id], (home.id, *(h.id for h in helpers))))
                self.spread += 1
            else:
                actions.append(Borrow(req, owner[req.id], home.id))
        self.borrowed += len(actions)
        return actions

    def has_room(self, w: WorkerView) -> bool:
        """`w` has KV room to borrow into (beyond what it keeps free for hand-offs)."""
        return self._room(w) > 0

    def _room(self, w: WorkerView) -> int:
        return (
            w.free_blocks - w.pull_blocks_pending - min(self._reserve, int(self.config.kv_headroom * w.kv_blocks_total))
        )

    def _home(self, req: Request, free: list, room: dict[int, int], slack: dict[int, float]) -> WorkerView | None:
        """The worker with the most room that can hold the whole request, whose slack would still
        fit the prompt's last chunk (so a borrowed prompt cannot stall behind the decodes), and that
        holds at least the cached prefix its prefill worker would skip; `room` and `slack` by worker
        id, `free` sorted by most room first (then lowest id), so the first that fits is that worker
        and the scan stops at the first without room: a borrowing cycle costs what it places, not
        requests x workers."""
        step = self.config.min_chunk
        need = blocks_for(req.prompt_len + req.output_len, free[0].block_size)
        prior = req.prefill_target - step
        for w in free:
            if room[w.id] < need:
                return None
            if self.chunk_cost(w.num_decoding + 1, prior, step, self.cost_scale(w)) <= slack[w.id] and (
                not req.queued_hit or w.cached_tokens(req) >= req.queued_hit  # never lose a cached prefix
            ):
                return w
        return None

    def _helpers(self, req: Request, free: list, room: dict[int, int]) -> list:
        """Decode workers that take the other pieces of a long prompt: the most room first (`room` by
        worker id; `free` sorted so)."""
        c = self.config
        if req.prompt_len < c.split_min_tokens or c.max_split < 2 or req.prefill_target != req.prompt_len or req.n > 1:
            return []
        piece = -(-req.prompt_len // c.max_split)
        helpers = []
        for w in free:  # most room first: those with room for a piece come first
            if room[w.id] < blocks_for(piece, w.block_size):
                break
            helpers.append(w)
            if len(helpers) == c.max_split - 1:
                break
        return helpers


def handoff_reserve(view: ClusterView) -> int:
    """Blocks per routable decode worker that the prefill pool's KV (held for pulls or being
    computed) will ask the decode pool for."""
    decode = sum(1 for w in view.workers if w.role is Role.DECODE and w.routable)
    coming = sum(w.kv_blocks_used for w in view.workers if w.role is Role.PREFILL)
    return -(-coming // decode) if decode else 0


def _unstarted_head(queue, n: int) -> list[Request]:
    found = []
    for r in queue:
        if isinstance(r, Request) and r.worker < 0:
            found.append(r)
            if len(found) == n:
                break
    return found
