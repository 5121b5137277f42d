"""KV transfer: the shared-memory transport on its own, and live migrations between workers
(across processes and in one process) that continue with exactly the single-engine greedy tokens.
/dev/shm must hold no KV segment afterwards, on success and on every failure path."""

from __future__ import annotations

import os
import pickle

import pytest
import torch
from rtbackend_help import NUM_KV_BLOCKS, decode, run_to_end, smol, start_request

from fluidpd.bench.leftovers import descendants
from fluidpd.engine.block_manager import NoFreeBlocksError
from fluidpd.engine.block_pool import MissingCachedBlocks
from fluidpd.engine.kv_transfer import KVLayout, KVPayload
from fluidpd.engine.sampling import SamplingParams
from fluidpd.runtime.backend import start_workers
from fluidpd.runtime.inprocess import InProcessWorker
from fluidpd.runtime.process import ProcessWorker
from fluidpd.runtime.transport import get_transport, release
from fluidpd.runtime.transport.base import KVHandle
from fluidpd.runtime.transport.local import LocalTransport
from fluidpd.runtime.transport.shm import HEADER, SharedMemoryTransport, leftover_segments, segment_generation

torch.set_num_threads(1)
pytestmark = pytest.mark.timeout(900)  # a hang guard, far above the work on a loaded host
LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, block_size=4, dtype="torch.float32")


