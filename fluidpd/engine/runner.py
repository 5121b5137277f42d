"""Model runner: turns (sequence, num_tokens) chunks into one flat batch and runs one forward."""

from __future__ import annotations

import torch

from fluidpd.engine.arena import KVArena
from fluidpd.engine.attention_meta import AttentionMetadata, DecodeGroup, PrefillSegment
from fluidpd.engine.model import LlamaModel
from fluidpd.engine.paged_attention import PagedDecodes
from fluidpd.engine.prompt_logprobs import scored_positions
from fluidpd.engine.sequence import Sequence

# Decodes are attended in groups of similar context length. A group costs one gather + one SDPA
# per layer (about GROUP_OVERHEAD_TOKENS padded tokens' worth of time on CPU); a group's gathered
# K/V should stay cache-resident (GROUP_MAX_BYTES per layer) so SDPA reads it from cache.
GROUP_OVERHEAD_TOKENS = 256
GROUP_MAX_BYTES = 4 << 20
MAX_DP_DECODES = 256


class ModelRunner:
    def __init__(self, model: LlamaModel, arena: KVArena, block_size: int, group_max_bytes: int | None = None) -> None:
        self.model, self.arena, self.block_size = model, arena, block_size
        self.device = model.device
        mc = model.config
        per_token = 2 * mc.num_kv_heads * mc.head_dim * model.dtype.itemsize  # K+V, one layer
        cap = GROUP_MAX_BYTES if group_max_bytes is None else group_max_bytes
        self.group_max_tokens = max(1, cap // per_token)
        self.one_group = self.device.type != "cpu"  # GPU: one padded launch per layer
        self.window = mc.sliding_window  # sliding layers' masks are built too where a model has them

    def execute(self, chunks: list[tuple[Sequence, int]]) -> tuple[torch.Tensor, list[Sequence], list]:
        """Run the chunks in one forward; logits [M, vocab] for the M sequences they complete (to sample),
        and (sequence, positions, logits) for the chunks whose prompt tokens are scored (prompt logprobs)."""
        ids, pos, meta, rows, sampled = self.prepare(chunks)
        scored = [(s, n, scored_positions(s, n)) for s, n in chunks]
        scored = [c for c in scored if len(c[2])]
        if not scored:
            return self.model.forward(ids, pos, meta, self.arena, rows), sampled, []
        extra = []
        for s, n, p in scored:  # a chunk's tokens sit in consecutive rows, its last at self._rows[id(s)]
            first = self._rows[id(s)] - (n - 1) - s.num_computed
            extra.append(torch.arange(first + p.start, first + p.stop, device=ids.device))
        logits = self.model.forward(ids, pos, meta, self.arena, torch.cat([rows, *extra]))
        out, at = [], len(sampled)
        for (s, _, p), r in zip(scored, extra):
            out.append((s, p, logits[at : at + len(r)]))
            at += len(r)
        return logits[: len(sampled)], sampled, out

    # ------------------------------------------------------------------ batch building
    def prepare(self, chunks: list[tuple[Sequence, int]]):
        bs, dev = self.block_size, self.device
        multi = [(s, n) for s, n in chunks if n > 1]
        single = sorted(((s, n) for s, n in chunks if n == 1), key=lambda c: c[0].num_computed)
        tokens: list[int] = []
        positions: list[int] = []
        blocks: list[int] = []
        meta = AttentionMetadata(torch.empty(0), torch.empty(0))
        row_of: dict[int, int] = {}
        for seq, n in multi:
            start, row = seq.num_computed, len(tokens)
            tokens += seq.token_ids[start : start + n]
            positions += range(start, start + n)
            table = seq.block_table
            blocks += [table[p // bs] for p in range(start, start + n)]
            meta.prefills.append(self._prefill_segment(seq, row, n))
            row_of[id(seq)] = row + n - 1
        decodes = [s for s, _ in single]
        paged = self.model.paged is not None  # one kernel call over all decode rows: no groups, no padding
        one = paged or self.one_group
        groups = [decodes] if one and decodes else _group_decodes(decodes, self.group_max_tokens)
        for group in groups:
            row = len(tokens)
            for seq in group:
                p = seq.num_computed
                row_of[id(seq)] = len(tokens)
                tokens.append(seq.token_ids[p])
                positions.append(p)
                blocks.append(seq.block_table[p // bs])
            if paged:
                meta.paged = self._paged_decodes(group, row)
            else:
                meta.decodes.append(self._decode_group(group, row))
        pos = torch.tensor(positions, dtype=torch.long)
        meta.slot_blocks = torch.tensor(blocks, dtype=torch.long, device=dev)
        meta.slot_offsets = (pos % bs).to(dev)
        sampled = [s for s, n in chunks if s.num_computed + n == s.num_tokens and s.params.max_tokens > 0]
        rows = torch.tensor([row_of[id(s)] for s in sampled], dtype=torch.long, device=dev)
        self._rows = row_of
        return torch.tensor(tokens, dtype=torch.long, device=dev), pos.to(dev), meta, rows, sampled

    def _prefill_segment(self, seq: Sequence, row: int, n: int) -> PrefillSegment:
        start, w = seq.num_computed, self.window
        if start == 0 and (not w or n <= w):  # plain causal over the chunk itself
            return PrefillSegment(row, row + n, 0)
        queries = torch.arange(start, start + n, device=self.device)[:, None]
        if start == 0:
            keys = torch.arange(n, device=self.device)
            windowed = self._additive((keys <= queries) & (keys > queries - w))
            return PrefillSegment(row, row + n, 0, window_mask=windowed)
        nb = -(-(start + n) // self.block_size)
        ids = torch.tensor(_live(seq, nb), dtype=torch.long, device=self.device)
        keys = torch.arange(nb * self.block_size, device=self.device)
        allowed = keys[None, :] <= queries
        windowed = self._additive(allowed & (keys > queries - w)) if w else None
        return PrefillSegment(row, row + n, start, ids, self._additive(allowed), windowed)

    def _paged_decodes(self, seqs: list[Sequence], row: int) -> PagedDecodes:
        ctx = [s.num_computed + 1 for s in seqs]
        nb = -(-max(ctx) // self.block_size)
        rows = [s.block_table[:nb] + [0] * (nb - len(s.block_table[:nb])) for s in seqs]  # padding never read
        table = torch.tensor(rows, dtype=torch.int32)
        scores = torch.empty(self.model.config.num_heads * max(ctx), dtype=torch.float32)
        return PagedDecodes(row, row + len(seqs), table, torch.tensor(ctx, dtype=torch.int32), scores)

    def _decode_group(self, seqs: list[Sequence], row: int) -> DecodeGroup:
        ctx = [s.num_computed + 1 for s in seqs]
        nb = -(-max(ctx) // self.block_size)
        if len(seqs) == 1:  # no padding: slice the context, no mask
            ids = torch.tensor(_live(seqs[0], nb), dtype=torch.long, device=self.device)
            return DecodeGroup(row, row + 1, ids, None, ctx[0])
        table = []
        for s in seqs:
            t = _live(s, nb)
            table += t + [t[0]] * (nb - len(t))  # pad with a valid id; masked out
        keys = torch.arange(nb * self.block_size, device=self.device)
        ends = torch.tensor(ctx, device=self.device)[:, None]
        mask = self._additive(keys[None, :] < ends)[:, None, None, :]
        w = self.window
        windowed = self._additive((keys < ends) & (keys >= ends - w))[:, None, None, :] if w else None
        ids = torch.tensor(table, dtype=torch.long, device=self.device)
        return DecodeGroup(row, row + len(seqs), ids, mask, window_mask=windowed)

    def _additive(self, allowed: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(allowed.shape, dtype=self.model.dtype, device=self.device)
        return mask.masked_fill_(~allowed, float("-inf"))


def _group_decodes(seqs: list[Sequence], max_tokens: int) -> list[list[Sequence]]:
    """Split decodes (sorted by context) into groups minimising padded tokens + per-group overhead,
    each group at most `max_tokens` padded tokens (a single sequence always forms a group)."""
    n = len(seqs)
    if n <= 1:
        return [seqs] if seqs else []
    if n > MAX_DP_DECODES:  # the DP below is quadratic: split, then group each part
        h = n // 2
        return _group_decodes(seqs[:h], max_tokens) + _group_decodes(seqs[h:], max_tokens)
    ctx = [s.num_computed + 1 for s in seqs]
    best = [0.0] + [float("inf")] * n
    cut = [0] * (n + 1)
    for j in range(1, n + 1):  # best[j]: cost of grouping seqs[:j]; group (i, j] is padded to ctx[j-1]
        for i in range(j - 1, -1, -1):
            padded = (j - i) * ctx[j - 1]
            if padded > max_tokens and i < j - 1:
                break
            c = best[i] + padded + GROUP_OVERHEAD_TOKENS
            if c < best[j]:
                best[j], cut[j] = c, i
    groups, j = [], n
    while j > 0:
        groups.append(seqs[cut[j] : j])
        j = cut[j]
    return groups[::-1]


def _live(seq: Sequence, nb: int) -> list[int]:
    """`seq`'s first `nb` block ids, a freed one (outside the sliding window, masked) read as block 0."""
    table = seq.block_table[:nb]
    return [0] * seq.num_dead_blocks + table[seq.num_dead_blocks :] if seq.num_dead_blocks else table
