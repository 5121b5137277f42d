"""Per-request timelines in the simulator (`fluidpd simulate --trace-requests`): every phase a request
went through, consistent with the request's own accounting."""

from __future__ import annotations

from simhelp import cluster, setup_8b, trace, with_policy

from fluidpd.policy.fluidconfig import FluidConfig
from fluidpd.policy.view import Role
from fluidpd.sim.run import simulate
from fluidpd.world.events import EventKind
from fluidpd.world.trace import RequestTracer


def traced(tr, policy, setup):
    c = cluster(tr, policy, setup)
    got = {}
    c.tracer = RequestTracer(lambda t: got.__setitem__(t.request_id, t))
    return c, got


def test_a_handed_off_request_shows_every_phase_in_order():
    tr = trace([0.0, 0.01, 0.02, 0.5], [700, 300, 1500, 40], [30, 5, 12, 1])
    setup = setup_8b(2)
    c, got = traced(tr, "static-pd", setup)
    c.run()
    done = {r.id: r for r in c.metrics.finished}
    assert sorted(got) == sorted(done) == [0, 1, 2, 3]
    for rid, t in got.items():
        req = done[rid]
        assert t.kinds[0] == "arrival" and t.kinds[-1] == "finish" and t.finish_reason == "length"
        assert (t.finish_s, t.first_token_s, t.output_tokens) == (req.finish_s, req.first_token_s, req.output_len)
        chunks = [e for e in t.events if e.kind == "prefill_chunk"]
        assert sum(e.attrs["tokens"] for e in chunks) == req.prompt_len - req.cached_tokens
        assert all(e.worker == 0 and e.end_s > e.t_s for e in chunks)  # the prefill worker
        queued, admitted = (next(e for e in t.events if e.kind == k) for k in ("queued", "admitted"))
        assert queued.t_s == req.arrival_s and queued.end_s == admitted.t_s <= chunks[0].t_s
        if req.output_len == 1:  # done at its prefill: nothing moves, nothing decodes
            assert "kv_transfer" not in t.kinds and "decode" not in t.kinds
            continue
        (move,) = [e for e in t.events if e.kind == "kv_transfer"]
        assert move.attrs["class"] == "handoff" and (move.worker, move.attrs["to"]) == (0, 1)
        assert move.attrs["bytes"] == move.attrs["tokens"] * setup.model.kv_bytes_per_token > 0
        assert chunks[-1].end_s <= move.t_s < move.end_s
        (dec,) = [e for e in t.events if e.kind == "decode"]
        assert (dec.worker, dec.t_s, dec.end_s) == (1, max(move.end_s, req.first_token_s), req.finish_s)


def test_a_forced_role_switch_shows_in_the_timelines_of_the_requests_it_moved():
    n = 24
    tr = trace([0.05 * i for i in range(n)], [256] * n, [400] * n)
    setup = with_policy(setup_8b(3), prefill_workers=1)
    setup.fluid = FluidConfig(tau_persist_s=1e9)
    got = {}

    def before_run(c):
        c.tracer = RequestTracer(lambda t: got.__setitem__(t.request_id, t))
        c.loop.at(1.5, EventKind.CONTROL, lambda _: c.policy.force_role(2, Role.PREFILL, c))

    c = simulate(tr, "fluidpd", setup, before_run=before_run).cluster
    assert len(got) == n and c.workers[2].role is Role.PREFILL
    moved = [t for t in got.values() if "role_switch" in t.kinds]
    assert moved, "no request lived through the switch"
    for t in moved:
        (switch,) = [e for e in t.events if e.kind == "role_switch"]
        assert (switch.worker, switch.attrs["from"], switch.attrs["to"]) == (2, "decode", "prefill")
        migrations = [e for e in t.events if e.kind == "kv_transfer" and e.attrs["class"] == "migration"]
        if migrations:  # it was decoding on worker 2: its KV went to a peer, where it decoded on
            (m,) = migrations
            assert m.worker == 2 and m.attrs["to"] != 2 and m.t_s >= switch.t_s
            decodes = [e for e in t.events if e.kind == "decode"]
            assert [d.worker for d in decodes] == [2, m.attrs["to"]]
            assert decodes[0].end_s == m.t_s and decodes[1].t_s == m.end_s
    assert any("kv_transfer" in t.kinds and "migration" in str(t.to_json()) for t in moved)
