"""ProcessWorker writes small calls itself and queues big ones: calls still run in submission order."""

from __future__ import annotations

import threading

from fluidpd.engine.sampling import SamplingParams
from fluidpd.runtime.pipe_calls import DIRECT_BYTES
from fluidpd.runtime.process import ProcessWorker
from tests.runtime.rtbackend_help import tiny_config


def test_small_and_big_calls_from_many_threads_run_in_submission_order():
    w = ProcessWorker(0, tiny_config(), warmup=False)
    w.start()
    try:
        # pings carry their index and answer with the worker's clock: answers in call order have
        # non-decreasing times; a prompt over DIRECT_BYTES goes through the sender thread between them
        big = SamplingParams(stop=["x" * DIRECT_BYTES])  # pickles to more than DIRECT_BYTES
        lock = threading.Lock()
        order: list = []

        def burst(k: int) -> None:
            for i in range(20):
                with lock:  # the submission order, as seen by the worker
                    if i % 7 == 3:
                        order.append(w.submit("add_request", f"r{k}-{i}", [5, 6, 7], big))
                    else:
                        order.append(w.submit("ping"))

        threads = [threading.Thread(target=burst, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        results = [f.result(timeout=300) for f in order]
        times = [r["time"] for r in results if isinstance(r, dict)]
        assert len(results) == 80 and len(times) < 80
        assert times == sorted(times)
        assert w.submit("stats").result(timeout=300).num_waiting == 80 - len(times)
    finally:
        w.close()
