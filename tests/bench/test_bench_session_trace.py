"""A served session replay as a simulator trace (benchmarks/simulation/prefix_cache_fidelity.py): prompts rebuilt
from the messages sent, answers' ids, block hashes of prompt + answer, sessions and think times."""

from __future__ import annotations

import numpy as np
import pytest

from fluidpd.bench.loadgen.closed_loop import TurnResult
from fluidpd.bench.loadgen.requests import BenchResult
from fluidpd.bench.loadgen.session_trace import common_prefix, replay_trace
from fluidpd.core.blockhash import block_hashes
from fluidpd.workload.blockmap import oracle_hits

ROLE = {"system": 1, "user": 2, "assistant": 3}


def encode(messages: list[dict[str, str]]) -> list[int]:
    """A chat template: each message its role's id then its characters, then the assistant's turn."""
    return [i for m in messages for i in (ROLE[m["role"]], *map(ord, m["content"]))] + [ROLE["assistant"]]


def turn(session: int, k: int, messages, answer: str, send_s: float, finish_s: float, usage=None) -> TurnResult:
    res = BenchResult(0, 0, len(answer), send_s=send_s, finish_s=finish_s, finish_reason="length")
    res.token_s = [finish_s] * len(answer)
    res.output_ids = [ord(c) for c in answer]
    res.usage_prompt_tokens = len(encode(messages)) if usage is None else usage
    return TurnResult(session, k, res, answer, messages)


def sessions() -> list[TurnResult]:
    system = {"role": "system", "content": "s" * 40}
    a0 = [system, {"role": "user", "content": "q" * 10}]
    a1 = [*a0, {"role": "assistant", "content": "A" * 20}, {"role": "user", "content": "r" * 12}]
    b0 = [system, {"role": "user", "content": "p" * 9}]
    return [
        turn(0, 0, a0, "A" * 20, 2.0, 3.0),
        turn(0, 1, a1, "B" * 7, 3.5, 4.0),
        turn(1, 0, b0, "C" * 5, 2.5, 3.2, usage=60),  # the server counted otherwise
    ]


def test_prompts_answers_and_hashes_follow_what_was_sent():
    rt = replay_trace(sessions(), encode, block=16)
    tr = rt.trace
    assert [(t.session, t.turn) for t in rt.turns] == [(0, 0), (1, 0), (0, 1)]  # by send time
    assert tr.arrival_s.tolist() == [0.0, 0.5, 1.5]
    p = [len(encode(t.messages)) for t in rt.turns]
    assert tr.prompt_len.tolist() == p == [53, 52, 87]
    assert tr.output_len.tolist() == [20, 5, 7]
    assert tr.hash_block_size == 16 and tr.session.tolist() == [0, 1, 0]
    for t, ids, h in zip(rt.turns, rt.prompt_ids, tr.hash_ids):
        assert ids == encode(t.messages)
        assert h.tolist() == block_hashes(ids + t.result.output_ids, 16)  # prompt, then answer
    assert len(tr.hash_ids[0]) == (53 + 20) // 16 == 4
    # the second turn's prompt starts with the first turn's prompt and answer, token for token
    assert rt.history_match == [0, 0, 73]
    assert tr.hash_ids[2][:4].tolist() == tr.hash_ids[0].tolist()
    # the two sessions share the system prompt's full blocks (41 tokens: its role id and 40 characters)
    assert tr.hash_ids[1][:2].tolist() == tr.hash_ids[0][:2].tolist() and tr.hash_ids[1][2] != tr.hash_ids[0][2]
    assert tr.think_time_s.tolist() == [0.0, 0.0, 0.5]  # the second turn's send less the first's finish
    assert rt.mismatches == [(1, 0, 52, 60)]


def test_oracle_of_the_replay_counts_the_history_blocks():
    tr = replay_trace(sessions(), encode, block=16).trace
    hits, prompt = oracle_hits(tr, 16)
    assert prompt == 53 + 52 + 87
    assert hits == 2 * 16 + 4 * 16  # session 1 reuses 2 system blocks; turn 2 its session's 4 (of 73 tokens)


def test_failed_or_unrecorded_turns_are_left_out():
    rs = sessions()
    rs[2].result.error = "HTTP 500"
    rs[1].messages = None
    rt = replay_trace(rs, encode)
    assert len(rt.trace) == 1 and rt.skipped == 2
    with pytest.raises(ValueError, match="no completed turn"):
        replay_trace(rs[1:], encode)


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2 and common_prefix([], [1]) == 0
    assert np.array_equal(np.array([common_prefix([7], [7])]), np.array([1]))
