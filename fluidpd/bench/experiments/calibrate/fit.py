"""The calibration fit: the A100's figures, the latency model measured on them, and the Nelder-Mead fit."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from fluidpd.core.metrics import Slo
from fluidpd.core.optimize import nelder_mead
from fluidpd.latency.config import LatencyConfig
from fluidpd.latency.roofline import RooflineModel
from fluidpd.latency.shape import StepShape
from fluidpd.policy.base import PolicyConfig
from fluidpd.sim.config import SimConfig
from fluidpd.sim.goodput import goodput_rate_scale
from fluidpd.sim.run import Setup, simulate
from fluidpd.specs.hardware import get_hardware
from fluidpd.specs.models import get_model
from fluidpd.workload.synth import fixed_lengths

GPU, MODEL, DTYPE = "a100-80g", "opt-13b", "fp16"
SEED = "DistServe (Zhong et al., OSDI'24) as quoted in ../shared/seeds/distserve.txt"
PROFILE = (
    "DistServe's simulator profile, LLMServe/DistServe simdistserve/estimators/profile_data/"
    "profiler-a100-80g.distserve.json (facebook/opt-13b; milliseconds)"
)
# (a, b, c): prefill ms = a + b * tokens + c * sum(len^2); decode ms = a + b * context tokens + c * batch
DISTSERVE_PROFILE = {
    1: {
        "prefill": (16.456860431694288, 0.09264750660897617, 6.474785740229194e-06),
        "small": (19.934702624895458, 0.0006269356524350583, 0.03850697740828398),
        "large": (7.1661889468253595, 0.0005798000403396046, 0.15831096191764046),
    },
    2: {
        "prefill": (13.402703359246601, 0.06234291581603636, 2.226884309113053e-06),
        "small": (13.294796350285385, 0.00034109219700723494, 0.06296393225243659),
        "large": (10.638741913126715, 0.00031183369638295723, 0.08562913604102729),
    },
    4: {
        "prefill": (10.965724575862776, 0.034619455295915404, 4.7511361198071533e-07),
        "small": (10.256231678259395, 0.00018786702316166354, 0.03269273629225551),
        "large": (10.483514938375274, 0.00017120888562939117, 0.04566648525887034),
    },
}
PROFILE_LARGE_BATCH = 95  # the profile's small/large batch threshold
FIG1_SLO = Slo(0.4, 0.04)
FIG1_WINDOW_S = 120.0


@dataclass(frozen=True, slots=True)
class Figure:
    """One measured figure: what it is, where it comes from, and how much the fit weighs it."""

    key: str
    source: str
    target: float
    unit: str
    weight: float  # in the fit; 0 = reported, not fitted
    tolerance: float  # relative error the shipped calibration is tested against


def _prof_prefill(tp: int, lens: list[int]) -> float:
    a, b, c = DISTSERVE_PROFILE[tp]["prefill"]
    return (a + b * sum(lens) + c * sum(n * n for n in lens)) / 1e3


def _prof_decode(tp: int, batch: int, ctx: int) -> float:
    a, b, c = DISTSERVE_PROFILE[tp]["large" if batch >= PROFILE_LARGE_BATCH else "small"]
    return (a + b * batch * ctx + c * batch) / 1e3


# fmt: off
# key, source, target, unit, weight in the fit, tolerance the tests hold the shipped knobs to. The figures
# disagree: Figure 1's prefill-only rate needs a ~120 ms prefill of 512 tokens, Figure 3(a) and the
# profile ~66-73 ms; Figure 2's 7 ms decode step is below the A100's 12.6 ms weight-streaming floor for
# a 13B FP16 model. The fit holds Figure 1 (the target); the tolerances say how far the rest land.
_ROWS = [
    ("fig1_colocated_rps", "Figure 1: colocated, 1 GPU, 512 in, 64 out, TTFT 0.4 s, TPOT 40ms", 1.6, "req/s", 100, 0.10),
    ("fig1_prefill_only_rps", "Figure 1: a GPU serving only prefill (P90 TTFT <= 0.4 s)", 5.6, "req/s", 100, 0.10),
    ("fig1_decode_only_rps", "Figure 1: a GPU serving only decode (P90 TPOT <= 40 ms)", 10.0, "req/s", 100, 0.10),
    ("fig1_2p1d_rps", "Figure 1: 2 prefill + 1 decode GPUs, joint SLOs", 10.0, "req/s", 100, 0.10),
    ("fig3a_prefill_128_tok_s", "Figure 3(a): prefill plateau, 128-token inputs (batch 16)", 9300, "tok/s", 1, 0.55),
    ("fig3a_prefill_512_tok_s", "Figure 3(a): prefill plateau, 512-token inputs (batch 4)", 7000, "tok/s", 1, 0.40),
    ("fig3a_prefill_1024_tok_s", "Figure 3(a): prefill plateau, 1,024-token inputs (batch 2)", 5400, "tok/s", 1, 0.20),
    ("fig3b_decode_b128_tok_s", "Figure 3(b): decode at batch 128, 128-token inputs", 3200, "tok/s", 1, 0.30),
    ("fig5_decode_tp1_s", "Figure 5: decode step, batch 128, input 256, 1 GPU", 0.061, "s", 1, 0.10),
    ("fig5_decode_tp2_s", "Figure 5: the same at TP 2", 0.040, "s", 1, 0.10),
    ("fig5_decode_tp8_s", "Figure 5: the same at TP 8", 0.031, "s", 1, 0.20),
    ("fig5_decode_pp8_tok_s", "Figure 5: decode throughput at PP 8 (8 micro-batches of 128)", 15000, "tok/s", 1, 0.10),
    ("fig2_added_128_s", "Figure 2: time a 128-token prefill adds to a small decode step (7 -> 14 ms)", 0.007, "s", 0.5, 1.5),
    ("fig2_added_1024_s", "Figure 2: time one 1,024-token prefill adds (10 -> 120 ms)", 0.110, "s", 0.5, 1.0),
    ("profile_prefill_512_tp1_s", "profile: prefill, 512 tokens, TP 1", _prof_prefill(1, [512]), "s", 0.5, 1.0),
    ("profile_prefill_512_tp2_s", "profile: prefill, 512 tokens, TP 2", _prof_prefill(2, [512]), "s", 0.5, 0.6),
    ("profile_prefill_512_tp4_s", "profile: prefill, 512 tokens, TP 4", _prof_prefill(4, [512]), "s", 0.5, 0.6),
    ("profile_decode_b32_tp1_s", "profile: decode, batch 32, context 512, TP 1", _prof_decode(1, 32, 512), "s", 0.5, 0.35),
    ("profile_decode_b128_tp1_s", "profile: decode, batch 128, context 256, TP 1", _prof_decode(1, 128, 256), "s", 0.5, 0.5),
    ("profile_decode_b128_tp2_s", "profile: decode, batch 128, context 256, TP 2", _prof_decode(2, 128, 256), "s", 0.5, 0.35),
    ("profile_decode_b128_tp4_s", "profile: decode, batch 128, context 256, TP 4", _prof_decode(4, 128, 256), "s", 0.5, 0.4),
]
# fmt: on
FIGURES = tuple(Figure(*row) for row in _ROWS)
RATIO_TARGET = 2.1  # Figure 1: 2P1D per-GPU goodput over colocated


def _roofline(lat: LatencyConfig, tp: int = 1, pp: int = 1) -> RooflineModel:
    return RooflineModel(get_model(MODEL, DTYPE), get_hardware(GPU), tp=tp, pp=pp, config=lat)


def _prefill_tok_s(r: RooflineModel, length: int, batch: int) -> float:
    s = StepShape()
    for _ in range(batch):
        s.add_chunk(length, 0)
    return length * batch / r.step_time(s)


def _added_by_prefill(r: RooflineModel, batch: int, ctx: int, length: int) -> float:
    decode = StepShape(decode_tokens=batch, decode_ctx=batch * ctx)
    mixed = StepShape(decode_tokens=batch, decode_ctx=batch * ctx)
    mixed.add_chunk(length, 0)
    return r.step_time(mixed) - r.step_time(decode)


def figure1(lat: LatencyConfig, window_s: float = FIG1_WINDOW_S) -> dict[str, float]:
    """Figure 1's four goodputs (req/s) in simulation with knobs `lat`, each rate simulated over
    `window_s` seconds of arrivals."""
    runs = {
        "fig1_colocated_rps": ("colocated", 1, 0, 64),
        "fig1_prefill_only_rps": ("prefill-only", 1, 0, 1),
        "fig1_decode_only_rps": ("decode-only", 1, 0, 64),
        "fig1_2p1d_rps": ("static-pd", 3, 2, 64),
    }
    out = {}
    for key, (policy, workers, prefill, output) in runs.items():
        setup = Setup(
            get_model(MODEL, DTYPE),
            get_hardware(GPU),
            FIG1_SLO,
            SimConfig(n_workers=workers, seed=0, hold_first_token=False),  # DistServe: token 1 out of prefill
            PolicyConfig(prefill_workers=prefill),
            latency=lat,
        )
        base = fixed_lengths(4000, 1.0, prompt=512, output=output, seed=0)  # 1 req/s: a rate scale is req/s

        def attainment(rate: float, policy=policy, setup=setup, base=base) -> float:
            return simulate(base.shaped(rate, window_s), policy, setup).summary["attainment"]

        out[key] = goodput_rate_scale(attainment, target=0.9, start=2.0, iters=10)
    return out


def measure(lat: LatencyConfig, window_s: float = FIG1_WINDOW_S) -> dict[str, float]:
    """The model's value of every figure with knobs `lat` (Figure 1's over `window_s` windows)."""
    r1, r2, r8 = _roofline(lat), _roofline(lat, tp=2), _roofline(lat, tp=8)
    pp8 = _roofline(lat, pp=8)
    values = figure1(lat, window_s)
    values.update(
        {
            "fig3a_prefill_128_tok_s": _prefill_tok_s(r1, 128, 16),
            "fig3a_prefill_512_tok_s": _prefill_tok_s(r1, 512, 4),
            "fig3a_prefill_1024_tok_s": _prefill_tok_s(r1, 1024, 2),
            "fig3b_decode_b128_tok_s": 128 / r1.decode_time(128, 128),
            "fig5_decode_tp1_s": r1.decode_time(128, 256),
            "fig5_decode_tp2_s": r2.decode_time(128, 256),
            "fig5_decode_tp8_s": r8.decode_time(128, 256),
            "fig5_decode_pp8_tok_s": 8 * 128 / pp8.decode_time(128, 256),
            "fig2_added_128_s": _added_by_prefill(r1, 8, 128, 128),
            "fig2_added_1024_s": _added_by_prefill(r1, 8, 1024, 1024),
        }
    )
    for tp in (1, 2, 4):
        r = _roofline(lat, tp=tp)
        values[f"profile_prefill_512_tp{tp}_s"] = r.prefill_time(512)
        if tp == 1:
            values["profile_decode_b32_tp1_s"] = r.decode_time(32, 512)
        values[f"profile_decode_b128_tp{tp}_s"] = r.decode_time(128, 256)
    return values


def ratio_2p1d(values: dict[str, float]) -> float:
    return values["fig1_2p1d_rps"] / 3 / values["fig1_colocated_rps"]


def loss(values: dict[str, float]) -> float:
    total = sum(f.weight * math.log(max(values[f.key], 1e-9) / f.target) ** 2 for f in FIGURES)
    return total + 100.0 * math.log(max(ratio_2p1d(values), 1e-9) / RATIO_TARGET) ** 2


# knob -> (to the optimiser's unbounded coordinate, back)
def _logit(lo: float, hi: float) -> tuple[Callable[[float], float], Callable[[float], float]]:
    return (lambda v: math.log((v - lo) / (hi - v)), lambda x: lo + (hi - lo) / (1 + math.exp(-x)))


_LOG = (math.log, math.exp)
KNOBS: dict[str, tuple[Callable[[float], float], Callable[[float], float]]] = {
    "mfu": _logit(0.05, 1.0),
    "attn_efficiency": _logit(0.01, 1.0),
    "bw_efficiency": _logit(0.1, 1.0),
    "kv_bw_efficiency": _logit(0.05, 1.0),
    "overlap": _logit(-1e-3, 1.001),
    "step_overhead_s": _LOG,
    "allreduce_latency_s": _LOG,
    "tp_comm_efficiency": _logit(0.05, 1.0),
}


# where the fit starts without a calibration file (Nelder-Mead finds the nearest minimum)
START = LatencyConfig(
    mfu=0.405,
    attn_efficiency=0.32,
    bw_efficiency=0.777,
    kv_bw_efficiency=0.577,
    overlap=0.613,
    step_overhead_s=0.0101,
    tp_comm_efficiency=0.739,
    allreduce_latency_s=5.9e-6,
)


def fit(
    start: LatencyConfig | None = None, iters: int = 150, progress=None, window_s: float = FIG1_WINDOW_S
) -> tuple[LatencyConfig, dict[str, float]]:
    """The knob set minimising `loss` from `start`, and its figure values (Figure 1's measured
    over `window_s` windows)."""
    start = start or START
    names = list(KNOBS)

    def config(x: list[float]) -> LatencyConfig:
        return replace(
            start,
            **{n: min(max(KNOBS[n][1](v), 0.0), 1.0) if n == "overlap" else KNOBS[n][1](v) for n, v in zip(names, x)},
        )

    x0 = [KNOBS[n][0](getattr(start, n)) for n in names]
    best, _ = nelder_mead(lambda x: loss(measure(config(x), window_s)), x0, step=0.4, iters=iters, progress=progress)
    lat = config(best)
    return lat, measure(lat, window_s)


def record(values: dict[str, float]) -> dict:
    """What the calibration file keeps besides the knobs: every figure, its fit and its error."""
    return {
        "source": SEED + "; second reference: " + PROFILE,
        "model": f"{MODEL} {DTYPE}",
        "fitted_by": "fluidpd experiment calibrate",
        "figures": [
            {
                "key": f.key,
                "source": f.source,
                "target": f.target,
                "unit": f.unit,
                "weight": f.weight,
                "tolerance": f.tolerance,
                "model": values[f.key],
                "error": values[f.key] / f.target - 1,
            }
            for f in FIGURES
        ],
        "ratio_2p1d": {"target": RATIO_TARGET, "model": ratio_2p1d(values)},
    }
