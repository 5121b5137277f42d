"""The simulator's hot-path shortcuts give what the general code gives (issue 54: results unchanged)."""

from __future__ import annotations

import random

from fluidpd.core.request import Request
from fluidpd.latency.shape import StepShape
from fluidpd.policy.view import Role
from fluidpd.world.host_tier import HostTier
from fluidpd.world.worker import WorkerState


def general_cached(w: WorkerState, req: Request, blocks=None) -> tuple[tuple[int, int], int]:
    """`cached_blocks` and `cached_tokens` as the general path computes them (no shortcut)."""
    hashes, limit = req.block_hashes, (w._cache_span(req) - 1) // w.block_size
    n = w.cache.match(hashes, limit)
    host = w.host.match(hashes, n, limit) if w.host is not None else 0
    device, h = (n, host) if blocks is None else blocks
    return (n, host), (device + h) * w.block_size + w._whole_tail(req, device, h)


def test_a_request_without_block_ids_is_priced_as_the_general_path_prices_it():
    w = WorkerState(0, Role.PREFILL, 0, 64)
    w.host = HostTier(32)
    held = Request(0, 0.0, 64, 4, block_hashes=[1, 2, 3, 4])
    w.register(held, 64)  # four blocks cached on the device ...
    w.host.offload([5, 6])  # ... and two in the host tier
    for prompt in (1, 15, 16, 17, 64, 100):
        for n in (1, 3):
            req = Request(1, 0.0, prompt, 8, n=n)
            assert not req.block_hashes
            blocks, tokens = general_cached(w, req)
            assert w.cached_blocks(req) == blocks == (0, 0)
            assert w.cached_tokens(req) == tokens == 0
            for given in ((0, 0), (2, 1), (3, 0)):  # a caller's own count of them is used as given
                assert w.cached_tokens(req, given) == general_cached(w, req, given)[1]
    hit = Request(2, 0.0, 64, 4, block_hashes=[1, 2, 3, 4])  # ids: the general path, unchanged
    assert w.cached_blocks(hit) == general_cached(w, hit)[0] == (3, 0)
    assert w.cached_tokens(hit) == general_cached(w, hit)[1] == 63


def test_num_decoding_counts_incoming_sequences_only_when_there_are_any():
    w = WorkerState(0, Role.DECODE, 0, 256)
    a, b = Request(0, 0.0, 16, 8, n=2), Request(1, 0.0, 16, 8)
    for r in (a, b):
        r.prefilled, r.generated = r.prompt_len, 1
    w.join(a)
    assert w.num_decoding == w.decode_rows + sum(r.live for r in w.incoming) == 2
    w.busy = True  # KV arriving during a step waits in `incoming`
    w.join(b)
    assert w.incoming == [b] and w.num_decoding == w.decode_rows + sum(r.live for r in w.incoming) == 3


def test_a_decode_step_shape_built_positionally_is_the_one_add_decodes_builds():
    rng = random.Random(0)
    for _ in range(100):
        n, ctx, masked = rng.randint(1, 512), rng.randint(0, 10**6), rng.randint(0, 4)
        built = StepShape()
        built.add_decodes(n, ctx)
        built.masked_rows = masked
        assert StepShape(0, 0, 0.0, 0, n, ctx, masked) == built
