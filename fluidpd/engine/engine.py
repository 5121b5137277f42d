"""LLMEngine: requests in, tokens out; one arena, one scheduler, one model runner.

Two ways to drive it:
  * `step()`: the built-in continuous-batching scheduler plans the step;
  * `run_step(plan)`: an external planner (FluidToken) names the prefill chunks and decodes.
Both run the same `run_step` path. FluidRole's hooks are `export_kv` / `import_kv` (move a
request's KV to another engine) and `resize_kv` (re-slice the arena between KV and scratch).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from fluidpd.core.memory import trim_heap
from fluidpd.engine.arena import KVArena
from fluidpd.engine.block_manager import BlockManager, NoFreeBlocksError
from fluidpd.engine.config import EngineConfig
from fluidpd.engine.kv_transfer import KVLayout, KVPayload
from fluidpd.engine.loaders import Checkpoint, load_checkpoint, smollm2_gguf
from fluidpd.engine.model import LlamaModel
from fluidpd.engine.plan import StepPlan
from fluidpd.engine.runner import ModelRunner
from fluidpd.engine.sampling import SamplingParams, TokenLogprob, sample
from fluidpd.engine.scheduler import Scheduler
from fluidpd.engine.sequence import Sequence, SequenceStatus
from fluidpd.engine.tokenizer import Tokenizer

MAX_DEFAULT_LEN = 8192
Prompt = str | list[int] | list[dict[str, str]]


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str | None
    finish_reason: str | None
    logprobs: list[TokenLogprob] | None = None
    num_preemptions: int = 0


@dataclass
class StepOutput:
    """What one step did to one request: 0 or 1 new token, and whether it finished."""

    request_id: str
    new_token_ids: list[int]
    num_computed: int
    finished: bool = False
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] | None = None
    output: RequestOutput | None = None  # the whole output, once finished


@dataclass
class StepResult:
    outputs: list[StepOutput]
    step_s: float  # wall time of the whole step (planning excluded)
    forward_s: float  # batch building + forward + logits to host
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    cpu_s: float = 0.0  # CPU time of the calling thread over the step (cpu_s / step_s: the share of a core it got)


@dataclass
class ResizeResult:
    old_blocks: int
    new_blocks: int
    moved_blocks: int
    seconds: float


@dataclass
class EngineStats:
    num_kv_blocks: int
    num_free_blocks: int
    num_used_blocks: int
    max_kv_blocks: int
    num_waiting: int
    num_running: int
    block_size: int
    block_bytes: int
    arena_bytes: int
    kv_bytes: int
    scratch_bytes: int
    weight_bytes: int = 0


def load_model(config: EngineConfig, checkpoint: Checkpoint | None = None) -> tuple[LlamaModel, Tokenizer | None]:
    """Weights (and tokenizer) for `config`; share the result between engines of one process."""
    ckpt = checkpoint or load_checkpoint(
        config.model, config.load_format, config.torch_dtype, config.seed, config.model_overrides
    )
    max_len = config.max_model_len or min(ckpt.config.max_position_embeddings, MAX_DEFAULT_LEN)
    model = LlamaModel(ckpt, config.torch_dtype, config.torch_device, max_len, config.weight_format, config.attention)
    src = smollm2_gguf() if config.tokenizer == "smollm2" else config.tokenizer
    if src:
        tok = Tokenizer.load(src)
    elif ckpt.tokenizer is not None:
        tok = ckpt.tokenizer
    else:
        tok = Tokenizer.load(ckpt.tokenizer_source) if ckpt.tokenizer_source else None
    del ckpt
    trim_heap()
    return model, tok


class LLMEngine:
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
        self._check_model(model)
        self.model, self.tokenizer = model, tokenizer
        mc = self.model_config = model.config
        self.max_model_len = config.max_model_len or model.max_positions
        bs = config.block_size
        self.kv_layout = KVLayout(mc.num_layers, mc.num_kv_heads, mc.head_dim, bs, str(config.torch_dtype))
        block_bytes = mc.num_layers * 2 * bs * mc.num_kv_heads * mc.head_dim * config.torch_dtype.itemsize
        num_blocks, total = config.arena_layout(block_bytes)
        self.arena = KVArena(
            num_layers=mc.num_layers,
            num_kv_heads=mc.num_kv_heads,
            head_dim=mc.head_dim,
            block_size=bs,
            num_blocks=num_blocks,
            total_bytes=total,
            dtype=config.torch_dtype,
            device=config.torch_device,
        )
        self.blocks = BlockManager(num_blocks, bs)
        self.scheduler = Scheduler(self.blocks, config.max_num_seqs, config.max_num_batched_tokens)
        self.runner = ModelRunner(model, self.arena, bs)
        self.seqs: dict[str, Sequence] = {}
        self.eos_token_ids = set(mc.eos_token_ids) | set(tokenizer.eos_token_ids if tokenizer else ())
        self._ids = itertools.count()
        self.last_step: StepResult | None = None

    def _check_model(self, model: LlamaModel) -> None:
        c = self.config
        if model.dtype != c.torch_dtype or model.device.type != c.torch_device.type:
            raise ValueError(
                f"shared model is {model.dtype} on {model.device}, config wants {c.torch_dtype} on {c.torch_device}"
            )
        if model.quantization != c.weight_format:
            raise ValueError(f"shared model's quantization is {model.quantization!r}, config wants {c.weight_format!r}")
        if c.attention != "auto" and model.attention != c.attention:
            raise ValueError(f"shared model's decode attention is {model.attention!r}, config wants {c.attention!r}")
        if c.max_model_len and c.max_model_len > model.max_positions:
            raise ValueError(f"max_model_len {c.max_model_len} exceeds the shared model's {model.max_positions}")

    # ------------------------------------------------------------------ requests
    def add_request(
        self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None, *, chat: bool = False
    ) -> str:
        """Queue a request (text, token ids, or chat messages); its id."""
        params = params or SamplingParams()
        ids = self._prompt_ids(prompt, chat)
        if not ids:
            raise ValueError("prompt is empty")
        if len(ids) > self.max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens, longer than max_model_len {self.max_model_len}")
        bad = [t for t in ids if not 0 <= t < self.model_config.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} out of range for vocab size {self.model_config.vocab_size}")
        if self.blocks.blocks_for(len(ids)) > self.blocks.num_blocks:
            raise ValueError(
                f"prompt of {len(ids)} tokens needs more KV blocks than the pool holds "
                f"({self.blocks.num_blocks} x {self.config.block_size} tokens)"
            )
        rid = self._new_id(request_id)
        seq = Sequence(rid, ids, len(ids), params, generator=params.make_generator())
        self.seqs[rid] = seq
        self.scheduler.add(seq)
        return rid

    def _prompt_ids(self, prompt: Prompt, chat: bool) -> list[int]:
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], dict)):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer: pass token ids (or set EngineConfig.tokenizer)")
            if isinstance(prompt, str) and not chat:
                return self.tokenizer.encode(prompt)
            msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
            return self.tokenizer.encode_chat(msgs)
        return [int(t) for t in prompt]

    def _new_id(self, request_id: str | None) -> str:
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        while request_id is None and rid in self.seqs:
            rid = f"req-{next(self._ids)}"
        if rid in self.seqs:
            raise ValueError(f"request id {rid!r} is already in this engine")
        return rid

    def abort(self, request_id: str) -> bool:
        seq = self.seqs.get(request_id)
        if seq is None:
            return False
        self._finish(seq, "abort")
        return True

    def has_unfinished(self) -> bool:
        return bool(self.seqs)

    def request(self, request_id: str) -> Sequence:
        return self._live(request_id)

    def decoding_ids(self) -> list[str]:
        return [s.request_id for s in self.scheduler.running if s.is_decoding]

    # ------------------------------------------------------------------ stepping
    def step(self) -> list[StepOutput]:
        """One step planned by the built-in scheduler."""
        plan = self.scheduler.schedule()
        outputs = [self._finish(s, "capacity") for s in self._pop_dropped()]
        if plan:
            outputs += self.run_step(plan).outputs
        return outputs

    def run_step(self, plan: StepPlan) -> StepResult:
        """Run exactly `plan` in one forward pass (blocks are allocated as needed)."""
        t0, c0 = time.perf_counter(), time.thread_time()
        chunks = self._resolve(plan)
        self._reserve(chunks)
        t1 = time.perf_counter()
        logits, sampled = self.runner.execute(chunks)
        if sampled:
            tokens, lps = sample(logits, [s.params for s in sampled], [s.generator for s in sampled])
        else:
            tokens, lps = [], []
            if logits.is_cuda:
                torch.cuda.synchronize()
        t2 = time.perf_counter()
        for seq, n in chunks:
            seq.num_computed += n
        outputs = self._record(chunks, sampled, tokens, lps)
        res = StepResult(
            outputs,
            time.perf_counter() - t0,
            t2 - t1,
            plan.num_prefill_tokens,
            len(plan.decodes),
            time.thread_time() - c0,
        )
        self.last_step = res
        return res

    def _resolve(self, plan: StepPlan) -> list[tuple[Sequence, int]]:
        chunks = []
        for c in plan.prefills:
            seq = self._live(c.request_id)
            if not 1 <= c.num_tokens <= seq.num_uncomputed:
                raise ValueError(
                    f"prefill chunk of {c.num_tokens} tokens for {c.request_id!r}, which has "
                    f"{seq.num_uncomputed} uncomputed"
                )
            chunks.append((seq, c.num_tokens))
        for rid in plan.decodes:
            seq = self._live(rid)
            if not seq.is_decoding:
                raise ValueError(f"request {rid!r} is not decoding ({seq.num_uncomputed} tokens uncomputed)")
            chunks.append((seq, 1))
        if len({id(s) for s, _ in chunks}) != len(chunks):
            raise ValueError("a request appears twice in the step plan")
        return chunks

    def _reserve(self, chunks: list[tuple[Sequence, int]]) -> None:
        need = sum(self.blocks.needed(s, s.num_computed + n) for s, n in chunks)
        if need > self.blocks.num_free:
            raise NoFreeBlocksError(f"step needs {need} more KV blocks, {self.blocks.num_free} free")
        for seq, n in chunks:
            self.blocks.allocate(seq, seq.num_computed + n)
            self.scheduler.start(seq)

    def _record(self, chunks, sampled, tokens, lps) -> list[StepOutput]:
        new = {}
        for seq, tok, lp in zip(sampled, tokens, lps):
            seq.token_ids.append(tok)
            if lp is not None:
                seq.logprobs.append(lp)
            new[id(seq)] = (tok, lp)
        outputs = []
        for seq, _ in chunks:
            tok, lp = new.get(id(seq), (None, None))
            out = StepOutput(
                seq.request_id, [] if tok is None else [tok], seq.num_computed, logprobs=None if lp is None else [lp]
            )
            reason = self._stop_reason(seq, tok) if tok is not None else None
            if reason:
                fin = self._finish(seq, reason)
                out.finished, out.finish_reason, out.output = True, reason, fin.output
            outputs.append(out)
        return outputs

    def _stop_reason(self, seq: Sequence, tok: int) -> str | None:
        p = seq.params
        if tok in p.stop_token_ids or (not p.ignore_eos and tok in self.eos_token_ids):
            if self.tokenizer is not None:
                seq.stop_text = self.tokenizer.decode(seq.output_token_ids[:-1])
            return "stop"
        if p.stop and self.tokenizer is not None:
            text = self.tokenizer.decode(seq.output_token_ids)
            hits = [(text.find(s), s) for s in p.stop if s in text]
            if hits:
                i, s = min(hits)
                seq.stop_text = text[: i + (len(s) if p.include_stop_str_in_output else 0)]
                return "stop"
        if seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _finish(self, seq: Sequence, reason: str) -> StepOutput:
        self.scheduler.remove(seq)
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason
        self.seqs.pop(seq.request_id, None)
        text = seq.stop_text
        if text is None and self.tokenizer is not None:
            text = self.tokenizer.decode(seq.output_token_ids)
        out = RequestOutput(
            seq.request_id,
            seq.token_ids[: seq.prompt_len],
            list(seq.output_token_ids),
            text,
            reason,
            seq.logprobs,
            seq.num_preemptions,
        )
        return StepOutput(seq.request_id, [], seq.num_computed, True, reason, None, out)

    def _pop_dropped(self) -> list[Sequence]:
        dropped, self.scheduler.dropped = self.scheduler.dropped, []
        return dropped

    def _live(self, request_id: str) -> Sequence:
        seq = self.seqs.get(request_id)
        if seq is None:
            raise KeyError(f"no live request {request_id!r} in this engine")
        return seq

    def prompt_logits(self, token_ids: list[int], chunk_sizes: list[int] | None = None) -> torch.Tensor:
        """Logits [len(token_ids), vocab] at every position, computed through the paged path in
        chunks of `chunk_sizes` (default: one chunk; a chunk of 1 takes the decode path)."""
        chunks = list(chunk_sizes or [len(token_ids)])
        if sum(chunks) != len(token_ids) or min(chunks) < 1:
            raise ValueError(f"chunk sizes {chunks} do not add up to {len(token_ids)} tokens")
        rid = self.add_request(list(token_ids), SamplingParams(max_tokens=1))
        seq = self.seqs[rid]
        try:
            self._reserve([(seq, len(token_ids))])
            out = []
            for n in chunks:
                ids, pos, meta, _, _ = self.runner.prepare([(seq, n)])
                rows = torch.arange(n, device=ids.device)
                out.append(self.model.forward(ids, pos, meta, self.arena, rows))
                seq.num_computed += n
            return torch.cat(out)
        finally:
            self._finish(seq, "abort")

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
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], (int, dict))):
            prompts = [prompts]
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(plist)} sampling params for {len(prompts)} prompts")
        rids = [self.add_request(p, sp, chat=chat) for p, sp in zip(prompts, plist)]
        want, done = set(rids), {}
        bar = _progress(len(rids)) if use_tqdm else None
        while len(done) < len(rids):
            if not self.scheduler.has_work() and not self.scheduler.dropped:
                raise RuntimeError("engine has no work left but requests are unfinished")
            for o in self.step():
                if o.finished and o.request_id in want:
                    done[o.request_id] = o.output
                    if bar is not None:
                        bar.update(1)
        if bar is not None:
            bar.close()
        return [done[r] for r in rids]

    # ------------------------------------------------------------------ KV hand-off
    def export_kv(
        self, request_id: str, *, release: bool = True, device: torch.device | str | None = "cpu"
    ) -> KVPayload:
        """A request's KV blocks and state; with `release`, the request leaves this engine."""
        seq = self._live(request_id)
        nb = self.blocks.blocks_for(seq.num_computed)
        payload = KVPayload(
            request_id=seq.request_id,
            token_ids=list(seq.token_ids),
            prompt_len=seq.prompt_len,
            num_computed=seq.num_computed,
            blocks=self.arena.read_blocks(seq.block_table[:nb], device),
            layout=self.kv_layout,
            params=seq.params,
            generator_state=seq.generator.get_state() if seq.generator is not None else None,
            logprobs=list(seq.logprobs) if seq.logprobs is not None else None,
            num_preemptions=seq.num_preemptions,
        )
        if release:
            self.scheduler.remove(seq)
            seq.status, seq.finish_reason = SequenceStatus.FINISHED, "exported"
            del self.seqs[request_id]
        return payload

    def import_kv(self, payload: KVPayload, params: SamplingParams | None = None, request_id: str | None = None) -> str:
        """Continue a request exported by another engine (same model); its id here."""
        payload.check_layout(self.kv_layout)
        params = params or payload.params
        if len(payload.token_ids) > self.max_model_len:
            raise ValueError(
                f"request has {len(payload.token_ids)} tokens, more than max_model_len {self.max_model_len}"
            )
        rid = self._new_id(request_id if request_id is not None else payload.request_id)
        seq = Sequence(
            rid,
            list(payload.token_ids),
            payload.prompt_len,
            params,
            generator=params.make_generator(),
            logprobs=list(payload.logprobs) if payload.logprobs is not None else None,
            num_preemptions=payload.num_preemptions,
        )
        if seq.generator is not None and payload.generator_state is not None and params.seed == payload.params.seed:
            seq.generator.set_state(payload.generator_state)
        if payload.num_computed == 0:
            self.seqs[rid] = seq
            self.scheduler.add(seq)
            return rid
        need = self.blocks.blocks_for(payload.num_computed)
        if need > self.blocks.num_free:
            raise NoFreeBlocksError(f"import of {rid!r} needs {need} KV blocks, {self.blocks.num_free} free")
        self.blocks.allocate(seq, payload.num_computed)
        self.arena.write_blocks(seq.block_table, payload.blocks)
        seq.num_computed = payload.num_computed
        self.seqs[rid] = seq
        self.scheduler.add_running(seq)
        return rid

    # ------------------------------------------------------------------ FluidRole memory remap
    def resize_kv(self, num_blocks: int) -> ResizeResult:
        """Re-slice the arena to `num_blocks` KV blocks (the rest is scratch), in place.

        Shrinking copies live blocks that fall outside into free low ids and rewrites block
        tables; ValueError if the live blocks do not fit or the arena is too small."""
        if not isinstance(num_blocks, int) or not 1 <= num_blocks <= self.arena.max_blocks:
            raise ValueError(f"num_blocks must be in [1, {self.arena.max_blocks}], got {num_blocks!r}")
        t0 = time.perf_counter()
        old = self.blocks.num_blocks
        moves = self.blocks.resize(num_blocks, [s for s in self.seqs.values() if s.block_table])
        self.arena.resize(num_blocks, moves)
        if self.arena.device.type == "cuda":
            torch.cuda.synchronize(self.arena.device)
        return ResizeResult(old, num_blocks, len(moves), time.perf_counter() - t0)

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
        )


def _progress(total: int):
    from tqdm import tqdm

    return tqdm(total=total, desc="generate", unit="req")
