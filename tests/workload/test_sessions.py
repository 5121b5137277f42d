import itertools

import numpy as np
import pytest

from fluidpd.workload.sessions import chat_sessions


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
