"""Completing the `concurrent.futures.Future`s that worker backends hand out."""

from __future__ import annotations

from concurrent.futures import Future, InvalidStateError
from typing import Any


def resolve_future(f: Future, value: Any = None, error: BaseException | None = None) -> None:
    """Set a call's outcome unless the caller cancelled the future (the call ran anyway)."""
    try:
        if error is not None:
            f.set_exception(error)
        else:
            f.set_result(value)
    except InvalidStateError:
        pass


def failed_future(exc: BaseException) -> Future:
    """A future that has already failed with `exc`."""
    f: Future = Future()
    f.set_exception(exc)
    return f
