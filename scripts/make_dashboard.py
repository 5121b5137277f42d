"""Write deploy/grafana/fluidpd-dashboard.json, the Grafana dashboard of a `fluidpd serve` (its /metrics).

    python scripts/make_dashboard.py           # (re)write the committed JSON
    python scripts/make_dashboard.py --check   # exit 1 if the committed JSON is not this script's output

Every query selects `fluidpd:` metrics of the `$model_name` variable; tests/server/test_server_dashboard.py
proves each metric and label it names is exported by a running server.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "fluidpd-dashboard.json"
DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
M = 'model_name=~"$model_name"'  # every selector's matcher
RATE = "[$__rate_interval]"
ROLES = {"1": "prefill", "2": "decode", "3": "colocated", "10": "switching"}
ROLE_COLORS = {"prefill": "blue", "decode": "green", "colocated": "purple", "switching": "orange"}


def q(expr: str, legend: str = "") -> dict:
    """One query target: a PromQL expression and its legend."""
    return {"expr": expr, "legendFormat": legend or "__auto", "datasource": DS}


def rate(name: str, labels: str = "", window: str = RATE) -> str:
    sel = f"{M}, {labels}" if labels else M
    return f"rate(fluidpd:{name}{{{sel}}}{window})"


def quantile(phi: float, histogram: str, by: str = "le") -> str:
    return f"histogram_quantile({phi}, sum by ({by}) ({rate(histogram + '_bucket')}))"


def timeseries(title: str, targets: list[dict], unit: str = "short", desc: str = "", **extra) -> dict:
    return {
        "type": "timeseries",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": unit, **extra}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
    }


def stat(title: str, expr: str, unit: str = "short", desc: str = "", mappings: list | None = None) -> dict:
    return {
        "type": "stat",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": [q(expr, title)],
        "fieldConfig": {"defaults": {"unit": unit, "mappings": mappings or []}, "overrides": []},
        "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}, "colorMode": "value"},
    }


def value_map(names: dict[str, str], colors: dict[str, str]) -> list[dict]:
    opts = {v: {"text": t, "color": colors.get(t, "text"), "index": i} for i, (v, t) in enumerate(names.items())}
    return [{"type": "value", "options": opts}]


def role_timeline() -> dict:
    """Each worker's role (1 prefill, 2 decode, 3 colocated) and a switch under way (10), over time."""
    role = " + ".join(
        f'{k} * max by (worker) (fluidpd:worker_role{{{M}, role="{r}"}})'
        for k, r in ((1, "prefill"), (2, "decode"), (3, "colocated"))
    )
    return {
        "type": "state-timeline",
        "title": "Worker roles and role switches",
        "description": "fluidpd:worker_role per worker; a second row per worker shows a FluidRole switch under way "
        "(fluidpd:worker_in_transition).",
        "datasource": DS,
        "targets": [
            q(role, "worker {{worker}}"),
            q(f"10 * max by (worker) (fluidpd:worker_in_transition{{{M}}})", "worker {{worker}} switching"),
        ],
        "fieldConfig": {
            "defaults": {"mappings": value_map(ROLES | {"0": ""}, ROLE_COLORS), "color": {"mode": "thresholds"}},
            "overrides": [],
        },
        "options": {"showValue": "never", "mergeValues": True, "rowHeight": 0.8},
    }


def worker_panels() -> list[dict]:
    return [
        role_timeline(),
        timeseries(
            "Requests running and waiting, per worker",
            [
                q(f"fluidpd:worker_num_requests_running{{{M}}}", "{{worker}} running"),
                q(f"fluidpd:worker_num_requests_waiting{{{M}}}", "{{worker}} waiting"),
                q(f"sum(fluidpd:num_requests_running{{{M}}})", "all running"),
                q(f"sum(fluidpd:num_requests_waiting{{{M}}})", "all waiting"),
            ],
        ),
        timeseries(
            "Decode step time, per worker",
            [q(f"fluidpd:worker_step_time_seconds{{{M}}}", "worker {{worker}}")],
            "s",
            "EWMA of each worker's decode step time.",
        ),
        timeseries(
            "Tokens/s",
            [
                q(f"sum by (worker) ({rate('worker_generation_tokens_total')})", "worker {{worker}}"),
                q(f"sum({rate('generation_tokens_total')})", "generated, all"),
                q(f"sum({rate('prompt_tokens_total')})", "prompt, all"),
            ],
            "short",
            "Generated tokens per second by worker and in all, and prompt tokens accepted per second.",
        ),
        timeseries(
            "FluidToken: chunks borrowed/s, per worker",
            [q(f"sum by (worker) ({rate('fluidtoken_borrowed_chunks_total')})", "worker {{worker}}")],
            "short",
            "Prefill chunks a decode worker ran for the prefill pool (FluidToken).",
        ),
        timeseries(
            "KV transfer",
            [q(f"sum({rate('kv_transfer_bytes_total')})", "between workers")],
            "Bps",
            "KV bytes hand-offs and migrations sent between workers, per second.",
        ),
    ]


