"""benchmarks/simulation/sim_host_tier.py on a short Mooncake window: the hit rate split by tier adds up, a host
tier turns misses into host hits, and nothing passes the oracle."""

from benchscript import load

from fluidpd.bench.experiments.kv.setting import WORKLOADS


def _script():
    return load("sim_host_tier")


def test_a_host_tier_adds_host_hits_below_the_oracle():
    script = _script()
    _, trace, _ = WORKLOADS["mooncake_conv"].windows(script.LOAD, 120.0, 0)
    none, tier = script.run(trace, 0.0, False), script.run(trace, 64.0, True)
    assert none["host_hit"] == 0 and none["loaded_blocks"] == 0
    assert tier["host_hit"] > 0 and tier["loaded_blocks"] > 0
    for r in (none, tier):
        assert abs(r["device_hit"] + r["host_hit"] - r["hit"]) < 1e-12
        assert 0 < r["hit"] <= r["oracle"] + 1e-9