def payload(num_computed: int = 10, layout: KVLayout = LAYOUT, dtype=torch.float32) -> KVPayload:
    nb = -(-num_computed // layout.block_size)
    g = torch.Generator().manual_seed(num_computed)
    blocks = torch.randn((nb, *layout.block_shape), generator=g).to(dtype)
    return KVPayload(
        "r",
        list(range(1, num_computed + 3)),
        5,
        num_computed,
        blocks,
        layout,
        SamplingParams(max_tokens=7, temperature=0.8, seed=3),
        generator_state=torch.Generator().manual_seed(3).get_state(),
        num_preemptions=2,
        meta={"k": 1},
    )


POOL_PID: list[int] = []  # the pooled worker's pid: its free pool segments are not leaks


def our_segments() -> set[str]:
    """KV segments created by this process or its children (another test process's are not ours)."""
    return {n for pid in (os.getpid(), *descendants(os.getpid())) for n in leftover_segments(pid)}


@pytest.fixture(autouse=True)
def no_leaks():
    before = our_segments()
    yield
    new = our_segments() - before
    pooled = {n for n in new if POOL_PID and n.startswith(f"fpkv_{POOL_PID[0]}_")}
    assert new - pooled == set(), "a KV segment was left in /dev/shm"
    assert all(segment_generation(n) == 0 for n in pooled), "a pooled KV segment is still marked busy"


# ---------------------------------------------------------------------- the transport alone


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shm_round_trip(dtype):
    t = SharedMemoryTransport()
    p = payload(dtype=dtype)
    h = t.send(p)
    assert isinstance(h, KVHandle) and h.name in leftover_segments(os.getpid())
    assert h.nbytes == p.nbytes and h.shape == tuple(p.blocks.shape) and h.payload is None
    h = pickle.loads(pickle.dumps(h))  # what crosses the pipe
    q = t.receive(h)
    assert torch.equal(q.blocks, p.blocks) and q.blocks.dtype == dtype
    assert (q.token_ids, q.prompt_len, q.num_computed, q.layout, q.params, q.num_preemptions, q.meta) == (
        p.token_ids,
        p.prompt_len,
        p.num_computed,
        p.layout,
        p.params,
        p.num_preemptions,
        p.meta,
    )
    assert torch.equal(q.generator_state, p.generator_state)
    p.blocks.zero_()
    assert not torch.equal(q.blocks, p.blocks)  # the segment holds its own copy
    del q
    t.release(h)
    assert h.name not in leftover_segments() and t.open_segments() == []
    t.release(h)  # idempotent
    release(h)


def test_shm_release_without_receive_and_empty_payload():
    t = get_transport("shm")
    h = t.send(payload())
    release(h)  # the coordinator's abort path
    assert h.name not in leftover_segments()
    with pytest.raises(FileNotFoundError):
        t.receive(h)
    empty = t.send(payload(num_computed=0))  # a request with no KV yet: no segment
    assert empty.name is None and empty.nbytes == 0
    assert t.receive(empty).blocks.shape[0] == 0
    release(empty)


def test_shm_release_while_a_view_is_alive():
    t = SharedMemoryTransport()
    h = t.send(payload())
    q = t.receive(h)
    t.release(h)  # the view keeps the mapping, not the name
    assert h.name not in leftover_segments()
    assert torch.equal(q.blocks, payload().blocks)  # payload() is seeded: the same values


def test_local_transport_and_mismatched_handles():
    lt = LocalTransport()
    p = payload()
    h = lt.send(p)
    assert lt.receive(h) is p
    lt.release(h)
    with pytest.raises(ValueError, match="no payload"):
        lt.receive(h)
    with pytest.raises(ValueError, match="'local' KV handle given to the 'shm'"):
        SharedMemoryTransport().receive(h)
    with pytest.raises(ValueError, match="unknown KV transport"):
        get_transport("rdma")


def test_pool_reuses_segments_and_detects_stale_handles():
    owner, peer = SharedMemoryTransport(pool_bytes=4 << 20), SharedMemoryTransport()
    p1, p2 = payload(10), payload(12)
    h1 = owner.send(p1)
    assert h1.generation > 0 and h1.offset == HEADER
    [(name, cap, busy)] = owner.pool_segments()
    assert name == h1.name and busy and cap >= h1.nbytes and segment_generation(name) == h1.generation
    h1 = pickle.loads(pickle.dumps(h1))
    q = peer.receive(h1)
    assert torch.equal(q.blocks, p1.blocks)
    del q
    peer.release(h1)
    assert owner.pool_segments()[0][2] is False and segment_generation(name) == 0
    h2 = owner.send(p2)  # reuses the same (warm) segment
    assert h2.name == name and h2.generation != h1.generation and len(owner.pool_segments()) == 1
    with pytest.raises(ValueError, match="stale KV handle"):
        peer.receive(h1)
    peer.release(h1)  # a stale release leaves h2's segment busy
    assert segment_generation(name) == h2.generation
    h3 = owner.send(p1)  # h2 in flight: a second segment
    assert h3.name != name and len(owner.pool_segments()) == 2
    assert torch.equal(peer.receive(h2).blocks, p2.blocks)
    release(h2)
    release(h3)
    big = owner.send(payload(20480))  # 5 MiB, more than the whole pool: one-shot
    assert big.generation == 0 and big.name not in {n for n, _, _ in owner.pool_segments()}
    release(big)
    owner.close()
    owner.close()
    assert name not in leftover_segments() and owner.pool_segments() == []
    release(h2)  # owner gone: releasing is a no-op


# ---------------------------------------------------------------------- live migrations


@pytest.fixture(scope="module")
def procs():
    """a exports through one-shot segments, b through a pool of reused segments."""
    s = smol()
    a, b = ProcessWorker(0, s.staged), ProcessWorker(1, s.staged, kv_pool_bytes=64 << 20)
    start_workers([a, b])
    POOL_PID[:] = [b.pid]
    yield a, b
    a.close()
    b.close()
    assert leftover_segments() == [], "closing the workers must unlink their pooled segments"


def migrate_mid_decode(a, b, rid: str, prompt_index: int, before: int, max_tokens: int = 10) -> list[int]:
    """Prefill + `before` decode steps on `a`, export, import on `b`, decode to the end there."""
    s = smol()
    toks, _ = start_request(a, rid, s.prompt_ids(prompt_index), SamplingParams(max_tokens=max_tokens))
    more, done = decode(a, rid, before)
    assert not done
    handle = a.submit("export_kv", rid).result(timeout=60)
    assert handle.num_computed == len(s.prompt_ids(prompt_index)) + before
    assert handle.output_token_ids == toks + more
    assert a.submit("stats").result(timeout=30).num_used_blocks == 0  # the request left a
    assert b.submit("import_kv", handle).result(timeout=60) == rid
    rest, done = decode(b, rid, max_tokens)
    assert done
    return toks + more + rest


@pytest.mark.slow
def test_cross_process_migration_continues_exactly(procs):
    a, b = procs
    s = smol()
    assert migrate_mid_decode(a, b, "m0", 0, before=3) == s.expected(0)
    assert migrate_mid_decode(b, a, "m2", 2, before=1) == s.expected(2)  # the other way, longer KV
    for w in procs:
        st = w.submit("stats").result(timeout=30)
        assert st.num_used_blocks == 0 and st.num_running == 0


def test_failed_import_unlinks_segment_and_keeps_the_error(procs):
    a, b = procs
    s = smol()
    start_request(a, "f", s.prompt_ids(2), SamplingParams(max_tokens=10))
    handle = a.submit("export_kv", "f").result(timeout=60)
    assert handle.num_blocks >= 2 and handle.name in leftover_segments()
    b.submit("resize_kv", 1).result(timeout=30)  # too few free blocks on b
    try:
        with pytest.raises(NoFreeBlocksError, match=r"needs .* KV blocks, 1 free"):
            b.submit("import_kv", handle).result(timeout=60)
    finally:
        b.submit("resize_kv", NUM_KV_BLOCKS).result(timeout=30)
    assert handle.name not in leftover_segments()
    st = b.submit("stats").result(timeout=30)
    assert st.num_used_blocks == 0 and st.num_running == 0  # nothing half-imported
    # a handle that was released (aborted migration) cannot be imported, and leaks nothing
    start_request(a, "g", s.prompt_ids(0), SamplingParams(max_tokens=10))
    h2 = a.submit("export_kv", "g").result(timeout=60)
    release(h2)
    with pytest.raises(FileNotFoundError):
        b.submit("import_kv", h2).result(timeout=30)


def test_import_with_wrong_layout_is_rejected_and_unlinked(procs):
    _, b = procs
    h = get_transport("shm").send(payload())  # sent by the coordinator process
    with pytest.raises(ValueError, match="layout"):
        b.submit("import_kv", h).result(timeout=30)
    assert h.name not in leftover_segments()


def test_export_keep_and_import_under_new_id(procs):
    """export_kv(release=False) copies without moving; import under another id (a fork)."""
    a, b = procs
    s = smol()
    toks, _ = start_request(a, "k", s.prompt_ids(0), SamplingParams(max_tokens=10))
    h = a.submit("export_kv", "k", release=False).result(timeout=60)
    assert b.submit("import_kv", h, request_id="k-copy").result(timeout=60) == "k-copy"
    rest_a, _ = decode(a, "k", 10)
    rest_b, _ = decode(b, "k-copy", 10)
    assert toks + rest_a == toks + rest_b == s.expected(0)


def test_export_skips_the_blocks_the_importer_holds_cached(procs):
    """Across processes: only the blocks b lacks travel; while b lacks them its import refuses
    (MissingCachedBlocks, the type kept across the pipe) and holds nothing; the answer is unchanged."""
    a, b = procs
    s = smol()
    ids = s.tokenizer.encode("Blocks that stay behind. ") + s.prompt_ids(2)  # no other test's prompt
    bs, params = s.config.block_size, SamplingParams(max_tokens=10)
    skip = len(ids) // bs
    toks, _ = start_request(a, "sk", ids, params)
    more, _ = decode(a, "sk", 2)
    h = a.submit("export_kv", "sk", False, None, skip).result(timeout=60)
    assert h.skip_blocks == skip and h.num_blocks == -(-(len(ids) + 2) // bs) - skip
    with pytest.raises(MissingCachedBlocks, match=f"skips {skip} KV blocks"):
        b.submit("import_kv", h).result(timeout=60)
    assert b.submit("stats").result(timeout=30).num_used_blocks == 0
    run_to_end(b, "warm", ids, max_tokens=1)  # b now holds the prompt's blocks cached
    h = a.submit("export_kv", "sk", release=False, skip_blocks=skip).result(timeout=60)
    assert b.submit("import_kv", h).result(timeout=60) == "sk"
    assert a.submit("abort", "sk").result(timeout=30)
    assert a.submit("stats").result(timeout=30).num_used_blocks == 0
    rest, done = decode(b, "sk", 10)
    assert done and toks + more + rest == list(s.reference.generate([ids], params)[0].token_ids)


def test_pooled_handle_from_another_process(procs):
    """A pool owned by this process, imported by a worker process that marks it free again."""
    a, b = procs
    s = smol()
    toks, _ = start_request(a, "pp", s.prompt_ids(2), SamplingParams(max_tokens=10))
    one_shot = a.submit("export_kv", "pp").result(timeout=60)
    shm = get_transport("shm")
    moved = shm.receive(one_shot)
    pool = SharedMemoryTransport(pool_bytes=16 << 20)
    try:
        h = pool.send(moved)
        del moved
        shm.release(one_shot)
        assert b.submit("import_kv", h).result(timeout=60) == "pp"
        assert pool.pool_segments()[0][2] is False  # b marked it free
        rest, done = decode(b, "pp", 10)
        assert done and toks + rest == s.expected(2)
    finally:
        pool.close()


def test_inprocess_migration_local_and_shm():
    s = smol()
    ws = [
        InProcessWorker(
            i, s.config, model=s.model, tokenizer=s.tokenizer, warmup=False, transport=("local" if i < 2 else "shm")
        )
        for i in range(4)
    ]
    start_workers(ws)
    try:
        assert migrate_mid_decode(ws[0], ws[1], "l", 1, before=2) == s.expected(1)
        assert migrate_mid_decode(ws[2], ws[3], "s", 1, before=4) == s.expected(1)
    finally:
        for w in ws:
            w.close()
