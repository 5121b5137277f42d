"""The routers' scans over every worker (issue 54: a request at 1,024 workers) pick what the key
functions they replaced picked, ties included."""

from __future__ import annotations

import random
from types import SimpleNamespace

from fluidpd.policy.routers.load import LeastLoaded
from fluidpd.policy.routing import most_room


def _pool(rng: random.Random, n: int) -> list:
    ids = rng.sample(range(4 * n), n)  # (a pool need not be in id order)
    return [
        SimpleNamespace(
            id=i,
            free_blocks=rng.choice([0, 5, 10]),
            pull_blocks_pending=rng.choice([0, 5]),
            num_decoding=rng.choice([0, 1, 2]),
            queue=[None] * rng.choice([0, 1]),
            num_held=rng.choice([0, 1]),
        )
        for i in ids
    ]


def test_most_room_is_the_old_key_min():
    rng = random.Random(0)
    for _ in range(500):
        pool = _pool(rng, rng.randint(1, 12))
        old = min(pool, key=lambda w: (-(w.free_blocks - w.pull_blocks_pending), w.num_decoding, w.id))
        assert most_room(pool) is old


def test_least_loaded_is_the_old_key_min():
    rng = random.Random(1)
    for _ in range(500):
        pool = _pool(rng, rng.randint(1, 12))
        old = min(pool, key=lambda w: (len(w.queue) + w.num_decoding + w.num_held, w.id))
        assert LeastLoaded().pick(None, pool, None) is old
