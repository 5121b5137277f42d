"""API keys: every route but /health needs the key when one is set; admin routes need the admin
key, and are refused outright beyond loopback when no key is set."""

from __future__ import annotations

import httpx
import pytest

from fluidpd.server import BackgroundServer, build_app
from fluidpd.server.auth import allowed_hosts, check, loopback
from fluidpd.server.config import ServeConfig


@pytest.fixture(scope="module")
def keyed(served):
    app = build_app(served.runtime, manage_runtime=False, config=ServeConfig(api_key="k1", admin_key="adm"))
    with BackgroundServer(app) as srv:
        yield srv


def test_every_route_but_health_needs_the_key(keyed, model):
    assert httpx.get(keyed.url + "/health").status_code == 200
    r = httpx.get(keyed.url + "/v1/models")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(keyed.url + "/v1/models", headers={"Authorization": "Bearer nope"}).status_code == 401
    ok = {"Authorization": "Bearer k1"}
    assert httpx.get(keyed.url + "/v1/models", headers=ok).json()["data"][0]["id"] == model
    r = httpx.post(keyed.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, headers=ok, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    assert httpx.get(keyed.url + "/v1/admin/cluster", headers=ok).status_code == 401  # not the admin key
    assert httpx.get(keyed.url + "/v1/admin/cluster", headers={"Authorization": "Bearer adm"}).status_code == 200


def test_admin_routes_beyond_loopback_need_a_key():
    class Req:
        def __init__(self, path, auth=None):
            self.url = type("U", (), {"path": path})()
            self.headers = {"authorization": auth} if auth else {}

    assert loopback("127.0.0.1") and loopback("::1") and not loopback("0.0.0.0")
    assert check(Req("/v1/admin/cluster"), None, None, "127.0.0.1") is None
    refused = check(Req("/v1/admin/cluster"), None, None, "0.0.0.0")
    assert refused is not None and refused.status == 403
    assert check(Req("/v1/models"), None, None, "0.0.0.0") is None  # no key set: the API is open
    assert check(Req("/v1/admin/cluster", "Bearer k"), "k", None, "0.0.0.0") is None  # the API key serves


def test_the_key_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("FLUIDPD_API_KEY", "from-env")
    assert ServeConfig().api_key == "from-env"
    assert ServeConfig(api_key="flag").api_key == "flag"


def test_a_host_header_that_does_not_name_the_server_is_refused(served):
    """A loopback server answers only loopback names (DNS rebinding); --allowed-hosts widens it."""
    url = served.url  # http://127.0.0.1:PORT, listening on loopback
    port = url.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}"):
        assert httpx.get(url + "/v1/models", headers={"Host": host}).status_code == 200, host
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", ""):
        r = httpx.get(url + "/health", headers={"Host": host})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host", host
    app = build_app(served.runtime, manage_runtime=False, config=ServeConfig(allowed_hosts="api.example, other"))
    with BackgroundServer(app) as srv:
        assert httpx.get(srv.url + "/v1/models", headers={"Host": "api.example:443"}).status_code == 200
        assert httpx.get(srv.url + "/v1/models").status_code == 200  # its own --host stays served
        assert httpx.get(srv.url + "/v1/models", headers={"Host": "localhost"}).status_code == 400
    assert allowed_hosts(ServeConfig(host="0.0.0.0")) is None  # beyond loopback: any name, by default
    assert allowed_hosts(ServeConfig(host="127.0.0.1", allowed_hosts="*")) is None
