import pytest

from fluidpd.world.events import EventKind, EventLoop


def test_same_instant_runs_in_kind_order_then_insertion_order():
    loop, seen = EventLoop(), []
    loop.at(1.0, EventKind.SAMPLE, seen.append, "sample")
    loop.at(1.0, EventKind.ARRIVAL, seen.append, "arrival-a")
    loop.at(1.0, EventKind.CONTROL, seen.append, "control")
    loop.at(1.0, EventKind.STEP_END, seen.append, "step")
    loop.at(1.0, EventKind.ARRIVAL, seen.append, "arrival-b")
    loop.at(1.0, EventKind.TRANSFER_END, seen.append, "transfer")
    loop.at(0.5, EventKind.SAMPLE, seen.append, "earlier")
    loop.run()
    assert seen == ["earlier", "step", "transfer", "arrival-a", "arrival-b", "control", "sample"]
    assert loop.now == 1.0 and loop.events_run == 7


def test_run_until_leaves_later_events_and_rejects_the_past():
    loop, seen = EventLoop(), []
    loop.at(1.0, EventKind.ARRIVAL, seen.append, 1)
    loop.at(3.0, EventKind.ARRIVAL, seen.append, 3)
    loop.run(until=2.0)
    assert seen == [1] and len(loop) == 1
    with pytest.raises(ValueError):
        loop.at(0.5, EventKind.ARRIVAL, seen.append, 0)


def test_callbacks_may_schedule_more_events():
    loop, seen = EventLoop(), []

    def chain(i):
        seen.append((loop.now, i))
        if i < 3:
            loop.at(loop.now + 0.1, EventKind.STEP_END, chain, i + 1)

    loop.at(0.0, EventKind.STEP_END, chain, 0)
    loop.run()
    assert [i for _, i in seen] == [0, 1, 2, 3]
    assert seen[-1][0] == pytest.approx(0.3)
