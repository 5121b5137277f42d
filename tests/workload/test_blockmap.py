"""Trace block ids on the world's block size, and the infinite-cache oracle."""

from __future__ import annotations

import numpy as np
import pytest

from fluidpd.workload.blockmap import named_tokens, oracle_hits, world_block_ids
from fluidpd.workload.trace import Trace


def test_a_trace_block_splits_into_sub_blocks_with_derived_ids():
    assert world_block_ids([7, 9], 64, 16, 128).tolist() == [28, 29, 30, 31, 36, 37, 38, 39]
    assert world_block_ids([7, 9], 16, 16, 40).tolist() == [7, 9]  # same size: the ids themselves


def test_only_blocks_inside_the_named_tokens_get_ids():
    # Mooncake: the last of ceil(700 / 512) ids is a partial prompt block; no sub-block past the prompt
    ids = world_block_ids([1, 2], 512, 16, 700)
    assert len(ids) == 700 // 16 and ids[31] == 1 * 32 + 31 and ids[32] == 2 * 32
    t = Trace("s", [0.0], [700], [400], [np.array([1, 2])], 512, session=[0], think_time_s=[0.0])
    assert named_tokens(t, 0) == 1100  # a session trace's ids name the answer's blocks too
    assert named_tokens(Trace("r", [0.0], [700], [400], [np.array([1, 2])], 512), 0) == 700


def test_a_block_size_that_does_not_divide_names_a_block_by_the_trace_block_of_its_last_token():
    a = world_block_ids([5, 6], 64, 24, 128)
    b = world_block_ids([5, 8], 64, 24, 128)  # same first 64 tokens, then different
    assert len(a) == 5 and len(set(a.tolist())) == 5
    assert (a == b).tolist() == [True, True, False, False, False]  # 48 of the 64 shared tokens: conservative


def test_bad_block_sizes_are_rejected():
    with pytest.raises(ValueError, match="block sizes"):
        world_block_ids([1], 0, 16, 10)


def test_oracle_counts_prefix_closed_reuse_and_leaves_the_last_token():
    ids = [[1, 2, 3], [1, 2, 4], [9, 2, 3], [1, 2, 3]]
    t = Trace("o", np.arange(4.0), [48] * 4, [1] * 4, [np.array(i) for i in ids], 16)
    hits, queries = oracle_hits(t, 16)
    # second: 1, 2 (its own 4 is new); third: 9 is new, so nothing; fourth: all 3 seen, 2 usable
    assert (hits, queries) == (32 + 0 + 32, 4 * 48)
    assert oracle_hits(Trace("n", [0.0], [48], [1]), 16) == (0, 48)


def test_oracle_follows_the_arrival_order_a_run_had():
    ids = [[1, 2, 3], [1, 2, 4], [9, 2, 3], [1, 2, 3]]
    t = Trace("o", np.arange(4.0), [48] * 4, [1] * 4, [np.array(i) for i in ids], 16)
    # the fourth first, then the first: 32 tokens hit; the second only arrived, the third never did
    assert oracle_hits(t, 16, [3, 0, 1]) == (32 + 32, 3 * 48)
    assert oracle_hits(t, 16, [3, 0, 1], {1}) == (32, 48)  # only the second counted: what it reuses
