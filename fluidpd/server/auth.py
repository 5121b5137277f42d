"""Who may call what: `--api-key` on every route but /health, `--admin-key` (default: the API key)
on /v1/admin/*; admin routes are refused outright when the server listens beyond loopback
without any key (a role switch must not be open to whoever reaches the port). The Host header must
name this server (`--allowed-hosts`; on loopback by default only loopback names, so a web page
whose name re-binds to 127.0.0.1 cannot drive it from a browser)."""

from __future__ import annotations

import hmac
import ipaddress

from fastapi import Request

from fluidpd.server.config import ServeConfig
from fluidpd.server.errors import APIError

OPEN_PATHS = ("/health",)
ADMIN_PREFIX = "/v1/admin/"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bearer(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _matches(given: str | None, key: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), key.encode())


def allowed_hosts(config: ServeConfig) -> frozenset[str] | None:
    """Host header names served (None: any)."""
    if config.allowed_hosts is not None:
        names = {h.strip().lower() for h in config.allowed_hosts.split(",") if h.strip()}
        return None if "*" in names else frozenset(names | {config.host.lower()})
    return LOOPBACK_NAMES | {config.host.lower()} if loopback(config.host) else None


def host_name(header: str) -> str:
    """The name in a Host header: without its port, an IPv6 literal without brackets."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def check(
    request: Request, api_key: str | None, admin_key: str | None, host: str, hosts: frozenset[str] | None = None
) -> APIError | None:
    """The error to answer `request` with, or None if it may go on."""
    path = request.url.path
    if hosts is not None and host_name(request.headers.get("host", "")) not in hosts:
        return APIError(400, "the Host header does not name this server (see --allowed-hosts)", code="invalid_host")
    if path in OPEN_PATHS:
        return None
    if path.startswith(ADMIN_PREFIX):
        key = admin_key or api_key
        if key is None:
            if loopback(host):
                return None
            return APIError(
                403, "admin routes are off: the server listens beyond loopback without --admin-key", "permission_error"
            )
        return None if _matches(_bearer(request), key) else _unauthorized()
    if api_key is not None and not _matches(_bearer(request), api_key):
        return _unauthorized()
    return None


def _unauthorized() -> APIError:
    return APIError(401, "Incorrect API key provided", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def add_auth(app, config: ServeConfig) -> None:
    """Install the check as middleware (before any body is read)."""
    api_key, admin_key, host, hosts = config.api_key, config.admin_key, config.host, allowed_hosts(config)

    @app.middleware("http")
    async def _auth(request: Request, call_next):
        err = check(request, api_key, admin_key, host, hosts)
        if err is not None:
            return err.response()
        return await call_next(request)
