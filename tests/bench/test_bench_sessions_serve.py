"""`fluidpd bench --sessions chat` against the real server (SmolLM2 on CPU, one in-process worker):
every turn answered, each later turn's prompt exactly the history + the model's actual answer + the
new input (token counts checked by the server's own /tokenize), the opening system prompt a shared
token prefix, the server's cached_tokens read (the second turn hits the first's blocks), JSON and PNG
written."""

from __future__ import annotations

import json

import httpx
import pytest

from fluidpd.cli import main

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

pytestmark = pytest.mark.slow
SYSTEM, NEW, OUT = 96, 24, 8


def _tokens(url: str, messages: list[dict]) -> list[int]:
    r = httpx.post(url + "/tokenize", json={"messages": messages}, trust_env=False, timeout=60)
    r.raise_for_status()
    return r.json()["tokens"]


def test_sessions_replay_against_the_real_server(served, tmp_path):
    server = served.url
    out = tmp_path / "sessions.json"
    args = ["bench", "--url", server, "--sessions", "chat", "--n-sessions", "2", "--turns", "2"]
    args += ["--system-tokens", str(SYSTEM), "--new-tokens", str(NEW), "--output-tokens", str(OUT)]
    args += ["--think-time", "0.2", "--ttft-slo", "30", "--tbt-slo", "5", "--out", str(out), "--no-progress"]
    assert main(args) == 0
    data = json.loads(out.read_text())
    row, turns = data["summary"], data["turns"]
    assert (row["requests"], row["completed"], row["failed"], row["sessions"]) == (4, 4, 0, 2)
    assert [t["turn"] for t in data["by_turn"]] == [1, 2]
    assert row["max_model_len"] == 512 and row["context_scale"] == 1.0
    for t in turns:
        assert t["completion_tokens"] == OUT and t["answer"] and t["ttft_s"] > 0
        assert 0 <= t["cached_tokens"] <= t["prompt_tokens"]
    assert out.with_suffix(".png").stat().st_size > 0

    # rebuild what was sent: the plan at the run's measured tokens per word, the actual answers
    from fluidpd.bench.corpus import load_corpus
    from fluidpd.bench.loadgen.sessions import plan_sessions
    from fluidpd.bench.loadgen.words import WordSource
    from fluidpd.workload.sessions import chat_sessions

    trace = chat_sessions(2, 2, SYSTEM, NEW, OUT, 0.2)
    plan = plan_sessions(trace, WordSource(load_corpus(), row["tokens_per_word"]), 512)
    by = {(t["session"], t["turn"]): t for t in turns}
    opening = [_tokens(server, s[0].messages) for s in plan.sessions]
    common = next((i for i, (a, b) in enumerate(zip(*opening)) if a != b), 0)
    assert common >= 0.8 * SYSTEM  # the shared system prompt tokenises to a shared prefix
    for s, session in enumerate(plan.sessions):
        first, second = by[(s, 1)], by[(s, 2)]
        assert first["prompt_tokens"] == len(opening[s])
        history = [*session[0].messages, {"role": "assistant", "content": first["answer"]}, *session[1].messages]
        assert second["prompt_tokens"] == len(_tokens(server, history))
        assert second["prompt_tokens"] > first["prompt_tokens"] + OUT + NEW // 2
        # the server caches by default: the second turn reuses at least the first turn's full blocks
        assert second["cached_tokens"] >= (first["prompt_tokens"] // 16) * 16 - 16
