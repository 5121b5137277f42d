"""End-to-end behaviour of the simulated cluster under the baseline policies."""

import math

import numpy as np
import pytest
from simhelp import cluster, setup_8b, trace, with_policy

from fluidpd.latency.shape import StepShape
from fluidpd.policy.view import Role
from fluidpd.sim.run import simulate
from fluidpd.workload.synth import synthetic

POLICIES = ["colocated", "chunked", "static-pd"]


def small_trace(n=300, rate=20.0, seed=1):
    return synthetic(n, rate, prompt_len=("uniform", 64, 2048), output_len=("uniform", 2, 200), seed=seed)


def assert_clean(c):
    """Every request finished with exactly its tokens, and no KV block is left allocated."""
    assert c.outstanding == 0
    for w in c.workers:
        assert w.kv_blocks_used == 0, f"worker {w.id} leaks KV blocks"
        assert not w.queue and not w.decoding and not w.held and not w.pulls and not w.incoming
        assert w.num_prefilling == 0
    for req in c.metrics.finished:
        assert req.generated == req.output_len
        assert req.first_token_s >= req.arrival_s and req.finish_s >= req.first_token_s
        assert req.gaps == req.output_len - 1


@pytest.mark.parametrize("policy", POLICIES)
def test_every_request_completes_with_its_tokens_and_frees_its_kv(policy):
    c = cluster(small_trace(), policy, setup_8b())
    c.run()
    assert c.metrics.completed == 300
    assert_clean(c)


@pytest.mark.parametrize("policy", POLICIES)
def test_tiny_kv_forces_preemption_and_nothing_is_lost(policy):
    c = cluster(small_trace(n=120, rate=50.0), policy, setup_8b(), kv_blocks=400)
    c.run()
    assert sum(w.preemptions for w in c.workers) > 0
    assert c.metrics.completed == 120
    assert_clean(c)


def test_same_seed_same_result_and_jitter_seed_changes_it():
    t = small_trace()
    runs = [simulate(t, "chunked", setup_8b(step_jitter_cv=0.1, seed=s)).summary for s in (3, 3, 4)]
    strip = [{k: v for k, v in r.items() if k != "sim_wall_s"} for r in runs]
    assert strip[0] == strip[1]
    assert strip[0] != strip[2]


def test_single_request_colocated_matches_the_latency_model():
    s = setup_8b(workers=1)
    c = cluster(trace([0.0], [1000], [5]), "colocated", s)
    c.run()
    (req,) = c.metrics.finished
    model = s.roofline()
    assert req.ttft_s == pytest.approx(model.prefill_time(1000))
    steps = [model.step_time(StepShape(decode_tokens=1, decode_ctx=1000 + k)) for k in range(1, 5)]
    assert req.finish_s == pytest.approx(model.prefill_time(1000) + sum(steps))
    assert req.tpot_s == pytest.approx(sum(steps) / 4)
    assert req.gaps == 4 and req.gaps_over == 0


@pytest.mark.parametrize("hold", [True, False])
def test_static_pd_hands_kv_over_the_link_and_prefill_workers_never_decode(hold):
    s = setup_8b(workers=2, hold_first_token=hold)
    c = cluster(trace([0.0], [4096], [3]), "static-pd", s)
    c.run()
    (req,) = c.metrics.finished
    model = s.roofline()
    prefill = model.prefill_time(4096)
    kv_bytes = 4096 * s.model.kv_bytes_per_token
    transfer = s.network().config.latency_s + kv_bytes / s.hardware.nvlink_bw_unidir
    step = model.step_time(StepShape(decode_tokens=1, decode_ctx=4097))
    if hold:  # the first token goes out with the decode worker's first step: the gap is one step
        assert req.ttft_s == pytest.approx(prefill + transfer)
        assert req.last_token_s - req.first_token_s == pytest.approx(2 * step, rel=1e-3)
    else:  # out at the end of prefill: the first gap spans the transfer and a step
        assert req.ttft_s == pytest.approx(prefill)
        assert req.last_token_s - req.first_token_s >= (transfer + step) * 0.999
    assert req.gaps == 2
    p, d = c.workers
    assert p.role is Role.PREFILL and d.role is Role.DECODE
    assert p.busy_s["decode"] == 0 and p.busy_s["mixed"] == 0
    assert d.busy_s["prefill"] == 0 and d.tokens_out == 2
    assert c.network.bytes_moved["handoff"] == pytest.approx(kv_bytes)


def test_static_pd_prefill_batches_fill_up_to_l_m():
    s = with_policy(setup_8b(workers=2, hold_first_token=False), prefill_batch_tokens=1000)  # TTFT = prefill end
    c = cluster(trace([0, 0, 0, 0], [400, 400, 400, 3000], [2] * 4), "static-pd", s)
    c.run()
    ttft = sorted(r.ttft_s for r in c.metrics.finished)
    model = s.roofline()
    # 400+400 fills the first batch, the third 400 runs next, the long prompt runs alone.
    assert ttft[0] == pytest.approx(ttft[1])
    assert ttft[2] > ttft[1]
    assert c.workers[0].steps == 3
    assert ttft[-1] > model.prefill_time(3000)


def test_a_request_that_can_never_fit_is_rejected_not_lost():
    c = cluster(trace([0.0, 0.1], [100, 50_000], [4, 4]), "colocated", setup_8b(workers=1), kv_blocks=100)
    c.run()
    assert c.metrics.completed == 1 and c.metrics.rejected == 1 and c.outstanding == 0
    s = c.metrics.summary(2)
    assert s["attainment"] <= 0.5


def test_prefill_interference_hurts_colocated_tbt_but_not_static_pd():
    """DistServe's observation: a colocated prefill stalls decodes; disaggregation removes it."""
    t = synthetic(400, 8.0, prompt_len=("uniform", 2000, 4000), output_len=("uniform", 50, 150), seed=5)
    co = simulate(t, "colocated", setup_8b(workers=4)).summary
    pd = simulate(t, "static-pd", setup_8b(workers=4)).summary
    assert co["tbt_p99_s"] > 2 * pd["tbt_p99_s"]


def test_summary_keys_and_sane_values():
    r = simulate(small_trace(), "static-pd", setup_8b())
    for key in ("policy",):
        assert key in r.row()
    s = r.summary
    for key in (
        "requests",
        "completed",
        "attainment",
        "strict_attainment",
        "ttft_p50_s",
        "ttft_p99_s",
        "tbt_p50_s",
        "tbt_p99_s",
        "tpot_mean_s",
        "throughput_tok_s",
        "sim_wall_s",
    ):
        assert key in s and not (isinstance(s[key], float) and math.isnan(s[key]))
    assert 0 <= s["strict_attainment"] <= 1 and 0 <= s["attainment"] <= 1
    assert s["ttft_p99_s"] >= s["ttft_p50_s"] and s["tbt_p99_s"] >= s["tbt_p50_s"]
    tl = r.cluster.timeline
    assert len(tl.t) > 5 and np.asarray(tl.kv_use).max() <= 1.0
