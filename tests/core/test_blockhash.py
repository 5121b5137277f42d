from fluidpd.core.blockhash import ROOT, block_hashes, chain


def test_equal_hashes_mean_equal_prefixes():
    a = block_hashes(list(range(40)), 16)
    b = block_hashes(list(range(32)) + [7] * 8, 16)
    c = block_hashes([1, *range(1, 40)], 16)
    assert len(a) == 2 and a == b  # the partial third block is not hashed
    assert c[0] != a[0] and c[1] != a[1]  # the same second block after a different first one


def test_incremental_hashing_continues_the_chain():
    ids = list(range(100, 164))
    full = block_hashes(ids, 16)
    assert block_hashes(ids, 16, start=2, parent=full[1]) == full[2:]
    assert full[0] == chain(ROOT, ids[:16])


def test_hashes_are_stable_across_processes():
    import subprocess
    import sys

    code = "from fluidpd.core.blockhash import block_hashes; print(block_hashes(list(range(32)), 16))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(block_hashes(list(range(32)), 16))
