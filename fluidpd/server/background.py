"""BackgroundServer: uvicorn on a daemon thread, for tests and notebooks."""

from __future__ import annotations

import threading
import time

import uvicorn


class BackgroundServer:
    """uvicorn serving `app` on a daemon thread (tests, notebooks):

    with BackgroundServer(build_app(runtime)) as srv:
        openai.OpenAI(base_url=srv.url + "/v1", api_key="-")
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> None:
        self.app, self.host, self.port, self.log_level = app, host, port, log_level
        self.server = None
        self.thread = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout_s: float = 300.0) -> BackgroundServer:
        config = uvicorn.Config(
            self.app,
            host=self.host,
            port=self.port,
            log_level=self.log_level,
            lifespan="on",
            timeout_graceful_shutdown=5,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="fluidpd-http", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the HTTP server failed to start (see its log)")
            if time.monotonic() > deadline:
                raise TimeoutError("the HTTP server did not start in time")
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(30)
        self.server = self.thread = None

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
