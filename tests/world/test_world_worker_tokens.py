"""A worker's lazy token counts: synced from its decode-step counter when read or when a request leaves."""

from __future__ import annotations

from fluidpd.core.request import Request
from fluidpd.policy.view import Role
from fluidpd.world.worker import WorkerState


def test_decoding_token_counts_are_lazy_but_right_when_read_or_left():
    w = WorkerState(0, Role.DECODE, 0, kv_blocks=64, block_size=4)
    a, b = Request(1, 0.0, 5, 6, generated=1), Request(2, 0.0, 3, 3, generated=1)
    for r in (a, b):
        r.prefilled = r.prefill_target
        w.join(r)
    finished = []
    for step in range(1, 4):
        for done in w.decode_tick(0.01 * step, 0.05, lambda *_: None):
            w.leave(done)  # as World.step_end does
            finished.append(done)
        w.sync_decoding()
        assert a.generated == 1 + step
    assert finished == [b] and b.generated == 3
    assert w.blocks_of(a) == 2 and a.generated == 4  # 5 + 4 - 1 stored tokens
    w.leave(a)
    assert a.generated == 4 and not w.synced and not w.finishing
    w.join(a)
    for step in range(4, 6):
        finished = w.decode_tick(0.01 * step, 0.05, lambda *_: None)
    assert finished == [a] and a.generated == 6
