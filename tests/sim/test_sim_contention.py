"""A host's workers sharing its cores: steps in flight slow each other down while they overlap."""

import pytest
from simhelp import setup_8b, trace

from fluidpd.core.metrics import MetricsCollector
from fluidpd.policy.registry import make_policy
from fluidpd.sim.cluster import SimCluster


def run(arrivals, outputs=None, finish: bool = False, **sim_kw):
    """Two colocated workers, every step 1 s of work, one-token requests (one prefill step each)
    unless `outputs` says otherwise; the sorted first-token (or with `finish`, finish) times."""
    setup = setup_8b(workers=2, **sim_kw)
    metrics = MetricsCollector(setup.slo, finished=[])
    c = SimCluster(
        trace(arrivals, [16] * len(arrivals), outputs or [1] * len(arrivals)),
        make_policy("colocated", setup.policy),
        lambda shape: 1.0,
        setup.model.kv_bytes_per_token,
        1000,
        setup.network(),
        metrics,
        setup.sim,
    )
    c.run()
    return sorted(r.finish_s if finish else r.first_token_s for r in metrics.finished)


def test_overlapping_steps_share_the_cores_while_they_overlap():
    # alone 0-0.5 s, then both at half speed: the first ends at 1.5 s; the second has done 0.5 s
    # of work by then and finishes alone at 2.0 s (a slowdown fixed at each step's start would
    # give 1.0 and 2.5)
    assert run([0.0, 0.5], contention_prefill=(1.0, 2.0)) == pytest.approx([1.5, 2.0])


def test_steps_apart_run_at_full_speed_and_no_contention_is_the_plain_path():
    assert run([0.0, 2.0], contention_prefill=(1.0, 2.0)) == pytest.approx([1.0, 3.0])
    assert run([0.0, 0.5]) == pytest.approx([1.0, 1.5])


def test_measured_noise_and_dispatch_overhead_add_to_each_step():
    assert run([0.0], step_noise_s=(0.25,), dispatch_prefill_s=0.1) == pytest.approx([1.35])
    # noise never shortens a step below half its modelled time
    assert run([0.0], step_noise_s=(-0.9,)) == pytest.approx([0.5])


def test_a_decode_step_among_prefills_uses_the_cross_kind_table():
    # A (2 tokens: a prefill, then a decode step) on worker 0, B (one prefill) on worker 1 from
    # 0.5 s to 1.5 s: A's decode step starts at 1.0 s beside B's prefill, at 1/3 speed (the cross
    # table) until 1.5 s, then alone: it ends at 1.5 + (1 - 0.5 / 3) s (at 1/2 speed: 2.25 s)
    flat = {"contention_prefill": (1.0, 1.0), "contention_prefill_cross": (1.0, 1.0)}
    kw = {**flat, "contention_decode": (1.0, 2.0), "contention_decode_cross": (1.0, 3.0)}
    finished = run([0.0, 0.5], outputs=[2, 1], finish=True, **kw)
    assert finished == pytest.approx([1.5, 1.5 + 1 - 0.5 / 3])
    del kw["contention_decode_cross"]
    assert run([0.0, 0.5], outputs=[2, 1], finish=True, **kw) == pytest.approx([1.5, 2.25])


def handoff(arrivals, outputs, **sim_kw):
    """1P:1D static-pd, every step 1 s, a request's KV 1 s over the link; the finish times."""
    from fluidpd.sim.network import Network, NetworkConfig

    setup = setup_8b(workers=2, hold_first_token=False, **sim_kw)
    kv = setup.model.kv_bytes_per_token
    metrics = MetricsCollector(setup.slo, finished=[])
    c = SimCluster(
        trace(arrivals, [16] * len(arrivals), outputs),
        make_policy("static-pd", setup.policy),
        lambda shape: 1.0,
        kv,
        1000,
        Network(NetworkConfig(intra_node_bw=16 * kv, inter_node_bw=16 * kv, latency_s=0.0)),
        metrics,
        setup.sim,
    )
    c.run()
    return sorted(r.finish_s for r in metrics.finished)


def test_a_cpu_handoff_holds_both_workers_for_their_share_of_the_copy():
    # Z (2 tokens): prefill 0-1 s on the prefill worker, KV 1-2 s, a decode step 2-3 s; B (1 token)
    # queued behind Z: its prefill 1-2 s, or 1-3 s when the prefill worker spends 1-2 s exporting
    assert handoff([0.0, 0.5], [2, 1]) == pytest.approx([2.0, 3.0])
    assert handoff([0.0, 0.5], [2, 1], kv_export_share=1.0) == pytest.approx([3.0, 3.0])
    # Z (4 tokens) decodes 2-3, 3-4, 4-5 s; A (2 tokens): prefill 1.5-2.5 s, KV 2.5-3.5 s, joins the
    # 4-5 s step. Importing A's KV on the decode worker (from 2.5 s, or from 3 s after a half
    # share exported) pushes its 3 s step to 4.5 s; Z's own import ran while it was idle
    assert handoff([0.0, 1.5], [4, 2]) == pytest.approx([5.0, 5.0])
    assert handoff([0.0, 1.5], [4, 2], kv_import_share=1.0) == pytest.approx([5.5, 5.5])
    assert handoff([0.0, 1.5], [4, 2], kv_export_share=0.5, kv_import_share=0.5) == pytest.approx([5.5, 5.5])
