"""`fluidpd generate`: run one prompt through the engine and print the completion."""

from __future__ import annotations

import argparse
import json
import sys
import time


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "generate",
        help="generate text with the real engine",
        description="Generate a completion with FluidPD's PyTorch engine.",
    )
    p.add_argument(
        "--model",
        default="smollm2",
        help="'smollm2' (default), a .gguf file, or a safetensors directory; with "
        "--load-format dummy also a preset or config.json",
    )
    p.add_argument("--load-format", default="auto", choices=["auto", "gguf", "safetensors", "dummy"])
    p.add_argument("--tokenizer", default=None, help="tokenizer source (a .gguf, a directory, or 'smollm2')")
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="go on past the model's EOS token to --max-tokens")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16")
    p.add_argument(
        "--kv-cache-dtype",
        default="auto",
        help="auto (float16 for a float32 model on the CPU, else the model dtype) | float32 | float16 | bfloat16",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1, the measured configuration; raise on an idle machine)",
    )
    p.add_argument("--stats", action="store_true", help="print timing and memory to stderr")
    p.add_argument(
        "--json",
        action="store_true",
        help='print one JSON object {"text", "token_ids", "prompt_token_ids", "finish_reason"} instead of the text',
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from fluidpd.engine import EngineConfig, LLMEngine, SamplingParams

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.max_tokens < 1:  # (the engine takes 0 to score a prompt; a command that prints an answer does not)
        raise ValueError(f"max_tokens must be a positive integer, got {args.max_tokens}")
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop=args.stop,
        ignore_eos=args.ignore_eos,
    )
    cfg = EngineConfig(
        model=args.model,
        load_format=args.load_format,
        tokenizer=args.tokenizer,
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        device=args.device,
        max_model_len=args.max_model_len,
    )
    t0 = time.perf_counter()
    engine = LLMEngine(cfg)
    t1 = time.perf_counter()
    out = engine.generate([args.prompt], params, chat=args.chat)[0]
    t2 = time.perf_counter()
    if args.json:
        fields = ("text", "token_ids", "prompt_token_ids", "finish_reason")
        print(json.dumps({k: getattr(out, k) for k in fields}))
    else:
        print(out.text if out.text is not None else " ".join(map(str, out.token_ids)))
    if args.stats:
        n = len(out.token_ids)
        print(
            f"[load {t1 - t0:.1f}s, {len(out.prompt_token_ids)} prompt + {n} generated tokens in "
            f"{t2 - t1:.2f}s ({n / max(t2 - t1, 1e-9):.1f} tok/s), finish={out.finish_reason}]",
            file=sys.stderr,
        )
    return 0
