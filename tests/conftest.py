"""Shared fixtures: small real setups for the simulator and policy tests."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
