"""Shared by the runtime backend/transfer tests: the real SmolLM2 model, loaded once per process,
its weights staged once to /dev/shm (so worker processes start in seconds), and step drivers."""

from __future__ import annotations

import atexit
import functools
import glob
import os
import shutil
import tempfile
from dataclasses import dataclass, field, replace

import torch

from fluidpd.engine.config import EngineConfig
from fluidpd.engine.engine import LLMEngine, load_model
from fluidpd.engine.loaders import load_checkpoint
from fluidpd.engine.plan import PrefillChunk, StepPlan
from fluidpd.engine.sampling import SamplingParams
from fluidpd.policy.fluidconfig import FluidConfig

torch.set_num_threads(1)

NUM_KV_BLOCKS = 256
# tests that force role switches: those are the only ones (FluidPD's own decisions, timing-dependent
# on a loaded host, are held off) and a slow drain never rolls back
FORCED_ONLY = FluidConfig(tau_persist_s=1e9, drain_timeout_s=0)
# and every live decode of a draining worker migrates (none finishes in place, however fast the host)
MIGRATE_ALL = replace(FORCED_ONLY, role=replace(FORCED_ONLY.role, drain_finish_s=0))
PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.\nThe waves",
    "Paged attention keeps each request's keys and values in fixed-size blocks, so memory is "
    "allocated on demand and freed as soon as a request finishes. A serving system that moves "
    "requests between workers only has to copy those blocks. In short,",
]
MAX_TOKENS = 10
TINY = dict(
    num_hidden_layers=2,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
)


def tiny_config(**kw) -> EngineConfig:
    """A dummy 2-layer model: a worker process that starts fast (for the process-failure tests)."""
    return EngineConfig(
        model="smollm2-135m", load_format="dummy", model_overrides=TINY, num_kv_blocks=kw.pop("num_kv_blocks", 32), **kw
    )


@dataclass
class Smol:
    config: EngineConfig  # the default SmolLM2 (GGUF) with a small KV pool
    staged: EngineConfig  # the same weights from a safetensors dir in /dev/shm
    model: object
    tokenizer: object
    reference: LLMEngine  # a plain engine, for expected tokens

    def prompt_ids(self, i: int) -> list[int]:
        return self.tokenizer.encode(PROMPTS[i])

    cache: dict = field(default_factory=dict)

    def expected(self, i: int, max_tokens: int = MAX_TOKENS) -> list[int]:
        """Greedy tokens of prompt `i` from a plain LLMEngine.generate."""
        if (i, max_tokens) not in self.cache:
            out = self.reference.generate([self.prompt_ids(i)], SamplingParams(max_tokens=max_tokens))
            self.cache[i, max_tokens] = list(out[0].token_ids)
        return list(self.cache[i, max_tokens])


STAGE_PREFIX = "fluidpd-test-weights-"


def _remove_stale_staging() -> None:
    """Staged weights left by a test process that was killed (its pid is gone)."""
    for d in glob.glob(f"/dev/shm/{STAGE_PREFIX}*"):
        try:
            pid = int(os.path.basename(d)[len(STAGE_PREFIX) :].split("-")[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (ValueError, PermissionError):
            pass


@functools.cache
def smol() -> Smol:
    from fluidpd.runtime.staging import stage_weights

    cfg = EngineConfig(num_kv_blocks=NUM_KV_BLOCKS)
    ckpt = load_checkpoint(cfg.model, cfg.load_format, cfg.torch_dtype)
    model, tok = load_model(cfg, ckpt)
    _remove_stale_staging()
    path = tempfile.mkdtemp(prefix=f"{STAGE_PREFIX}{os.getpid()}-", dir="/dev/shm")
    atexit.register(shutil.rmtree, path, True)
    staged = stage_weights(cfg, path, checkpoint=ckpt)
    del ckpt
    return Smol(cfg, staged, model, tok, LLMEngine(cfg, model=model, tokenizer=tok))


def step_tokens(result, rid: str) -> tuple[list[int], bool]:
    for o in result.outputs:
        if o.request_id == rid:
            return list(o.new_token_ids), o.finished
    raise AssertionError(f"{rid} not in step outputs")


def start_request(worker, rid: str, prompt: list[int], params: SamplingParams) -> tuple[list[int], bool]:
    """add_request + one whole-prompt prefill step, submitted back to back (ordering matters)."""
    f_add = worker.submit("add_request", rid, prompt, params)
    f_step = worker.submit("run_step", StepPlan(prefills=[PrefillChunk(rid, len(prompt))]))
    assert f_add.result(timeout=60) == rid
    return step_tokens(f_step.result(timeout=60), rid)


def decode(worker, rid: str, max_steps: int) -> tuple[list[int], bool]:
    """Up to `max_steps` single-request decode steps, stopping when the request finishes."""
    toks: list[int] = []
    for _ in range(max_steps):
        new, done = step_tokens(worker.submit("run_step", StepPlan(decodes=[rid])).result(timeout=60), rid)
        toks += new
        if done:
            return toks, True
    return toks, False


def run_to_end(worker, rid: str, prompt: list[int], max_tokens: int = MAX_TOKENS) -> list[int]:
    toks, done = start_request(worker, rid, prompt, SamplingParams(max_tokens=max_tokens))
    if not done:
        more, done = decode(worker, rid, max_tokens)
        toks += more
    assert done
    return toks


def served_setup(n: int, max_tokens: int):
    """(engine config, cost profile, n prompts, their greedy tokens) for the coordinator tests."""
    from fluidpd.runtime.profile import profile_engine

    s = smol()
    config = replace(s.staged, num_kv_blocks=192, max_model_len=1024, max_num_seqs=16)
    profile = profile_engine(s.reference, lengths=(16, 64, 256), repeats=2)
    ids = [s.prompt_ids(i % 3) + s.tokenizer.encode(f" {i}") for i in range(n)]
    outs = s.reference.generate(ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return config, profile, ids, [list(o.token_ids) for o in outs]
