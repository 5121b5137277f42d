"""Where load may go: loopback servers only."""

from __future__ import annotations

import ipaddress
import urllib.parse

LOOPBACK_NAMES = ("localhost",)


def check_loopback(url: str) -> str:
    """The base URL (no trailing /v1) of a loopback server; ValueError for any other target."""
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    host = u.hostname.lower()
    ok = host in LOOPBACK_NAMES or host.endswith(".localhost")
    if not ok:
        try:
            ok = ipaddress.ip_address(host).is_loopback
        except ValueError:
            ok = False
    if not ok:
        raise ValueError(
            f"refusing to send load to {host!r}: fluidpd bench only targets loopback servers "
            f"(127.0.0.0/8, ::1, localhost)"
        )
    path = u.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return urllib.parse.urlunsplit((u.scheme, u.netloc, path, "", "")).rstrip("/")
