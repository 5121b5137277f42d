"""The shared step planner and dispatch rules, on real simulator workers."""

import ast
from pathlib import Path

import pytest

from fluidpd.core.request import Request
from fluidpd.policy import routing, stepplan
from fluidpd.policy.routers.load import LeastLoaded, ShortestQueue
from fluidpd.policy.static_pd import split
from fluidpd.policy.view import Role
from fluidpd.world.worker import WorkerState


def worker(blocks=1000, role=Role.COLOCATED, wid=0):
    return WorkerState(wid, role, 0, blocks, 16)


def req(rid, prompt, out=10):
    return Request(rid, 0.0, prompt, out)


def test_whole_prompts_fill_l_m_and_long_prompts_run_alone():
    w = worker()
    for r in (req(0, 300), req(1, 300), req(2, 300), req(3, 5000)):
        w.enqueue(r)
    chunks = stepplan.whole_prompts(w, 700, 256)
    assert [(r.id, c) for r, c in chunks] == [(0, 300), (1, 300)]
    w.queue.popleft(), w.queue.popleft(), w.queue.popleft()
    assert [(r.id, c) for r, c in stepplan.whole_prompts(w, 700, 256)] == [(3, 5000)]


def test_late_last_serves_the_requests_that_can_still_make_their_ttft_first():
    w = worker()
    started = Request(0, 0.0, 400, 10)
    started.prefilled = 100  # started prefills keep their place however late
    late = [Request(1, 1.0, 300, 10), Request(2, 2.0, 300, 10)]
    on_time = [Request(3, 5.0, 300, 10), Request(4, 6.0, 300, 10)]
    for r in (started, *late, *on_time):
        w.enqueue(r)
    w.num_prefilling = 1  # as the world counts an admitted request
    late = lambda r: r.arrival_s < 4.0
    order = [r.id for r in stepplan.on_time_first(w.queue, late)]
    assert order == [0, 3, 4, 1, 2]
    assert [r.id for r in stepplan.on_time_first(w.queue, None)] == [0, 1, 2, 3, 4]
    chunks = stepplan.whole_prompts(w, 700, 256, late=late)
    assert [(r.id, c) for r, c in chunks] == [(0, 300), (3, 300)]
    chunks = stepplan.chunks_within(w, 1000, 256, late)
    assert [(r.id, c) for r, c in chunks] == [(0, 300), (3, 300), (4, 300), (1, 100)]


def test_with_max_chunk_a_long_prompt_runs_alone_a_chunk_a_step():
    w = worker()
    for r in (req(0, 300), req(1, 5000), req(2, 300)):
        w.enqueue(r)
    assert [(r.id, c) for r, c in stepplan.whole_prompts(w, 700, 256, max_chunk=2048)] == [(0, 300)]
    w.queue.popleft()
    long = w.queue[0]
    steps = []
    while long.prefilled < long.prefill_target:
        (r, c), *rest = stepplan.whole_prompts(w, 700, 256, max_chunk=2048)
        assert r is long and not rest  # alone, whatever L_m leaves
        long.prefilled += c
        steps.append(c)
    assert steps == [2048, 2048, 904]


def test_admission_stops_at_the_first_prompt_whose_blocks_do_not_fit():
    w = worker(blocks=40)  # 640 tokens
    for r in (req(0, 320), req(1, 400), req(2, 16)):
        w.enqueue(r)
    chunks = stepplan.whole_prompts(w, 10_000, 256)
    assert [r.id for r, _ in chunks] == [0]  # FCFS: no skipping ahead
    assert stepplan.whole_prompts(w, 10_000, 1) and len(stepplan.whole_prompts(w, 10_000, 1)) == 1


def test_chunked_budget_counts_decodes_and_splits_the_last_prompt():
    w = worker()
    d = req(9, 100)
    d.generated = 1
    w.allocate(w.blocks_of(d))
    w.join(d)
    for r in (req(0, 300), req(1, 500)):
        w.enqueue(r)
    plan = stepplan.decodes_then_chunks(w, 512, 256)
    assert plan.decode
    assert [(r.id, c) for r, c in plan.chunks] == [(0, 300), (1, 211)]
    assert plan.prefill_tokens == 511


