"""`fluidpd serve`: the OpenAI-compatible API over engine workers run by a FluidPD policy.

    fluidpd serve                                              # one colocated worker, SmolLM2
    fluidpd serve --workers 4 --policy fluidpd                 # 1 prefill + 3 decode, elastic

Every configuration, one worker included, runs the same World lifecycle and policy code as the
simulator, on the wall clock, with each worker's steps executed on its own engine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from fluidpd.cli.serve_placement import add_placement_flags, placed_runtime
from fluidpd.core.knobs import add_flags, flag_values
from fluidpd.engine.config import EngineConfig
from fluidpd.policy.base import PolicyConfig
from fluidpd.policy.fluidconfig import FluidConfig
from fluidpd.runtime.config import RuntimeConfig
from fluidpd.runtime.worker_env import worker_environ
from fluidpd.server.config import ServeConfig

ENGINE_FLAGS_SKIP = ("seed",)


def register(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="serve the OpenAI-compatible API",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_flags(p, EngineConfig, skip=ENGINE_FLAGS_SKIP)
    add_flags(p, RuntimeConfig)
    add_flags(p, PolicyConfig)
    add_flags(p, FluidConfig)
    add_flags(p, ServeConfig)
    add_placement_flags(p)
    p.set_defaults(func=run)


def configs(args: argparse.Namespace) -> tuple[EngineConfig, RuntimeConfig, ServeConfig]:
    """The three configs `fluidpd serve` is built from (ValueError for a bad combination)."""
    runtime = RuntimeConfig(
        **flag_values(args, RuntimeConfig),
        scheduling=PolicyConfig(**flag_values(args, PolicyConfig)),
        fluid=FluidConfig(**flag_values(args, FluidConfig)),
    )
    return (
        EngineConfig(**flag_values(args, EngineConfig, skip=ENGINE_FLAGS_SKIP)),
        runtime,
        ServeConfig(**flag_values(args, ServeConfig)),
    )


def run(args: argparse.Namespace) -> int:
    engine, runtime, serve = configs(args)
    os.environ.update(worker_environ(engine))  # before torch loads OpenMP here (in-process workers only)
    placement = links = None
    if runtime.backend == "ray":
        from fluidpd.runtime.ray_links import ray_placement

        placement, links = ray_placement(runtime, engine.device.startswith("cuda"), _say)
    runtime, why = placed_runtime(args, engine, runtime, links)
    if why:
        _say(why)
    try:
        import uvicorn

        from fluidpd.runtime.build import build_coordinator
        from fluidpd.server.app import build_app
        from fluidpd.server.auth import loopback
        from fluidpd.server.drain import DrainingServer
    except ImportError as exc:
        raise ValueError(f"serving needs the serve extras (pip install 'fluidpd[serve]'): {exc}") from None
    t0 = time.perf_counter()
    coordinator = build_coordinator(engine, runtime, serve.served_model_name or engine.model, placement=placement)
    _say(
        f"serving {coordinator.model_name!r} (max_model_len {coordinator.max_model_len}) ready in "
        f"{time.perf_counter() - t0:.1f} s"
    )
    if not loopback(serve.host) and serve.api_key is None:
        _say(f"warning: listening on {serve.host} without --api-key: anyone who reaches the port can use it")
    host = f"[{serve.host}]" if ":" in serve.host else serve.host
    _say(f"OpenAI API at http://{host}:{serve.port}/v1 (Ctrl-C or SIGTERM drains, then stops)")
    app = build_app(coordinator, config=serve)
    config = uvicorn.Config(
        app, host=serve.host, port=serve.port, log_level=serve.log_level, timeout_graceful_shutdown=5
    )
    server = DrainingServer(config, coordinator, serve.shutdown_timeout_s)
    try:
        server.run()
    except KeyboardInterrupt:  # Ctrl-C before the server took the signal over
        pass
    _say("stopped" + (f" ({server.cut} admitted requests cut)" if server.cut else ""))
    return 1 if server.cut else 0


def _say(msg: str) -> None:
    print(f"fluidpd serve: {msg}", file=sys.stderr, flush=True)
