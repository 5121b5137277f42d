"""KV block tables per sequence over the block pool; with prefix caching, full blocks are shared by hash.

A sequence whose every token is cached (a block-aligned prompt seen before) still computes its last
token, to sample: its last block is copied into a block of its own (`copies`, applied by the engine
before the step runs) and only that token is computed, as llama.cpp and SGLang recompute one token
where vLLM recomputes the whole last block."""

from __future__ import annotations

from collections.abc import Callable

from fluidpd.core.blockhash import ROOT, block_hashes
from fluidpd.engine.block_pool import BlockPool, NoFreeBlocksError
from fluidpd.engine.sequence import Sequence

__all__ = ["NULL_BLOCK", "BlockManager", "NoFreeBlocksError", "Reservation"]

NULL_BLOCK = -1  # a table entry whose block was freed: outside every layer's sliding window

# (sequence, tokens its table must cover, cached block ids it starts with: only for a sequence without blocks)
Reservation = tuple[Sequence, int, list[int]]


class BlockManager:
    """Hands out block ids of the arena's KV pool to sequences; with `enable_caching`, a sequence's
    full computed blocks are indexed by chained hash and a new sequence can start on them. With a
    `window` (every layer attends to its last `window` tokens only, as Mistral's), blocks no later
    token reads are freed as the sequence advances (`slide`), as vLLM's sliding-window manager does."""

    def __init__(self, num_blocks: int, block_size: int, *, enable_caching: bool, window: int = 0) -> None:
        self.block_size, self.window = block_size, window
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks)
        self.on_free: Callable[[Sequence], None] | None = None  # sees a sequence's blocks before it lets go (offload)
        self.copies: list[tuple[int, int]] = []  # (cached src, own dst) for whole hits; src held until applied

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free(self) -> int:
        """Blocks an allocation can take: plain free ones and evictable cached ones."""
        return self.pool.num_free

    @property
    def num_used(self) -> int:
        return self.pool.num_blocks - self.pool.num_free

    @property
    def num_cached(self) -> int:
        return self.pool.num_cached

    @property
    def num_evictable(self) -> int:
        return self.pool.num_evictable

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def needed(self, seq: Sequence, num_tokens: int) -> int:
        """Blocks `seq` still needs so that its table covers `num_tokens` tokens."""
        return max(0, self.blocks_for(num_tokens) - len(seq.block_table))

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= self.pool.num_free

    # ------------------------------------------------------------------ prefix lookup
    def lookup(self, seq: Sequence) -> list[int]:
        """Cached block ids a sequence without blocks can start on: its longest cached full-block
        prefix (all of it, when the sequence is block-aligned: `reserve` copies the last). No side effects."""
        if not self.enable_caching or seq.block_table or seq.params.prompt_logprobs is not None:
            return []  # (prompt logprobs need every prompt token's logits: no cached prefix)
        n = seq.num_tokens // self.block_size
        return self.pool.lookup(self.hashes(seq.token_ids, n, seq.block_hashes))

    def hit_tokens(self, num_tokens: int, hits: int) -> int:
        """Tokens a sequence of `num_tokens` starting on `hits` cached blocks has computed: all but the last."""
        return min(hits * self.block_size, num_tokens - 1)

    def lookup_tokens(self, token_ids: list[int], max_blocks: int | None = None) -> list[int]:
        """Cached block ids of the longest cached full-block prefix of `token_ids` (at most `max_blocks`)."""
        if not self.enable_caching:
            return []
        n = len(token_ids) // self.block_size
        return self.pool.lookup(self.hashes(token_ids, n if max_blocks is None else min(n, max_blocks), []))

    def hashes(self, token_ids: list[int], n: int, known: list[int]) -> list[int]:
        """The first `n` chained block hashes of `token_ids`, of which `known` are already computed."""
        if len(known) >= n:
            return known[:n]
        parent = known[-1] if known else ROOT
        return known + block_hashes(token_ids[: n * self.block_size], self.block_size, len(known), parent)

    # ------------------------------------------------------------------ allocation
    def shortfall(self, wants: list[Reservation]) -> int:
        """Free blocks `reserve(wants)` would consume (new blocks, plus cached hits now evictable)."""
        new = sum(
            max(0, self.blocks_for(n) - len(s.block_table) - len(hits)) + int(self._whole(s, hits))
            for s, n, hits in wants
        )
        return new + len({b for _, _, hits in wants for b in hits if self.pool.is_evictable(b)})

    def _whole(self, seq: Sequence, hits: list[int]) -> bool:
        """`hits` cover every token of `seq`: its last block is copied so that its last token is computed."""
        return len(hits) * self.block_size >= seq.num_tokens

    def reserve(self, wants: list[Reservation]) -> None:
        """Give each sequence its cached hits, then grow its table to cover its tokens: all or
        nothing (NoFreeBlocksError). A sequence given hits starts after them (`num_computed`), or
        before its last token when they cover it all (that block goes to `copies`)."""
        need = self.shortfall(wants)
        if need > self.pool.num_free:
            ids = ", ".join(repr(s.request_id) for s, _, _ in wants)
            raise NoFreeBlocksError(f"request(s) {ids}: needs {need} more KV blocks, {self.pool.num_free} free")
        for seq, _, hits in wants:
            if hits:
                if seq.block_table or seq.num_computed:
                    raise ValueError(f"request {seq.request_id!r} already holds KV; it cannot take cached blocks")
                self.pool.share(hits)
                whole = self._whole(seq, hits)
                own = hits[:-1] if whole else hits
                seq.block_table = list(own)
                seq.block_hashes = [self.pool.hash_of[b] for b in own]
                seq.num_computed = self.hit_tokens(seq.num_tokens, len(hits))
        for seq, n, hits in wants:
            self.allocate(seq, n)
            if hits and self._whole(seq, hits):
                self.copies.append((hits[-1], seq.block_table[len(hits) - 1]))

    def apply_copies(self, copy: Callable[[list[tuple[int, int]]], None]) -> None:
        """Copy each pending whole hit's cached last block into the sequence's own block (`copy` moves the
        KV), then let go of the cached one."""
        if self.copies:
            pairs, self.copies = self.copies, []
            copy(pairs)
            self.pool.release([src for src, _ in pairs])

    def allocate(self, seq: Sequence, num_tokens: int) -> list[int]:
        """Grow `seq`'s table to cover `num_tokens` tokens (evicting cached blocks only if needed); the new ids."""
        need = self.needed(seq, num_tokens)
        if need > self.pool.num_free:
            raise NoFreeBlocksError(
                f"request {seq.request_id}: needs {need} more KV block(s), {self.pool.num_free} free"
            )
        new = self.pool.get(need)
        seq.block_table.extend(new)
        return new

    def register(self, seq: Sequence) -> None:
        """Hash and index `seq`'s full computed blocks not yet indexed; where a hash is already indexed
        under another block, `seq` takes that one and frees its own (one copy of each block)."""
        if not self.enable_caching:
            return
        full = seq.num_computed // self.block_size
        start = len(seq.block_hashes)
        if full <= start:
            return
        parent = seq.block_hashes[-1] if seq.block_hashes else ROOT
        new = block_hashes(seq.token_ids[: full * self.block_size], self.block_size, start, parent)
        for i, h in enumerate(new, start):
            own = seq.block_table[i]
            if own == NULL_BLOCK:  # (an imported sequence's dead blocks: their KV is nowhere)
                continue
            if not self.pool.cache(own, h) and self.pool.block_of[h] != own:
                seq.block_table[i] = self.pool.block_of[h]
                self.pool.share([seq.block_table[i]])
                self.pool.release([own])
        seq.block_hashes.extend(new)

    def slide(self, seq: Sequence) -> None:
        """Free `seq`'s blocks that no later token reads (every key before its window), leading first;
        cached ones stay findable. Sequences of an n > 1 request keep theirs (their tables are shared)."""
        if not self.window or seq.group is not None:
            return
        dead = max(0, seq.num_computed - self.window + 1) // self.block_size  # the next query's window starts there
        if dead > seq.num_dead_blocks:
            table = seq.block_table
            self.pool.release(table[seq.num_dead_blocks : dead])
            table[seq.num_dead_blocks : dead] = [NULL_BLOCK] * (dead - seq.num_dead_blocks)
            seq.num_dead_blocks = dead

    def free(self, seq: Sequence) -> None:
        """Drop `seq`'s references, tail first: its cached blocks stay findable, its last ones evicted first."""
        if self.on_free is not None and seq.block_hashes:
            self.on_free(seq)
        self.pool.release(seq.block_table[seq.num_dead_blocks :][::-1])
        seq.block_table, seq.num_dead_blocks = [], 0

    # ------------------------------------------------------------------ resize
    def resize(self, num_blocks: int, seqs: list[Sequence]) -> list[tuple[int, int]]:
        """Change the pool to `num_blocks` ids; (src, dst) moves for blocks that fall outside and are kept.

        Rewrites the block tables of `seqs` (every sequence holding blocks). Cached free blocks go
        first; ValueError only when the live blocks do not fit."""
        moves = self.pool.resize(num_blocks)
        remap = dict(moves)
        for s in seqs:
            if any(b in remap for b in s.block_table):
                s.block_table = [remap.get(b, b) for b in s.block_table]
        return moves
