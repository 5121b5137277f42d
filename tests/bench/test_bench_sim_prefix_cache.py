"""benchmarks/simulation/sim_prefix_cache.py's routing bound on a few simulated Claude Code sessions (the script's
infinite cache must keep following PrefixCache's interface: it failed once when release gained a flag)."""

from benchscript import load

from fluidpd.workload.claude_code import load_claude_code


def _script():
    return load("sim_prefix_cache")


def test_the_routing_bound_lies_between_the_hit_rate_and_the_oracle_for_every_kind_of_policy():
    script = _script()
    trace = load_claude_code(with_hashes=True, sessions=True, concurrency=4).window(3600, 120)
    for policy in ("chunked", "fluidpd"):  # fluidpd follows the KV: releases demote the source copy
        row = script.run(trace, policy, True)
        assert row["completed"] == len(trace)
        assert 0 < row["hit"] <= row["routing_bound"] + 1e-9 <= row["oracle"] + 2e-9
