"""Load against a server: failures to reach or talk to it as clear errors (exit 2)."""

from __future__ import annotations

import asyncio


def talk(url: str, work):
    """Run the coroutine `work` against `url`; failures to reach or talk to it as clear errors."""
    try:
        return asyncio.run(work)
    except OSError as exc:
        raise ValueError(f"cannot reach {url}: {exc}") from None
    except Exception as exc:
        if type(exc).__module__.startswith("httpx"):
            raise ValueError(f"cannot talk to {url}: {exc}") from None
        raise
