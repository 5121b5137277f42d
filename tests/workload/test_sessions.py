import itertools

import numpy as np
import pytest

from fluidpd.workload.sessions import chain_sessions, chat_sessions
from fluidpd.workload.trace import Trace


def test_chat_sessions_grow_their_history_and_share_the_system_prompt():
    t = chat_sessions(3, 4, system_tokens=100, new_tokens=20, output_tokens=10, think_time_s=0.5, block=16, seed=1)
    assert len(t) == 12 and t.has_sessions and t.hash_block_size == 16
    for s in range(3):
        rows = np.flatnonzero(t.session == s)
        assert list(t.prompt_len[rows]) == [120, 150, 180, 210]  # history + answer + new input
        assert t.think_time_s[rows[0]] == 0 and (t.think_time_s[rows[1:]] >= 0).all()
        for a, b in itertools.pairwise(rows):  # a turn's context is a prefix of the next turn's
            ia, ib = t.hash_ids[a], t.hash_ids[b]
            assert (ib[: len(ia)] == ia).all()
    first = [t.hash_ids[np.flatnonzero(t.session == s)[0]] for s in range(3)]
    assert (first[0][:6] == first[1][:6]).all()  # 6 full blocks of the 100-token system prompt
    assert first[0][6] != first[1][6]


def test_chat_sessions_reject_bad_shapes():
    with pytest.raises(ValueError, match="turns"):
        chat_sessions(2, 0)
    with pytest.raises(ValueError, match="think_time_s"):
        chat_sessions(2, 2, think_time_s=-1)


def test_chain_sessions_links_a_request_extending_an_earlier_ones_prompt():
    ids = [
        [0, 1, 2],  # 1100 tokens: two full 512-token blocks, then a partial one
        [0, 7],  # only the shared first block: no link
        [0, 1, 3, 4, 5],  # extends request 0's full blocks: its next turn
        [0, 1, 6, 8],  # request 0's second successor: not in its session
        [0, 1, 3, 4, 5, 9],  # extends request 2's
    ]
    t = Trace(
        "m",
        [0.0, 5.0, 10.0, 20.0, 30.0],
        [1100, 600, 2400, 1800, 2700],
        [600, 10, 100, 10, 10],
        [np.array(i) for i in ids],
        512,
    )
    s = chain_sessions(t)
    assert s.session.tolist() == [0, -1, 0, -1, 0]
    assert s.think_time_s.tolist() == [0.0, 0.0, 10.0, 0.0, 20.0]
    assert s.hash_ids[0].tolist() == [0, 1, 3]  # grown over its answer: (1100 + 600) // 512 blocks
    assert s.hash_ids[1].tolist() == [0]  # full blocks only: 600 tokens hold one
    assert s.hash_ids[4].tolist() == [0, 1, 3, 4, 5]
    with pytest.raises(ValueError, match="block ids"):
        chain_sessions(Trace("n", [0.0], [5], [1]))
