"""A latency model fitted to a host profile (`fluidpd profile`), behind the roofline's interface.

Step time is fitted, by non-negative least squares on relative error, as

    t = dense(tokens) + rows * t_row + chunks * t_chunk + pairs * t_pair + prior * t_prior + ctx * t_ctx

dense(tokens): piecewise linear in log2(tokens) between knots 1, 2, 4, ..., non-decreasing
(weight streaming, then the GEMMs' growth, and the fixed cost of a step); rows: LM-head rows (one per chunk and
per decode token); chunks: prefill chunks (one attention call each); pairs: causal query-key
pairs of the chunks; prior: earlier-context tokens a chunk re-reads; ctx: KV tokens the decode
rows attend to. Sizes (KV bytes, capacity) stay the roofline's, from the model and hardware
specs; the profile also carries jitter, contention, KV transfer and FluidRole phase times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from fluidpd.latency.config import GRAMMAR_MASK_S
from fluidpd.latency.roofline import RooflineModel
from fluidpd.latency.shape import StepShape
from fluidpd.specs.hardware import HardwareSpec, shipped_profile
from fluidpd.specs.models import ModelSpec

LINEAR_TERMS = ("rows", "chunks", "pairs", "prior", "ctx")


def _features(s: StepShape | dict, knots: list[int]) -> list[float]:
    def g(key: str) -> float:
        return s[key] if isinstance(s, dict) else getattr(s, key)

    tok = g("prefill_tokens") + g("decode_tokens")
    hat = [0.0] * len(knots)
    x = math.log2(max(tok, 1))
    i = min(int(x), len(knots) - 2)
    f = x - i  # beyond the last knot: linear extrapolation in tokens, from the last segment
    if tok > knots[-1]:
        i, f = len(knots) - 2, 1.0 + (tok - knots[-1]) / (knots[-1] - knots[-2])
    hat[i], hat[i + 1] = 1.0 - f, f
    ramps = [sum(hat[j:]) for j in range(len(knots))]  # increments >= 0: dense() never decreases
    rows = g("prefill_seqs") + g("decode_tokens")
    return [*ramps, rows, g("prefill_seqs"), g("prefill_attn_pairs"), g("prefill_kv_read"), g("decode_ctx")]


def _nnls(a, b, iters: int = 500):
    """min |a x - b| subject to x >= 0 (Lawson-Hanson active set)."""
    import numpy as np

    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    for _ in range(iters):
        if passive.all() or w[~passive].max(initial=0.0) <= 1e-12 * max(1.0, abs(w).max()):
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
        w = a.T @ (b - a @ x)
    return x


@dataclass(frozen=True)
class StepFit:
    """Fitted step-time coefficients, and the fit's error on the points it came from."""

    knots: tuple[int, ...]
    coeffs: tuple[float, ...]
    max_rel_error: float
    mean_rel_error: float

    def __post_init__(self) -> None:  # the simulator calls the fit millions of times: precompute
        n = len(self.knots)
        object.__setattr__(self, "_dense", tuple(sum(self.coeffs[: i + 1]) for i in range(n)))

    def __call__(self, s: StepShape | dict) -> float:
        """The fitted step time (the features' dot product, computed directly)."""
        if isinstance(s, dict):
            s = StepShape(**s)
        k, d = self.knots, self._dense  # type: ignore[attr-defined]
        tok = s.prefill_tokens + s.decode_tokens
        if tok > k[-1]:
            dense = d[-1] + (d[-1] - d[-2]) * (tok - k[-1]) / (k[-1] - k[-2])
        else:
            x = math.log2(max(tok, 1))
            i = min(int(x), len(k) - 2)
            dense = d[i] + (d[i + 1] - d[i]) * (x - i)
        row, chunk, pair, prior, ctx = self.coeffs[len(k) :]
        return (
            dense
            + row * (s.prefill_seqs + s.decode_tokens)
            + chunk * s.prefill_seqs
            + pair * s.prefill_attn_pairs
            + prior * s.prefill_kv_read
            + ctx * s.decode_ctx
        )

    def terms(self) -> dict[str, float]:
        n = len(self.knots)
        dense = [sum(self.coeffs[: i + 1]) for i in range(n)]
        return {f"dense@{k}": d for k, d in zip(self.knots, dense)} | dict(zip(LINEAR_TERMS, self.coeffs[n:]))


def fit_steps(points: list[dict]) -> StepFit:
    """Fit the step-time model to profile points ({shape, seconds}), weighting by 1/seconds."""
    import numpy as np

    if len(points) < 8:
        raise ValueError(f"a step-time fit needs at least 8 profile points, got {len(points)}")
    top = max(p["shape"]["prefill_tokens"] + p["shape"]["decode_tokens"] for p in points)
    knots = [2**i for i in range(max(2, math.ceil(math.log2(max(top, 2)))) + 1)]
    a = np.array([_features(p["shape"], knots) for p in points])
    y = np.array([p["seconds"] for p in points])
    w = 1.0 / y
    scale = np.maximum(np.abs(a).max(axis=0), 1e-30)  # columns to unit size (pairs run to millions)
    x = _nnls(a * w[:, None] / scale, np.ones_like(y)) / scale
    rel = np.abs(a @ x / y - 1.0)
    return StepFit(tuple(knots), tuple(float(c) for c in x), float(rel.max()), float(rel.mean()))


