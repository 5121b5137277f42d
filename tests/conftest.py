"""Shared fixtures: `make run`'s server for the README's and the docs' examples (one for both), and the
in-process server the server and bench tests share."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

from doc_examples import make_run_idle, make_run_server  # noqa: F401 - fixtures, registered here
from served import served  # noqa: F401 - the one in-process server the server and bench tests share
