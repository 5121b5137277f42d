"""LLMEngine: requests in, tokens out; one arena, one scheduler, one model runner.

Two ways to drive it:
  * `step()`: the built-in continuous-batching scheduler plans the step;
  * `run_step(plan)`: an external planner (FluidToken) names the prefill chunks and decodes.
Both run the same `run_step` path. FluidRole's hooks are `export_kv` / `import_kv` (move a
request's KV to another engine) and `resize_kv` (re-slice the arena between KV and scratch).
With prefix caching on, every step indexes the full blocks it completed (prompt and output), and
a request starts after the longest cached prefix of its tokens.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence as Seq

import torch

from fluidpd.engine.arena import KVArena
from fluidpd.engine.block_manager import BlockManager, Reservation
from fluidpd.engine.config import EngineConfig
from fluidpd.engine.group import SeqGroup
from fluidpd.engine.groups import GroupOps
from fluidpd.engine.kv_exchange import KVExchange
from fluidpd.engine.kv_resize import KVResize
from fluidpd.engine.kv_transfer import KVLayout
from fluidpd.engine.loaders import Checkpoint
from fluidpd.engine.model import LlamaModel
from fluidpd.engine.model_loading import check_model, load_model
from fluidpd.engine.offline import generate
from fluidpd.engine.outputs import EngineStats, RequestOutput, StepOutput, StepResult
from fluidpd.engine.plan import StepPlan, resolve
from fluidpd.engine.prompt_logprobs import score
from fluidpd.engine.prompts import Prompt, check_prompt, prompt_ids
from fluidpd.engine.recording import StepRecording
from fluidpd.engine.runner import ModelRunner
from fluidpd.engine.sampling import SamplingParams, sample
from fluidpd.engine.scheduler import Scheduler
from fluidpd.engine.scoring import PromptScoring
from fluidpd.engine.sequence import Sequence
from fluidpd.engine.store_tier import StoreTier
from fluidpd.engine.structured.engine_hooks import attach_grammar
from fluidpd.engine.tier_hooks import TierHooks
from fluidpd.engine.tokenizer import Tokenizer

__all__ = ["LLMEngine", "load_model"]


class LLMEngine(GroupOps, KVExchange, KVResize, PromptScoring, StepRecording, TierHooks):
    """Requests in, tokens out: a model over a paged KV arena, stepped by its scheduler or an external plan."""

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        model: LlamaModel | None = None,
        tokenizer: Tokenizer | None = None,
        checkpoint: Checkpoint | None = None,
    ) -> None:
        self.config = config = config or EngineConfig()
        if model is None:
            model, loaded_tok = load_model(config, checkpoint)
            tokenizer = tokenizer or loaded_tok
        check_model(model, config)
        self.model, self.tokenizer = model, tokenizer
        mc = self.model_config = model.config
        self.max_model_len = config.max_model_len or model.max_positions
        bs = config.block_size
        kv_dtype = config.torch_kv_dtype  # float16 on the CPU by default: the kernels convert on write and read
        self.kv_layout = KVLayout(mc.num_layers, mc.num_kv_heads, mc.head_dim, bs, str(kv_dtype))
        num_blocks, total = config.arena_layout(self.kv_layout.block_numel * kv_dtype.itemsize, self.max_model_len)
        self.arena = KVArena.for_layout(self.kv_layout, num_blocks, total, kv_dtype, config.torch_device)
        window = model.config.kv_window
        self.blocks = BlockManager(num_blocks, bs, enable_caching=config.enable_prefix_caching, window=window)
        self.scheduler = Scheduler(self.blocks, config.max_num_seqs, config.max_num_batched_tokens)
        self.runner = ModelRunner(model, self.arena, bs)
        self.tier = (
            StoreTier.open(config.kv_store, config.kv_store_bytes, self.arena, self.blocks, repr(self.kv_layout))
            if config.kv_store
            else None
        )
        if self.tier is not None:
            self.scheduler.load_stored = self._load_stored
        self.seqs: dict[str, Sequence] = {}  # by `Sequence.key`
        self.groups: dict[str, SeqGroup] = {}  # n > 1 requests by id
        self.eos_token_ids = set(mc.eos_token_ids) | set(tokenizer.eos_token_ids if tokenizer else ())
        self._ids = itertools.count()
        self.last_step: StepResult | None = None
        self.prefix_cache_queries = 0  # tokens, see EngineStats
        self.prefix_cache_hits = 0
        self.prefix_cache_store_hits = 0  # of the hits, tokens loaded from the KV store

    # ------------------------------------------------------------------ requests
    def add_request(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        chat: bool = False,
        produced: list[list[int] | None] | None = None,
    ) -> str:
        """Queue a request (text, token ids, or chat messages); its id. With `params.n` > 1, `produced[j]`
        re-adds choice j with the tokens it already produced (None: it finished; it stays finished)."""
        params = params or SamplingParams()
        ids = prompt_ids(prompt, self.tokenizer, chat)
        check_prompt(ids, self.max_model_len, self.model_config.vocab_size)
        if self.blocks.blocks_for(len(ids)) > self.blocks.num_blocks:
            raise ValueError(
                f"prompt of {len(ids)} tokens needs more KV blocks than the pool holds "
                f"({self.blocks.num_blocks} x {self.config.block_size} tokens)"
            )
        rid = self._new_id(request_id)
        if params.n > 1:
            return self._add_group(rid, ids, params, produced)
        seq = Sequence(rid, ids, len(ids), params, generator=params.make_generator())
        seq.init_state(self.eos_token_ids)
        attach_grammar(self.tokenizer, seq)
        self.seqs[rid] = seq
        self.scheduler.add(seq)
        return rid

    def _new_id(self, request_id: str | None) -> str:
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        while request_id is None and rid in self.seqs:
            rid = f"req-{next(self._ids)}"
        if rid in self.seqs:
            raise ValueError(f"request id {rid!r} is already in this engine")
        return rid

    def abort(self, request_id: str) -> bool:
        seq = self.seqs.get(request_id)
        if request_id in self.groups:
            self._end_group(self.groups[request_id], "abort")
            return True
        if seq is None:
            return False
        self._finish(seq, "abort")
        return True

    def has_unfinished(self) -> bool:
        return bool(self.seqs)

    def request(self, request_id: str) -> Sequence:
        return self._live(request_id)

    def decoding_ids(self) -> list[str]:
        return list(dict.fromkeys(s.request_id for s in self.scheduler.running if s.is_decoding))  # a group once

    # ------------------------------------------------------------------ stepping
    def step(self) -> list[StepOutput]:
        """One step planned by the built-in scheduler."""
        if self.tier is not None:
            self.tier.flush()  # the scheduler counts free blocks: none held by the store's writer
        if self.groups:
            self._fork_ready()
        plan = self.scheduler.schedule()
        outputs = [self._finish(s, "capacity") for s in self.scheduler.pop_dropped()]
        if plan:
            outputs += self.run_step(plan).outputs
        return outputs

    def run_step(self, plan: StepPlan) -> StepResult:
        """Run exactly `plan` in one forward pass (blocks are allocated as needed)."""
        t0, c0 = time.perf_counter(), time.thread_time()
        plan = self._expand(plan)
        wanted = resolve(plan, self._live)
        if self.tier is not None:
            self.tier.collect()
        fresh = {id(s) for s, _, _ in wanted if not s.admitted}
        chunks = self._reserve(wanted)
        hits = {id(s): self._admit(s) for s, _ in chunks if id(s) in fresh}
        self.blocks.apply_copies(self.arena.copy_blocks)
        t1 = time.perf_counter()
        logits, sampled, scored = self.runner.execute(chunks)
        logits, sampled, fresh = self._fan_out(logits, sampled)
        if sampled:
            states = [s.state for s in sampled]
            tokens, lps = sample(logits, [s.params for s in sampled], [s.generator for s in sampled], states)
        else:
            tokens, lps = [], []
            if logits.is_cuda:
                torch.cuda.synchronize()
        t2 = time.perf_counter()
        prompt_lps = {id(s): score(s, p, lg) for s, p, lg in scored}
        for seq, n in chunks:
            seq.num_computed += n
            self.blocks.register(seq)
            self.blocks.slide(seq)
        outputs = self._record(chunks + fresh, sampled, tokens, lps, hits, prompt_lps)
        res = StepResult(
            outputs,
            time.perf_counter() - t0,
            t2 - t1,
            sum(n for _, n in chunks) - len(plan.decodes),
            len(plan.decodes),
            time.thread_time() - c0,
            self._tier_activity() if self.blocks.enable_caching else None,
        )
        self.last_step = res
        return res

    def _reserve(self, wanted: list[tuple[Sequence, int, int]]) -> list[tuple[Sequence, int]]:
        """Blocks for the step, all or nothing; (sequence, tokens to compute): a chunk's `num_cached`
        leading tokens that the cache does not hold are computed with it."""
        bs = self.config.block_size
        wants: list[Reservation] = []
        chunks = []
        for seq, n, cached in wanted:
            hits = self.blocks.lookup(seq)[: -(-cached // bs)] if cached else []
            wants.append((seq, seq.num_computed + cached + n, hits))
            chunks.append((seq, cached - self.blocks.hit_tokens(seq.num_tokens, len(hits)) + n))
        self._reserve_room(wants)
        if self.tier is not None:  # the planned hit's blocks beyond the arena's, from the store
            for i, (seq, _, cached) in enumerate(wanted):
                if cached >= bs and not seq.admitted:
                    chunks[i] = (seq, chunks[i][1] - self._load_stored(seq, cached // bs))
        for seq, _ in chunks:
            self.scheduler.start(seq)
        return chunks

    def _admit(self, seq: Sequence) -> int:
        """Count a sequence's first admission (it starts after `num_computed` cached tokens); its hit."""
        seq.admitted = True
        seq.num_cached_tokens = seq.num_computed
        if self.blocks.enable_caching:
            self.prefix_cache_queries += seq.num_tokens
            self.prefix_cache_hits += seq.num_computed
            self.prefix_cache_store_hits += seq.num_loaded_tokens
        return seq.num_computed

    def _live(self, request_id: str) -> Sequence:
        seq = self.seqs.get(request_id)
        if seq is None:
            raise KeyError(f"no live request {request_id!r} in this engine")
        return seq

    # ------------------------------------------------------------------ offline batch
    def generate(
        self,
        prompts: Prompt | list[Prompt],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        *,
        chat: bool = False,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Run prompts to completion (continuous batching); outputs in prompt order."""
        outputs = generate(self, prompts, params, chat, use_tqdm)
        if self.tier is not None:
            self.tier.flush()  # their blocks are in the store when this returns
        return outputs

    # ------------------------------------------------------------------ stats
    def stats(self) -> EngineStats:
        a = self.arena
        return EngineStats(
            num_kv_blocks=self.blocks.num_blocks,
            num_free_blocks=self.blocks.num_free,
            num_used_blocks=self.blocks.num_used,
            max_kv_blocks=a.max_blocks,
            num_waiting=self.scheduler.num_waiting,
            num_running=self.scheduler.num_running,
            block_size=self.config.block_size,
            block_bytes=a.block_bytes,
            arena_bytes=a.total_bytes,
            kv_bytes=a.kv_bytes,
            scratch_bytes=a.scratch_bytes,
            weight_bytes=self.model.weight_bytes(),
            prefix_cache_queries=self.prefix_cache_queries,
            prefix_cache_hits=self.prefix_cache_hits,
            num_cached_blocks=self.blocks.num_cached,
            num_evictable_blocks=self.blocks.num_evictable,
            prefix_cache_store_hits=self.prefix_cache_store_hits,
            kv_store_blocks=len(self.tier.store) if self.tier else 0,
            kv_store_capacity_blocks=self.tier.store.stats.capacity_blocks if self.tier else 0,
        )

    def close(self) -> None:
        """Detach from the KV store, if any (the engine computes on without it)."""
        if self.tier is not None:
            self.tier.close()
            self.tier = None