def cluster_panels() -> list[dict]:
    return [
        timeseries(
            "Prefill and decode pressure (PPI, DPI)",
            [
                q(f"max(fluidpd:prefill_pressure_index{{{M}}})", "PPI"),
                q(f"max(fluidpd:decode_pressure_index{{{M}}})", "DPI"),
            ],
        ),
        timeseries(
            "Time to first token",
            [
                q(quantile(0.5, "time_to_first_token_seconds"), "p50"),
                q(quantile(0.99, "time_to_first_token_seconds"), "p99"),
            ],
            "s",
        ),
        timeseries(
            "Inter-token latency (TBT)",
            [
                q(quantile(0.5, "inter_token_latency_seconds"), "p50"),
                q(quantile(0.99, "inter_token_latency_seconds"), "p99"),
            ],
            "s",
        ),
        timeseries(
            "End-to-end request latency",
            [
                q(quantile(0.5, "e2e_request_latency_seconds"), "p50"),
                q(quantile(0.99, "e2e_request_latency_seconds"), "p99"),
            ],
            "s",
        ),
        timeseries(
            "Joint SLO attainment",
            [
                q(
                    f"sum({rate('request_slo_attained_total', window='[5m]')}) / "
                    f"sum({rate('request_success_total', window='[5m]')})",
                    "attainment (5m)",
                )
            ],
            "percentunit",
            "Finished requests meeting TTFT <= the TTFT SLO and mean TPOT <= the TBT SLO, over 5 minutes.",
            min=0,
            max=1,
        ),
        timeseries(
            "Requests finished and refused",
            [
                q(f"sum by (finish_reason) ({rate('request_success_total')})", "{{finish_reason}}"),
                q(f"sum({rate('request_rejected_overload_total')})", "refused (429 overload)"),
            ],
            "reqps",
        ),
    ]


def kv_panels() -> list[dict]:
    hits, queries = rate("prefix_cache_hits_total"), rate("prefix_cache_queries_total")
    return [
        timeseries(
            "KV cache usage, per worker",
            [q(f"fluidpd:kv_cache_usage_perc{{{M}}}", "worker {{worker}}")],
            "percentunit",
            min=0,
            max=1,
        ),
        timeseries(
            "Prefix-cached KV blocks, per worker",
            [q(f"fluidpd:kv_cached_blocks{{{M}}}", "worker {{worker}}")],
            "short",
            "Blocks each worker's prefix cache holds, in use or evictable.",
        ),
        timeseries(
            "Prefix cache hit rate",
            [
                q(f"sum by (worker) ({hits}) / sum by (worker) ({queries})", "worker {{worker}}"),
                q(
                    f"sum by (tier) ({rate('prefix_cache_tier_hits_total')}) / ignoring (tier) group_left "
                    f"sum({queries})",
                    "tier {{tier}}",
                ),
            ],
            "percentunit",
            "Prompt tokens the prefix cache held over those looked up: per worker, and in all by tier "
            "(device: the worker's arena, store: the node's KV store).",
            min=0,
            max=1,
        ),
        timeseries(
            "KV store usage",
            [q(f"max(fluidpd:kv_store_usage_perc{{{M}}})", "used")],
            "percentunit",
            "With --kv-offloading-size only.",
            min=0,
            max=1,
        ),
        timeseries(
            "KV store traffic",
            [
                q(f"sum({rate('kv_offload_bytes_total')})", "offload (arena -> store)"),
                q(f"sum({rate('kv_load_bytes_total')})", "load (store -> arena)"),
            ],
            "Bps",
            "With --kv-offloading-size only.",
        ),
        timeseries(
            "KV block residency (p50)",
            [
                q(quantile(0.5, "kv_block_reuse_gap_seconds", "le, tier"), "reuse gap, {{tier}}"),
                q(quantile(0.5, "kv_block_idle_before_evict_seconds", "le, tier"), "idle before evict, {{tier}}"),
            ],
            "s",
            "How long a cached block sat before a hit, and before it was evicted unused: evictions sooner than "
            "reuses say the cache is too small for the traffic.",
        ),
    ]


