from collections import Counter

import numpy as np
import pytest

from fluidpd.core.blockhash import block_hashes
from fluidpd.workload import load_trace
from fluidpd.workload.blockmap import oracle_hits
from fluidpd.workload.hot_prefix import VOCAB, hot_prefix, zipf_shares

SMALL = {"prefix_tokens": 100, "suffix_tokens": 40, "output_tokens": 8}  # 6 full prefix blocks, 8 in all


def shared_run(a, b) -> int:
    """Leading block hashes two requests have in common."""
    n = 0
    for x, y in zip(a.tolist(), b.tolist()):
        if x != y:
            break
        n += 1
    return n


def test_the_same_seed_gives_the_same_trace_and_another_seed_another():
    a, b, c = (hot_prefix(60.0, 5.0, seed=s) for s in (3, 3, 4))
    for x, y in ((a.arrival_s, b.arrival_s), (a.prompt_len, b.prompt_len), (a.output_len, b.output_len)):
        np.testing.assert_array_equal(x, y)
    assert all(np.array_equal(x, y) for x, y in zip(a.hash_ids, b.hash_ids))
    assert not np.array_equal(a.arrival_s, c.arrival_s)
    assert {h[0] for h in a.hash_ids}.isdisjoint({h[0] for h in c.hash_ids})  # other prefixes' tokens


@pytest.mark.parametrize("prefix", [100, 96])  # the prefix's end inside a block, and on a block boundary
def test_requests_of_one_prefix_share_exactly_its_full_blocks(prefix):
    t = hot_prefix(30.0, 10.0, n_prefixes=3, **{**SMALL, "prefix_tokens": prefix}, seed=1)
    assert t.hash_block_size == 16 and (t.prompt_len == prefix + 40).all()
    assert all(len(h) == (prefix + 40) // 16 for h in t.hash_ids)
    groups: dict[int, list] = {}
    for h in t.hash_ids:
        groups.setdefault(int(h[0]), []).append(h)
    assert len(groups) == 3
    for members in groups.values():
        assert all(shared_run(members[0], m) == prefix // 16 for m in members[1:])
    others = [h for g in groups.values() for h in g]
    assert all(shared_run(a, b) == 0 for a in groups[next(iter(groups))] for b in others if int(b[0]) != int(a[0]))
    count = Counter(x for h in t.hash_ids for x in h[prefix // 16 :].tolist())
    assert max(count.values()) == 1  # every block past the prefix's full ones is one request's own


def test_under_the_default_lengths_each_prefix_is_one_shared_run_of_its_length():
    t = hot_prefix(60.0, 8.0, seed=2)
    assert all(len(h) == p // 16 for h, p in zip(t.hash_ids, t.prompt_len.tolist()))  # its full prompt blocks
    groups: dict[int, list] = {}
    for h in t.hash_ids:
        groups.setdefault(int(h[0]), []).append(h)
    assert len(groups) >= 8
    for members in groups.values():
        runs = {shared_run(members[0], m) for m in members[1:]}
        assert len(runs) <= 1 and all(2048 // 16 <= r <= 4096 // 16 for r in runs)


def test_the_prefix_blocks_are_the_chained_hashes_of_the_prefix_tokens():
    t = hot_prefix(20.0, 5.0, n_prefixes=1, **SMALL, seed=0)
    tokens = np.random.default_rng(0).integers(0, VOCAB, 100).tolist()  # the first draw: the prefix
    assert all(h[:6].tolist() == block_hashes(tokens, 16) for h in t.hash_ids)


def test_zipf_shares_are_skewed_as_configured():
    s = zipf_shares(16, 1.1)
    assert s.sum() == pytest.approx(1.0) and (np.diff(s) < 0).all()
    assert s[0] == pytest.approx(1 / sum(k**-1.1 for k in range(1, 17)))
    assert s[0] / s[1] == pytest.approx(2**1.1)
    np.testing.assert_allclose(zipf_shares(4, 0.0), 0.25)
    t = hot_prefix(200.0, 50.0, n_prefixes=4, zipf_s=1.5, prefix_tokens=32, suffix_tokens=16, output_tokens=1, seed=5)
    firsts = [int(h[0]) for h in t.hash_ids]
    ranked = [n for _, n in Counter(firsts).most_common()]
    observed = np.array(ranked) / len(firsts)
    np.testing.assert_allclose(observed, zipf_shares(4, 1.5), atol=0.02)


def test_the_defaults_reuse_most_prompt_tokens():
    t = load_trace("hot_prefix", seed=0)
    assert t.name == "hot_prefix" and t.duration_s == 600.0 and t.mean_rate == pytest.approx(16.0, rel=0.05)
    hits, prompt = oracle_hits(t, 16)
    assert hits / prompt > 0.8
    assert load_trace("hot_prefix", rate=4.0, seed=1, duration_s=100.0).mean_rate == pytest.approx(4.0, rel=0.2)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"duration_s": 0.0}, "duration_s > 0"),
        ({"duration_s": float("inf")}, "duration_s > 0"),
        ({"rate": 0.0}, "arrival rate"),
        ({"n_prefixes": 0}, "n >= 1 ranks"),
        ({"n_prefixes": 2.5}, "n >= 1 ranks"),
        ({"zipf_s": -1.0}, "zipf exponent"),
        ({"zipf_s": float("nan")}, "zipf exponent"),
        ({"block_size": 0}, "block_size >= 1"),
        ({"prefix_tokens": 0}, "constant length"),
        ({"suffix_tokens": ("normal", 1, 2)}, "length spec"),
    ],
)
def test_bad_arguments_are_clear_errors(kw, message):
    with pytest.raises(ValueError, match=message):
        hot_prefix(**{"duration_s": 10.0, **kw})
