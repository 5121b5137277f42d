"""What every check is given (CheckContext) and what it returns (a JSON-able dict with "ok")."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class CheckContext:
    """One run of the checks: the device, where results and scratch files go, and the clock."""

    device: str  # "cuda", "cuda:0" or "cpu" (the dry run)
    out: Path  # results (JSON, the measured profile) come back from here
    work: Path  # scratch: written models, logs (large; never sent back)
    tiny: bool = False  # the dry run's shapes: seconds on a CPU instead of minutes on a GPU
    deadline: float = field(default_factory=lambda: time.monotonic() + 540.0)  # the whole run's end

    def left_s(self) -> float:
        """Seconds left of the whole run's budget."""
        return self.deadline - time.monotonic()

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")

    def release_device(self) -> None:
        """What this process freed (a written model's draws, an earlier check's engine) and torch's
        allocator kept goes back to the GPU: the next engine, or a server process, needs it."""
        gc.collect()
        if self.on_gpu:
            import torch

            torch.cuda.empty_cache()