class ProfiledModel(RooflineModel):
    """Step times from a host profile's fit; sizes and transfers from the roofline (one device)."""

    def __init__(self, model: ModelSpec, hw: HardwareSpec, profile: dict, tp: int = 1, pp: int = 1, **kw) -> None:
        if tp != 1 or pp != 1:
            raise ValueError(f"{hw.name} is profiled for one worker process (tp = pp = 1), got tp={tp} pp={pp}")
        spec = profile["model"].get("spec")
        if spec != model.name:
            raise ValueError(
                f"{hw.name} is profiled for {spec or profile['engine']['model']}, not {model.name}: "
                f"run `fluidpd profile` for that model"
            )
        super().__init__(model, hw, tp=1, pp=1, **kw)
        self.profile = profile
        self.fit = fit_steps(profile["steps"])

    def kv_blocks(self, block_size: int = 16, scratch_fraction: float = 0.1, scratch_bytes: float = 0.0) -> int:
        """The KV blocks of a served worker's arena (the profiled engine's default, as `fluidpd serve`
        sizes it); `capacity_kv_tokens` stays what the host's RAM could hold (placement's bound). On
        a profiled GPU, what its memory holds beside the weights (the roofline's sizing, as vLLM's)."""
        if self.profile.get("device", {}).get("type") == "cuda":
            return super().kv_blocks(block_size, scratch_fraction, scratch_bytes)
        return self.profile["model"]["kv_blocks"] * self.profile["model"]["block_size"] // block_size

    def sim_config(self, sim):
        """`sim` (a SimConfig) with this host's contention, step noise (the measured excess of its
        jitter samples, unless `sim` asks for a log-normal jitter of its own), the runtime's
        dispatch overhead, the remap time and the KV copy on the two workers of a hand-off (the
        shared-memory transport's copies are the workers' own CPU work)."""
        c, j = self.profile["contention"], self.profile["jitter"]
        dispatch, kv = self.profile.get("dispatch", {}), self.profile["kv_transfer"]
        noise = tuple(j["excess_s"]) if "excess_s" in j and not sim.step_jitter_cv else ()
        return replace(
            sim,
            contention_decode=tuple(c["decode"]),
            contention_prefill=tuple(c["prefill"]),
            contention_decode_cross=tuple(c.get("decode_cross", ())),
            contention_prefill_cross=tuple(c.get("prefill_cross", ())),
            step_jitter_cv=sim.step_jitter_cv or (0.0 if noise else step_cv(j)),
            step_noise_s=noise,
            dispatch_decode_s=dispatch.get("decode_s", 0.0),
            dispatch_prefill_s=dispatch.get("prefill_s", 0.0),
            remap_s=self.profile["fluidrole"]["shrink_s"],
            kv_export_share=kv.get("export_share", 0.0),
            kv_import_share=1.0 - kv["export_share"] if "export_share" in kv else 0.0,
            kv_offloading_bw=sim.kv_offloading_bw or kv["bandwidth_Bps"],
        )

    def step_time(self, shape: StepShape) -> float:
        if shape.prefill_tokens + shape.decode_tokens == 0:
            return 0.0
        return self.fit(shape) + shape.masked_rows * GRAMMAR_MASK_S  # (profiles are of unconstrained steps)

    def stage_time(self, shape: StepShape) -> float:
        return self.step_time(shape)


def step_cv(jitter: dict) -> float:
    """Coefficient of variation of a log-normal whose p99.9 / p50 matches the measured ratio."""
    ratio = jitter["p999_s"] / jitter["p50_s"]
    return math.sqrt(math.expm1((math.log(max(ratio, 1.0)) / 3.09) ** 2))


def latency_model(
    model: ModelSpec,
    hw: HardwareSpec,
    tp: int = 1,
    pp: int = 1,
    config=None,
    pp_link_bw: float | None = None,
    ep: int = 1,
) -> RooflineModel:
    """The step-time model for `model` on `hw`: profiled where `hw` ships a profile (a host's, or one
    GPU's: `<gpu>-measured`), else the roofline."""
    profile = shipped_profile(hw.name)
    if profile is not None:
        return ProfiledModel(model, hw, profile, tp, pp, config=config, pp_link_bw=pp_link_bw, ep=ep)
    return RooflineModel(model, hw, tp=tp, pp=pp, config=config, pp_link_bw=pp_link_bw, ep=ep)
