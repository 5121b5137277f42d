"""Shared pieces of the engine benchmarks: one torch thread, SmolLM2 loaders, timing helpers."""

from __future__ import annotations

import os
import random
import resource
import statistics
import sys
import time

import torch

torch.set_num_threads(1)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from fluidpd.core.memory import rss_bytes  # noqa: E402
from fluidpd.engine import EngineConfig, LLMEngine, SamplingParams, StepPlan, load_model  # noqa: E402
from fluidpd.engine.loaders import smollm2_gguf  # noqa: E402


def median(xs) -> float:
    return statistics.median(xs)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mib() -> float:
    """Current resident set size (Linux /proc; 0 elsewhere)."""
    return rss_bytes() / 2**20


def random_prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randint(100, 40000) for _ in range(n)] for n in lengths]


_MODEL: dict[str, tuple] = {}


def shared_model(quantization: str = "auto"):
    """SmolLM2 (GGUF, fp32 activations) weights + tokenizer in one weight format, loaded once per process."""
    if quantization not in _MODEL:
        _MODEL[quantization] = load_model(EngineConfig(quantization=quantization))
    return _MODEL[quantization]


def engine(num_kv_blocks: int, quantization: str = "auto", **kw) -> LLMEngine:
    """A SmolLM2 engine over the shared weights of `quantization`."""
    model, tok = shared_model(quantization)
    config = EngineConfig(num_kv_blocks=num_kv_blocks, quantization=quantization, **kw)
    return LLMEngine(config, model=model, tokenizer=tok)


def engine_decode_steps(eng: LLMEngine, prompts: list[list[int]], steps: int) -> list[float]:
    """Prefill `prompts`, then time `steps` pure decode steps (wall seconds each)."""
    params = SamplingParams(max_tokens=4096, ignore_eos=True)
    rids = [eng.add_request(p, params) for p in prompts]
    while any(not eng.request(r).is_decoding for r in rids):
        eng.step()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        eng.run_step(StepPlan(decodes=list(rids)))
        times.append(time.perf_counter() - t)
    for r in rids:
        eng.abort(r)
    return times


def engine_prefill_seconds(eng: LLMEngine, prompt: list[int]) -> float:
    from fluidpd.engine import PrefillChunk

    rid = eng.add_request(prompt, SamplingParams(max_tokens=1))
    t = time.perf_counter()
    eng.run_step(StepPlan(prefills=[PrefillChunk(rid, len(prompt))]))
    dt = time.perf_counter() - t
    eng.abort(rid)
    return dt


# ----------------------------------------------------------------------------- transformers


def hf_model():
    from transformers import AutoModelForCausalLM

    path = smollm2_gguf()
    return AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
    ).eval()


class _Clock:
    """A logits processor that timestamps every generation step."""

    def __init__(self):
        self.t: list[float] = []

    def __call__(self, input_ids, scores):
        self.t.append(time.perf_counter())
        return scores


def hf_generate_times(model, prompts: list[list[int]], new_tokens: int) -> tuple[float, list[float]]:
    """transformers `generate` (greedy, left-padded batch): (seconds to the first token, decode step seconds)."""
    from transformers import LogitsProcessorList

    L = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), L), 2, dtype=torch.long)
    mask = torch.zeros((len(prompts), L), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, L - len(p) :] = torch.tensor(p)
        mask[i, L - len(p) :] = 1
    clock = _Clock()
    t0 = time.perf_counter()
    with torch.no_grad():
        model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=2,
            logits_processor=LogitsProcessorList([clock]),
        )
    steps = [b - a for a, b in zip(clock.t, clock.t[1:])]
    return clock.t[0] - t0, steps


def progress(iterable, desc: str):
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, file=sys.stderr, leave=False)
