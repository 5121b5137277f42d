"""Prefix caching as a client sees it: usage.prompt_tokens_details.cached_tokens, the Prometheus
counters per worker, the cluster view; and a cached answer equals the uncached one."""

from __future__ import annotations

import uuid

import httpx

from tests.server.serverhelp import metric


def _prompt() -> str:
    tag = uuid.uuid4().hex[:8]  # no earlier test sent this prompt: its first request cannot hit
    return f"Ticket {tag}. " + "The quick brown fox jumps over the lazy dog and runs far away. " * 12


def _block(served) -> int:
    return served.runtime.block_size


def test_a_repeated_prompt_reports_its_cached_tokens_and_the_same_answer(served, client, model):
    prompt = _prompt()
    before = httpx.get(served.url + "/metrics").text
    a = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0)
    b = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0)
    n, bs = a.usage.prompt_tokens, _block(served)
    assert a.usage.prompt_tokens_details.cached_tokens == 0
    assert b.usage.prompt_tokens_details.cached_tokens == (n - 1) // bs * bs > 0  # full blocks, not the last token
    assert b.choices[0].text == a.choices[0].text
    after = httpx.get(served.url + "/metrics").text
    hits = metric(after, "fluidpd:prefix_cache_hits_total") - metric(before, "fluidpd:prefix_cache_hits_total")
    queries = metric(after, "fluidpd:prefix_cache_queries_total") - metric(before, "fluidpd:prefix_cache_queries_total")
    assert hits == b.usage.prompt_tokens_details.cached_tokens
    assert queries == 2 * n
    assert 'worker="0"' in next(x for x in after.splitlines() if x.startswith("fluidpd:prefix_cache_hits_total"))


def test_streamed_usage_and_chat_report_cached_tokens(served, client, model):
    messages = [{"role": "system", "content": _prompt()}, {"role": "user", "content": "Say hi."}]
    first = client.chat.completions.create(model=model, messages=messages, max_tokens=4, temperature=0)
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=4,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    usage = chunks[-1].usage
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert usage.prompt_tokens == first.usage.prompt_tokens
    assert usage.prompt_tokens_details.cached_tokens == (usage.prompt_tokens - 1) // _block(served) * _block(served)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == first.choices[0].message.content


def test_the_cluster_view_shows_each_workers_cache(served, client, model):
    def view() -> dict:
        (w,) = httpx.get(served.url + "/v1/admin/cluster").json()["workers"]
        return w["prefix_cache"]

    prompt, before = _prompt(), view()
    for _ in range(2):
        r = client.completions.create(model=model, prompt=prompt, max_tokens=2, temperature=0)
    cache = view()
    hit = r.usage.prompt_tokens_details.cached_tokens
    assert hit > 0 and cache["hits"] - before["hits"] == hit
    assert cache["cached_blocks"] >= hit // _block(served)  # the prompt's blocks stay cached
    assert 0 < cache["hit_rate"] < 1 and cache["hits"] <= cache["queries"]
    assert cache["corrections"] == before["corrections"]  # the coordinator's view matched the engine's
