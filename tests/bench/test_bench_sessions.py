"""`fluidpd bench --sessions`: prompts from block ids (equal ids, equal text), later turns as history +
the actual answer + new input, lengths scaled to the context, the closed loop's timing on a fake clock,
and usage (cached tokens) read from the stream."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json

import numpy as np
import pytest

from fluidpd.bench.corpus import load_corpus
from fluidpd.bench.loadgen.closed_loop import TurnResult, replay_sessions
from fluidpd.bench.loadgen.requests import BenchResult
from fluidpd.bench.loadgen.sessions import CONTEXT_FILL, SessionPlan, Turn, plan_sessions, template_tokens
from fluidpd.bench.loadgen.words import WordSource
from fluidpd.workload.sessions import chat_sessions
from fluidpd.workload.trace import Trace


@pytest.fixture(scope="module")
def words() -> WordSource:
    return WordSource(load_corpus(), tokens_per_word=1.0)


def test_equal_keys_give_equal_text_of_plain_words(words):
    a, b, c = words.chunk(("block", 0, 7), 40), words.chunk(("block", 0, 7), 40), words.chunk(("block", 0, 8), 40)
    assert a == b and a != c
    assert len(a.split()) == 40 and all(w.isalpha() for w in a.split())
    assert words.word_count(0) == 0 and words.word_count(0.2) == 1 and WordSource("x " * 200, 2.0).word_count(64) == 32


def _trace(ids: list[list[int]], sessions: list[int], prompt: list[int], output: list[int], think=None) -> Trace:
    n = len(ids)
    return Trace(
        "t",
        np.arange(n, dtype=float),
        np.array(prompt),
        np.array(output),
        [np.array(x) for x in ids],
        4,
        None,
        np.array(sessions),
        np.array(think if think is not None else [0.0] * n),
    )


def test_opening_turns_share_text_where_they_share_block_ids(words):
    # sessions 0 and 1 open with blocks 1, 2 then differ; session 2 shares block 1 only with them
    trace = _trace([[1, 2, 10], [1, 2, 20], [1, 3, 30]], [0, 1, 2], [14, 14, 14], [2, 2, 2])
    plan = plan_sessions(trace, words, None)
    opening = [s[0].messages for s in plan.sessions]
    assert [m["role"] for m in opening[0]] == ["system", "user"]
    assert opening[0][0] == opening[1][0]  # blocks 1, 2: the same system message, byte for byte
    assert opening[2][0]["content"] == words.chunk(("block", 0, 1), 4) != opening[0][0]["content"]
    assert opening[0][0]["content"] == " ".join(words.chunk(("block", 0, b), 4) for b in (1, 2))
    assert opening[2][0]["content"] in opening[0][0]["content"]  # a shared prefix, as text
    user = [o[-1]["content"] for o in opening]
    assert len(set(user)) == 3
    assert user[0].startswith(words.chunk(("block", 0, 10), 4))  # the unshared block, then the tail
    assert len(user[0].split()) == 4 + 2  # block 10 (4 tokens) and the 2 tokens past the last full block
    assert plan.shared_blocks == 2 and plan.scale == 1.0


def test_later_turns_add_the_new_input_only(words):
    trace = chat_sessions(3, 3, system_tokens=64, new_tokens=16, output_tokens=8, think_time_s=1.0, block=16, seed=1)
    plan = plan_sessions(trace, words, max_model_len=None)
    assert plan.n_turns == 9 and plan.dropped_turns == 0
    systems = {s[0].messages[0]["content"] for s in plan.sessions}
    assert len(systems) == 1 and len(next(iter(systems)).split()) == 64
    for s in plan.sessions:
        assert [t.turn for t in s] == [0, 1, 2]
        assert s[0].think_s == 0.0 and s[1].think_s > 0
        for t in s[1:]:
            assert len(t.messages) == 1 and t.messages[0]["role"] == "user"
            assert len(t.messages[0]["content"].split()) == 16
            assert t.max_tokens == 8
    news = [t.messages[0]["content"] for s in plan.sessions for t in s[1:]]
    assert len(set(news)) == len(news)


def test_lengths_scale_to_the_served_context(words):
    trace = chat_sessions(2, 4, system_tokens=400, new_tokens=100, output_tokens=50, block=16)
    longest = 400 + 4 * 150
    plan = plan_sessions(trace, words, max_model_len=512)
    assert plan.scale == pytest.approx((CONTEXT_FILL * 512 - template_tokens(3)) / longest)  # the last turn
    assert plan.dropped_turns == 0
    last = plan.sessions[0][-1]
    assert last.prompt_tokens + last.max_tokens + template_tokens(3) <= CONTEXT_FILL * 512 + 1
    system = plan.sessions[0][0].messages[0]["content"]
    assert len(system.split()) == pytest.approx(400 * plan.scale, abs=1)
    assert plan.sessions[0][0].messages[0] == plan.sessions[1][0].messages[0]  # still shared when scaled
    bigger = plan_sessions(trace, words, max_model_len=512, context_scale=0.5)
    assert bigger.dropped_turns == 2 * 2  # turns 3 and 4 of each session pass the context at 0.5
    assert [len(s) for s in bigger.sessions] == [2, 2] and bigger.notes
    assert plan_sessions(trace, words, max_model_len=512, n_sessions=1).n_turns == 4


class FakeClock:
    """Virtual time: a sleep resolves when every task is waiting and it is the earliest wake-up."""

    def __init__(self) -> None:
        self.t = 0.0
        self.waiters: list = []
        self.seq = itertools.count()

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self.waiters, (self.t + max(seconds, 0.0), next(self.seq), fut))
        await fut

    async def run(self, coro):
        task = asyncio.ensure_future(coro)
        while not task.done():
            for _ in range(50):  # let every runnable task reach its next wait
                await asyncio.sleep(0)
            if self.waiters and not task.done():
                self.t, _, fut = heapq.heappop(self.waiters)
                fut.set_result(None)
        return task.result()


def _turn(session: int, k: int, start: float, think: float) -> Turn:
    msgs = [{"role": "system", "content": f"sys{session}"}, {"role": "user", "content": f"q{session}.0"}]
    return Turn(
        10 * session + k,
        session,
        k,
        start,
        think,
        msgs if k == 0 else [msgs[1] | {"content": f"q{session}.{k}"}],
        4,
        10,
    )


def test_each_turn_is_sent_its_think_time_after_the_previous_answer():
    clock = FakeClock()
    service = {(0, 0): 2.0, (0, 1): 3.0, (0, 2): 1.0, (1, 0): 0.5, (1, 1): 0.5}
    plan = SessionPlan(
        [
            [_turn(0, 0, 1.0, 0), _turn(0, 1, 1.0, 5.0), _turn(0, 2, 1.0, 0.25)],
            [_turn(1, 0, 4.0, 0), _turn(1, 1, 4.0, 2.0)],
        ],
        1.0,
    )
    sent: dict[tuple[int, int], tuple[float, list]] = {}

    async def send(turn: Turn, messages: list[dict]) -> TurnResult:
        sent[(turn.session, turn.turn)] = (clock.now(), messages)
        await clock.sleep(service[(turn.session, turn.turn)])
        res = BenchResult(turn.index, 10, 4, send_s=0.0, token_s=[clock.now()], finish_reason="length")
        return TurnResult(turn.session, turn.turn, res, answer=f"a{turn.session}.{turn.turn}")

    results = asyncio.run(clock.run(replay_sessions(plan, send, clock, progress=False)))
    times = {k: v[0] for k, v in sent.items()}
    # session 0 starts at 1; answer at 3, think 5 -> 8; answer at 11, think 0.25 -> 11.25
    assert times == {(0, 0): 1.0, (0, 1): 8.0, (0, 2): 11.25, (1, 0): 4.0, (1, 1): 6.5}
    assert sent[(0, 2)][1] == [
        {"role": "system", "content": "sys0"},
        {"role": "user", "content": "q0.0"},
        {"role": "assistant", "content": "a0.0"},
        {"role": "user", "content": "q0.1"},
        {"role": "assistant", "content": "a0.1"},
        {"role": "user", "content": "q0.2"},
    ]
    assert [(r.session, r.turn) for r in results] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]


def test_a_failed_turn_ends_its_session():
    clock = FakeClock()
    plan = SessionPlan([[_turn(0, k, 0.0, 1.0) for k in range(3)]], 1.0)
    calls = []

    async def send(turn: Turn, messages: list[dict]) -> TurnResult:
        calls.append(turn.turn)
        res = BenchResult(turn.index, 10, 4, send_s=0.0, error="HTTP 500: boom")
        return TurnResult(turn.session, turn.turn, res)

    results = asyncio.run(clock.run(replay_sessions(plan, send, clock, progress=False)))
    assert calls == [0]
    assert [r.result.error for r in results][1:] == ["not sent: turn 1 of its session failed"] * 2


def test_chat_chunks_and_usage_are_read_with_or_without_cached_tokens():
    from fluidpd.bench.loadgen.client import _record
    from fluidpd.bench.loadgen.turns import hit_rate

    def chunk(content=None, finish=None, usage=None):
        choices = (
            [] if content is None and finish is None else [{"delta": {"content": content}, "finish_reason": finish}]
        )
        return json.dumps({"choices": choices, "usage": usage})

    res, text = BenchResult(0, 0, 3), []
    for i, piece in enumerate(["Hel", "lo", "!"]):
        assert _record(chunk(piece, "length" if i == 2 else None), float(i), res, text)
    _record(
        chunk(usage={"prompt_tokens": 100, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 64}}),
        3.0,
        res,
        text,
    )
    assert "".join(text) == "Hello!" and res.token_s == [0.0, 1.0, 2.0] and res.finish_reason == "length"
    assert (res.usage_prompt_tokens, res.cached_tokens) == (100, 64)
    plain = BenchResult(1, 0, 1)
    _record(chunk("x", "stop"), 0.5, plain)
    _record(chunk(usage={"prompt_tokens": 60, "completion_tokens": 1}), 0.6, plain)  # no details: nothing cached
    nulls = BenchResult(2, 0, 1)
    _record(chunk("y", "stop"), 0.5, nulls)
    _record(chunk(usage={"prompt_tokens": 40, "completion_tokens": 1, "prompt_tokens_details": None}), 0.6, nulls)
    assert plain.cached_tokens == 0 and nulls.cached_tokens == 0
    assert hit_rate([res, plain, nulls]) == pytest.approx(64 / 200)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sessions", "azure_conv"], "carries no sessions; these do: chat, claude_code"),
        (["--sessions", "chat", "--n-sessions", "0"], "n_sessions must be >= 1"),
        (["--sessions", "chat", "--context-scale", "0"], "context_scale must be > 0"),
        (["--sessions", "chat", "--trace", "azure_conv"], "not allowed with"),
    ],
)
def test_bad_session_arguments_exit_2_with_a_message(args, message, capsys):
    from fluidpd.cli import main

    base = ["bench", "--url", "http://127.0.0.1:9", "--ttft-slo", "1", "--tbt-slo", "1", "--no-progress"]
    try:
        rc = main(base + args)
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    assert rc == 2
    assert message in capsys.readouterr().err
