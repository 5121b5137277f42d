"""A served runtime's step log (`fluidpd serve --step-log`) against the simulator's latency model.

`step_check` compares, per step kind, the engine time and the wall time of the logged steps with
the model's prediction for the same shapes (slowed by the host's contention for the steps running
when each was sent). `speed_level` turns that into the step scales (`SimConfig.step_scale_*`) that
make the model match those steps: calibrating the simulator on a window the runtime served.
"""

from __future__ import annotations

import numpy as np

from fluidpd.runtime.steplog import StepRecord
from fluidpd.sim.config import SimConfig
from fluidpd.sim.run import Setup


def step_check(records: list[StepRecord], setup: Setup) -> dict:
    """Per step kind: the steps, the median ratios of engine time and of wall time to the
    prediction (and the p99 of the wall's), the median wall - engine and idle times, the median
    share of a core and the mean number of busy workers; and the coordinator's CPU in cores."""
    model = setup.roofline()
    sim = model.sim_config(setup.sim)
    out: dict = {}
    for kind in ("decode", "prefill", "mixed"):
        rs = [r for r in records if r.kind == kind]
        if not rs:
            continue
        scale = sim.step_scale_decode if kind == "decode" else sim.step_scale_prefill
        pred = np.array([model.step_time(r.shape) * scale * contention(sim, r) for r in rs])
        engine, wall = np.array([r.engine_s for r in rs]), np.array([r.wall_s for r in rs])
        out[kind] = {
            "steps": len(rs),
            "engine/pred_p50": float(np.median(engine / pred)),
            "wall/pred_p50": float(np.median(wall / pred)),
            "wall/pred_p99": float(np.percentile(wall / pred, 99)),
            "wall-engine_p50_ms": float(np.median(wall - engine) * 1e3),
            "idle_p50_ms": float(np.median([r.idle_s for r in rs]) * 1e3),
            "core_share_p50": float(np.median([r.engine_cpu_s / r.engine_s for r in rs])),
            "busy_mean": float(np.mean([r.busy for r in rs])),
        }
    if records:
        span = records[-1].start_s + records[-1].wall_s - records[0].start_s
        out["coordinator_cores"] = (records[-1].coordinator_cpu_s - records[0].coordinator_cpu_s) / max(span, 1e-9)
    return out


def contention(sim: SimConfig, r: StepRecord) -> float:
    """The model's slowdown of a logged step, from the kinds of the steps running when it was sent."""
    decode = r.kind == "decode"
    return sim.contention(decode, r.busy, r.busy_prefill if decode else r.busy - r.busy_prefill)


def speed_level(records: list[StepRecord], setup: Setup) -> dict:
    """The step scales that fit `records`: the median engine time over the model's prediction of
    the decode-only steps, and of the prefill-carrying kind (prefill or mixed) with more steps;
    1.0 for a kind the log has none of."""
    c = step_check(records, setup)
    prefill = [c[k] for k in ("prefill", "mixed") if k in c]
    level = max(prefill, key=lambda x: x["steps"])["engine/pred_p50"] if prefill else 1.0
    return {"decode": c["decode"]["engine/pred_p50"] if "decode" in c else 1.0, "prefill": level}
