"""`fluidpd serve`: the OpenAI-compatible API over one engine (--workers 1) or a FluidPD cluster.

    fluidpd serve --model smollm2 --workers 1                 # one colocated engine (LocalRuntime)
    fluidpd serve --model smollm2 --workers 4 --policy fluidpd --ttft-slo 1 --tbt-slo 0.1
"""
from __future__ import annotations

import argparse
import sys
import time

from fluidpd.argtypes import positive

DEFAULT_PORT = 8000
SINGLE_WORKER_POLICIES = ("colocated", "chunked")




def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in [0, 65535], got {value}")
    return value


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve the OpenAI-compatible API", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="'smollm2' (default), a .gguf file or a safetensors dir")
    p.add_argument("--served-model-name", default=None, help="the name clients use (default: from --model)")
    p.add_argument("--workers", type=positive(int), default=1, help="engine instances (1: one colocated engine)")
    p.add_argument("--prefill-workers", type=int, default=0, help="initial prefill workers (0: the policy's default)")
    p.add_argument("--policy", default=None, help="colocated for 1 worker (default), else e.g. fluidpd, static_pd")
    p.add_argument("--ttft-slo", type=positive(float), default=1.0, help="seconds (default 1.0)")
    p.add_argument("--tbt-slo", type=positive(float), default=0.1, help="seconds (default 0.1)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=DEFAULT_PORT)
    p.add_argument("--max-model-len", type=positive(int), default=None)
    p.add_argument("--num-kv-blocks", type=positive(int), default=None, help="KV blocks per worker")
    p.add_argument("--max-num-seqs", type=positive(int), default=64)
    p.add_argument("--max-num-batched-tokens", type=positive(int), default=2048)
    p.add_argument("--load-format", default="auto", choices=["auto", "gguf", "safetensors", "dummy"])
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=positive(int), default=None, help="torch CPU threads")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=run)


def _check_policy(args: argparse.Namespace) -> None:
    if args.policy is None:
        args.policy = "colocated" if args.workers == 1 else "fluidpd"
    try:
        from fluidpd.policy.registry import POLICIES
    except ImportError:
        return
    if args.policy not in POLICIES:
        raise ValueError(f"unknown policy {args.policy!r}; choose from {', '.join(POLICIES)}")
    if args.prefill_workers < 0 or (args.workers > 1 and args.prefill_workers >= args.workers):
        raise ValueError(f"--prefill-workers must be in [0, {max(args.workers - 1, 0)}], got {args.prefill_workers}")


def build_runtime_from_args(args: argparse.Namespace):
    """LocalRuntime for one worker; fluidpd.runtime.build.build_runtime(args) for a cluster."""
    if args.workers == 1:
        from fluidpd.engine import EngineConfig
        from fluidpd.runtime.local import LocalRuntime

        if args.policy not in SINGLE_WORKER_POLICIES:
            print(f"fluidpd serve: note: policy {args.policy!r} needs several workers; --workers 1 serves one "
                  f"colocated engine", file=sys.stderr)
        cfg = EngineConfig(model=args.model, load_format=args.load_format, tokenizer=args.tokenizer,
                           dtype=args.dtype, device=args.device, num_kv_blocks=args.num_kv_blocks,
                           max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                           max_num_batched_tokens=args.max_num_batched_tokens, seed=args.seed)
        return LocalRuntime(cfg, model_name=args.served_model_name, ttft_slo=args.ttft_slo, tbt_slo=args.tbt_slo)
    build_runtime = _cluster_builder()
    return None if build_runtime is None else build_runtime(args)


def _cluster_builder():
    """fluidpd.runtime.build.build_runtime, or None while that module does not exist."""
    try:
        from fluidpd.runtime.build import build_runtime
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("fluidpd.runtime"):
            return None
        raise
    return build_runtime


def run(args: argparse.Namespace) -> int:
    _check_policy(args)
    try:
        import uvicorn
    except ImportError:
        print("fluidpd serve: error: serving needs fastapi and uvicorn (pip install fastapi uvicorn "
              "prometheus_client)", file=sys.stderr)
        return 2
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from fluidpd.server.app import build_app

    if args.workers > 1 and _cluster_builder() is None:
        print("fluidpd serve: error: multi-worker serving needs fluidpd.runtime.build", file=sys.stderr)
        return 2
    what = "one colocated engine" if args.workers == 1 else f"{args.workers} workers, policy {args.policy}"
    print(f"fluidpd serve: loading {args.model} on {args.device} ({what}) ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    runtime = build_runtime_from_args(args)
    if runtime is None:
        print("fluidpd serve: error: multi-worker serving needs fluidpd.runtime.build", file=sys.stderr)
        return 2
    print(f"fluidpd serve: model {runtime.model_name!r} ready in {time.perf_counter() - t0:.1f}s, "
          f"max_model_len {runtime.max_model_len}", file=sys.stderr, flush=True)
    app = build_app(runtime)
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"fluidpd serve: OpenAI API at http://{host}:{args.port}/v1 (Ctrl-C to stop)", file=sys.stderr, flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5)
    except KeyboardInterrupt:
        pass
    print("fluidpd serve: stopped", file=sys.stderr)
    return 0
