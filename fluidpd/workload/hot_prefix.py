"""Hot shared prefixes: a few long prefixes (a system prompt and a document) picked with Zipf
popularity, each request adding a unique suffix; its prompt's full blocks are named by chained hashes.

Token ids are synthetic: a prefix's are drawn from a VOCAB-token vocabulary; a suffix opens with a
token of its own (VOCAB + its request index, so no two suffixes share a block) and the rest are drawn.
Requests of one prefix then share exactly that prefix's full blocks; the block that straddles the
prefix's end and the suffix, and every block after it, belong to the request alone.
"""

from __future__ import annotations

import numpy as np

from fluidpd.core.blockhash import ROOT, block_hashes
from fluidpd.workload.arrivals import Seed, poisson
from fluidpd.workload.synth import LengthSpec, sample_lengths
from fluidpd.workload.trace import Trace

VOCAB = 128_256  # Llama 3's vocabulary: where the synthetic prefix and suffix tokens are drawn


def zipf_shares(n: int, s: float) -> np.ndarray:
    """Popularity of ranks 1..n under Zipf's law with exponent `s`: k^-s, normalised to sum to 1."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"zipf needs n >= 1 ranks, got {n!r}")
    if not (s >= 0 and np.isfinite(s)):
        raise ValueError(f"zipf exponent must be finite and >= 0, got {s}")
    weights = np.arange(1, n + 1, dtype=np.float64) ** -float(s)
    return weights / weights.sum()


def hot_prefix(
    duration_s: float = 600.0,
    rate: float = 16.0,
    *,
    n_prefixes: int = 16,
    zipf_s: float = 1.1,
    prefix_tokens: LengthSpec = ("uniform", 2048, 4096),
    suffix_tokens: LengthSpec = ("lognormal", 256, 0.5, 1024),
    output_tokens: LengthSpec = ("lognormal", 256, 0.5, 1024),
    block_size: int = 16,
    seed: Seed = 0,
) -> Trace:
    """Poisson arrivals at `rate` req/s for `duration_s` seconds; request i uses prefix k (rank k+1,
    Zipf(`zipf_s`) popularity among `n_prefixes`, its length drawn once from `prefix_tokens`) followed by
    a unique suffix (`suffix_tokens`), answered with `output_tokens`; one seed drives everything."""
    if not (duration_s > 0 and np.isfinite(duration_s)):
        raise ValueError(f"hot_prefix needs a finite duration_s > 0, got {duration_s}")
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) or block_size < 1:
        raise ValueError(f"hot_prefix needs block_size >= 1 tokens, got {block_size!r}")
    shares = zipf_shares(n_prefixes, zipf_s)
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(0, VOCAB, int(k)).tolist() for k in sample_lengths(prefix_tokens, n_prefixes, rng)]
    heads = [np.array(block_hashes(p, block_size), dtype=np.int64) for p in prefixes]
    arrival_s = poisson(rate, duration_s=duration_s, seed=rng)
    n = len(arrival_s)
    which = rng.choice(n_prefixes, size=n, p=shares)
    suffix_len, output_len = sample_lengths(suffix_tokens, n, rng), sample_lengths(output_tokens, n, rng)
    hashes = [
        _request_hashes(prefixes[k], heads[k], i, int(m), block_size, rng)
        for i, (k, m) in enumerate(zip(which, suffix_len))
    ]
    prompt_len = np.array([len(prefixes[k]) for k in which], dtype=np.int64) + suffix_len
    return Trace("hot_prefix", arrival_s, prompt_len, output_len, hashes, block_size, float(duration_s))


def _request_hashes(
    prefix: list[int], head: np.ndarray, i: int, suffix_len: int, block_size: int, rng: np.random.Generator
) -> np.ndarray:
    """Request i's block hashes: its prefix's full blocks (`head`), then those of the prefix's tail
    and its suffix (VOCAB + i, then drawn tokens) chained on."""
    tail = [*prefix[len(head) * block_size :], VOCAB + i, *rng.integers(0, VOCAB, suffix_len - 1).tolist()]
    own = block_hashes(tail, block_size, parent=int(head[-1]) if len(head) else ROOT)
    return np.concatenate([head, np.array(own, dtype=np.int64)])
