"""Request groups (n > 1) in the simulator: one prefill per group, n decode sequences, KV per sequence."""

from __future__ import annotations

import pytest
from simhelp import cluster, setup_8b

from fluidpd.workload.synth import synthetic

N = 4


def group_trace(n=120, rate=20.0, samples=N, seed=1):
    return synthetic(
        n, rate, prompt_len=("uniform", 64, 2048), output_len=("uniform", 2, 200), seed=seed, samples=samples
    )


def _counting(c):
    """Count the prefill tokens every step computes, and the largest decode batch in rows and requests."""
    seen = {"prefill": 0, "rows": 0, "requests": 0}
    execute = c.execute

    def counted(w, plan, shape):
        seen["prefill"] += sum(n for _, n in plan.chunks)
        if plan.decode and w.decode_rows > seen["rows"]:
            seen["rows"], seen["requests"] = w.decode_rows, len(w.decoding)
        execute(w, plan, shape)

    c.execute = counted
    return seen


@pytest.mark.parametrize("policy", ["colocated", "static-pd"])
def test_a_group_is_prefilled_once_and_decodes_n_sequences(policy):
    t = group_trace()
    assert (t.n == N).all()
    c = cluster(t, policy, setup_8b())
    seen = _counting(c)
    c.run()
    assert c.metrics.completed == len(t)
    assert seen["prefill"] == int(t.prompt_len.sum())  # one prefill per group (no preemption here)
    assert sum(w.tokens_out for w in c.workers) == N * int(t.output_len.sum())  # every sequence to its length
    assert seen["rows"] == N * seen["requests"] > 0  # the batch counts sequences
    for w in c.workers:
        assert w.kv_blocks_used == 0 and not w.decoding and w.decode_rows == 0 and w.decode_ctx_sum == 0
    assert all(r.generated == r.output_len and r.live == N for r in c.metrics.finished)


def test_groups_under_preemption_lose_nothing_and_free_their_kv():
    c = cluster(group_trace(n=80, rate=50.0), "colocated", setup_8b(), kv_blocks=400)
    c.run()
    assert sum(w.preemptions for w in c.workers) > 0
    assert c.metrics.completed == 80
    assert all(w.kv_blocks_used == 0 and w.decode_rows == 0 for w in c.workers)


def test_a_trace_without_groups_is_unchanged():
    plain = synthetic(50, 10.0, seed=3)
    ones = synthetic(50, 10.0, seed=3, samples=1)
    assert ones.n is None
    assert (plain.prompt_len == ones.prompt_len).all() and (plain.output_len == ones.output_len).all()


def test_a_window_of_a_group_trace_keeps_its_groups_and_grammars():
    t = synthetic(60, 10.0, seed=4, samples=("uniform", 1, 8), constrained=0.5)
    w = t.window(1.0, 3.0)
    lo = int((t.arrival_s < 1.0).sum())
    assert (w.n == t.n[lo : lo + len(w)]).all() and (w.constrained == t.constrained[lo : lo + len(w)]).all()
    assert 0 < t.constrained.sum() < len(t)


def test_constrained_decodes_pay_for_their_grammar_mask():
    """The simulator prices each masked row (LatencyConfig.grammar_mask_s) in the steps it decodes in."""
    t = group_trace(n=60, rate=10.0, samples=2)
    masked = synthetic(
        60, 10.0, prompt_len=("uniform", 64, 2048), output_len=("uniform", 2, 200), seed=1, samples=2, constrained=1.0
    )
    assert (masked.prompt_len == t.prompt_len).all() and masked.constrained.all()
    shapes = {"plain": [], "masked": []}
    for name, trace in (("plain", t), ("masked", masked)):
        c = cluster(trace, "colocated", setup_8b())
        execute = c.execute

        def seen(w, plan, shape, name=name, execute=execute):
            if plan.decode:
                shapes[name].append((shape.masked_rows, shape.decode_tokens))
            execute(w, plan, shape)

        c.execute = seen
        c.run()
        assert c.metrics.completed == 60
    assert all(m == 0 for m, _ in shapes["plain"])
    assert all(m == d for m, d in shapes["masked"]) and shapes["masked"]