def test_prefill_first_prefers_prompts_then_decodes():
    w = worker()
    d = req(9, 100)
    d.generated = 1
    w.allocate(w.blocks_of(d))
    w.join(d)
    w.enqueue(req(0, 50))
    plan = stepplan.prefill_first(w, 8192, 256)
    assert plan.chunks and not plan.decode
    w.queue.clear()
    assert stepplan.prefill_first(w, 8192, 256).decode


def test_routing_rules():
    a, b, c = worker(wid=0, role=Role.PREFILL), worker(wid=1, role=Role.PREFILL), worker(wid=2, role=Role.DECODE)
    a.enqueue(req(0, 100))
    b.enqueue(req(1, 30))
    b.enqueue(req(2, 30))
    sq = ShortestQueue()
    assert sq.pick(req(3, 1), [a, b], None).id == 1  # fewer queued tokens wins over fewer requests
    b.routable = False
    assert sq.pick(req(3, 1), routing.candidates([a, b, c], Role.PREFILL), None).id == 0
    d = worker(wid=3, role=Role.DECODE)
    d.allocate(10)
    assert routing.least_loaded_decode([a, b, c, d]) == 2
    c.pull_blocks_pending = 20
    assert routing.least_loaded_decode([a, b, c, d]) == 3
    with pytest.raises(RuntimeError):
        routing.candidates([a, b, c, d], Role.COLOCATED)
    x, y = worker(wid=4), worker(wid=5)
    x.enqueue(req(5, 10))
    assert LeastLoaded().pick(req(6, 1), [x, y], None).id == 5


def test_static_split():
    assert split(8, 2) == [Role.PREFILL] * 2 + [Role.DECODE] * 6
    assert split(8, 0).count(Role.PREFILL) == 2
    with pytest.raises(ValueError):
        split(4, 4)
    with pytest.raises(ValueError):
        split(1, 0)


def test_policy_package_imports_nothing_from_the_worlds():
    forbidden = (
        "torch",
        "fluidpd.sim",
        "fluidpd.runtime",
        "fluidpd.engine",
        "fluidpd.server",
        "fluidpd.latency",
        "numpy",
    )
    root = Path(__file__).resolve().parents[2] / "fluidpd" / "policy"
    files = list(root.glob("*.py"))
    assert files
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not name.startswith(forbidden), f"{path.name} imports {name}"


def test_a_drained_queue_keeps_its_place_among_a_peers_requests():
    from fluidpd.core.request import Request
    from fluidpd.policy.view import Role
    from fluidpd.world.worker import WorkerState

    w = WorkerState(0, Role.PREFILL, 0, 1000)
    started = Request(0, 5.0, 100, 10)
    started.worker = 0  # already prefilling here: nothing goes ahead of it
    w.enqueue(started)
    for i, t in ((1, 6.0), (2, 9.0)):
        w.enqueue(Request(i, t, 100, 10))
    w.enqueue(Request(3, 7.0, 100, 10), in_order=True)
    w.enqueue(Request(4, 1.0, 100, 10), in_order=True)
    assert [r.id for r in w.queue] == [0, 4, 1, 3, 2]
    assert w.queued_tokens == 500


def test_a_bound_on_started_requests_keeps_the_order_and_stops_walking_the_queue():
    w = worker()
    reqs = [Request(i, float(i), 300, 10) for i in range(8)]
    for r in reqs:
        w.enqueue(r)
    reqs[2].prefilled, reqs[5].prefilled = 50, 80  # started ones, not at the head
    late = lambda r: r.arrival_s < 3.0
    for lt in (None, late):
        full = [r.id for r in stepplan.on_time_first(w.queue, lt)]
        for bound in (2, 3, 8):
            assert [r.id for r in stepplan.on_time_first(w.queue, lt, bound)] == full
    assert [r.id for r in stepplan.on_time_first(w.queue, late)] == [2, 5, 3, 4, 6, 7, 0, 1]

    class Counted(list):
        reads = 0

        def __iter__(self):
            for r in super().__iter__():
                Counted.reads += 1
                yield r

    head = Counted(reqs[:2] + [Request(100 + i, 10.0 + i, 300, 10) for i in range(1000)])
    head[0].prefilled = 0
    first = next(iter(stepplan.on_time_first(head, None, 0)))
    assert first is head[0] and Counted.reads == 1  # nothing started: the queue streams as it is
    Counted.reads = 0
    reqs[1].prefilled = 10
    taken = stepplan.on_time_first(head, None, 1)
    assert [next(taken).id for _ in range(2)] == [1, 0] and Counted.reads == 2
