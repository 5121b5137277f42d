"""The per-step log of the serving runtime: one JSON line per engine step, for checking a latency
model against what the real runtime did (`benchmarks/simulation/sim_fidelity.py`).

Each line holds the step's worker, kind and StepShape, how many workers were running a step when
it was sent, the engine's own time for it (`engine_s`, `run_step` inside the worker), the wall time
from sending the plan to handling its result on the coordinator's loop (`wall_s`: adds the IPC,
pickling and the loop's delay), and the worker's idle time before it (`idle_s`: from handling its
previous step's result to sending this one).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from fluidpd.latency.shape import StepShape


@dataclass(slots=True)
class StepRecord:
    """One engine step as the runtime saw it."""

    worker: int
    kind: str  # prefill | decode | mixed
    start_s: float  # when its plan was sent (runtime clock)
    busy: int  # workers running a step when it was sent, itself included
    busy_prefill: int  # ... of them running a step with prefill chunks
    engine_s: float
    engine_cpu_s: float  # the worker thread's CPU time over the step (engine_cpu_s / engine_s: its share of a core)
    wall_s: float
    idle_s: float
    coordinator_cpu_s: float  # CPU time the coordinator's process had used when the result was handled
    shape: StepShape

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, line: str) -> StepRecord:
        d = json.loads(line)
        return cls(**{**d, "shape": StepShape(**d["shape"])})


class StepLog:
    """Appends StepRecords to a file as JSON lines (line-buffered: readable while serving)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._f = open(path, "w", buffering=1)  # noqa: SIM115 - closed by close()

    def write(self, record: StepRecord) -> None:
        self._f.write(record.to_json() + "\n")

    def close(self) -> None:
        self._f.close()


def read_step_log(path: str) -> list[StepRecord]:
    with open(path) as f:
        return [StepRecord.from_json(line) for line in f if line.strip()]
