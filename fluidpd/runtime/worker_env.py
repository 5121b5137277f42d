"""The environment an engine worker runs with, whatever runs it (a process, this process, a Ray actor).

A gguf worker's OpenMP threads sleep between regions (`OMP_WAIT_POLICY=PASSIVE`): the gguf kernel runs
its own thread pool, and OpenMP's default spin-wait keeps torch's threads on the cores it needs (2
threads on 2 cores, batch-1 step 13.0 ms spinning vs 8.9 ms passive, where the fp16 format, all OpenMP,
runs 8.9 vs 15.6 ms: `engine_bandwidth.py`). OpenMP reads it once, when it starts: a process worker
and a Ray actor get it in their environment; in this process it must be set before torch is imported
(`fluidpd serve` does, for its in-process workers). A value the user set wins.
"""

from __future__ import annotations

import os


def worker_environ(config) -> dict[str, str]:
    """The variables a worker of EngineConfig `config` needs that the environment does not set already."""
    extra = {"OMP_WAIT_POLICY": "PASSIVE"} if config.gguf_blocks else {}
    return {k: v for k, v in extra.items() if k not in os.environ}