def stats() -> list[dict]:
    serving = value_map({"0": "serving", "1": "draining"}, {"serving": "green", "draining": "orange"})
    return [
        stat("Draining", f"max(fluidpd:server_draining{{{M}}})", mappings=serving),
        stat("Role switches", f"sum(increase(fluidpd:role_transitions_total{{{M}}}[$__range]))"),
        stat("Workers lost", f"sum(increase(fluidpd:worker_lost_total{{{M}}}[$__range]))"),
        stat("Requests refused", f"sum(increase(fluidpd:request_rejected_overload_total{{{M}}}[$__range]))"),
    ]


def elasticity_panels() -> list[dict]:
    return [
        timeseries(
            "Role switches and worker losses",
            [
                q(f"sum(increase(fluidpd:role_transitions_total{{{M}}}{RATE}))", "role switches"),
                q(f"sum(increase(fluidpd:worker_lost_total{{{M}}}{RATE}))", "workers lost"),
            ],
            "short",
            drawStyle="bars",
        ),
        timeseries("Draining", [q(f"max(fluidpd:server_draining{{{M}}})", "draining")], "short", min=0, max=1),
    ]


def size(panel: dict) -> tuple[int, int]:
    """(width, height) on Grafana's 24-column grid: stats 6 wide, a state timeline the whole width, else half."""
    return {"stat": (6, 4), "state-timeline": (24, 8)}.get(panel["type"], (12, 8))


def layout(rows: list[tuple[str, list[dict]]]) -> list[dict]:
    """A row panel then its panels, left to right and down; ids in that order."""
    out: list[dict] = []
    y = 0
    for title, panels in rows:
        out.append({"type": "row", "title": title, "collapsed": False, "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
        x, y, line_h = 0, y + 1, 0
        for p in panels:
            w, h = size(p)
            if x + w > 24:
                x, y, line_h = 0, y + line_h, 0
            out.append(p | {"gridPos": {"h": h, "w": w, "x": x, "y": y}})
            x, line_h = x + w, max(line_h, h)
        y += line_h
    return [p | {"id": i} for i, p in enumerate(out, start=1)]


def dashboard() -> dict:
    rows = [
        ("Cluster", stats() + cluster_panels()),
        ("Workers", worker_panels()),
        ("KV cache and store", kv_panels()),
        ("Elasticity and failures", elasticity_panels()),
    ]
    return {
        "title": "FluidPD",
        "uid": "fluidpd",
        "description": "A fluidpd serve cluster: roles, pressure, latency and SLOs, KV cache (scrape its /metrics).",
        "tags": ["fluidpd", "llm-serving"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "timepicker": {},
        "annotations": {"list": []},
        "links": [],
        "templating": {
            "list": [
                {
                    "name": "DS_PROMETHEUS",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                    "refresh": 1,
                    "options": [],
                },
                {
                    "name": "model_name",
                    "label": "Model",
                    "type": "query",
                    "datasource": DS,
                    "definition": "label_values(fluidpd:worker_role, model_name)",
                    "query": {"query": "label_values(fluidpd:worker_role, model_name)", "refId": "model_name"},
                    "refresh": 2,
                    "includeAll": True,
                    "multi": True,
                    "current": {},
                    "hide": 0,
                    "options": [],
                    "sort": 1,
                },
            ]
        },
        "panels": layout(rows),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed JSON is stale")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        stale = not OUT.exists() or OUT.read_text() != text
        print(f"{OUT} is stale: run python scripts/make_dashboard.py" if stale else f"{OUT} is up to date")
        return int(stale)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
