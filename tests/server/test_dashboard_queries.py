"""The checker behind test_server_dashboard (tests/server/promql_refs.py) on hand-written queries, so it can fail;
and the committed Grafana dashboard: the output of scripts/make_dashboard.py, a panel for every quantity
of the live view, every query readable."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from promql_refs import dashboard_refs, missing, refs, template_refs

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "fluidpd-dashboard.json"
EXPORTED = {  # sample name -> label -> values, as exported_labels reads a /metrics page
    "fluidpd:ttft_seconds_bucket": {"model_name": {"m"}, "le": {"0.5", "+Inf"}},
    "fluidpd:tier_hits_total": {"model_name": {"m"}, "worker": {"0"}, "tier": {"device", "store"}},
    "fluidpd:queries_total": {"model_name": {"m"}, "worker": {"0"}},
    "fluidpd:num_requests_running": {"model_name": {"m"}},
}


def test_a_histogram_quantile_selects_the_bucket_series_grouped_by_le():
    q = refs('histogram_quantile(0.99, sum by (le) (rate(fluidpd:ttft_seconds_bucket{model_name=~"$m"}[5m])))')
    assert [(s.name, s.matchers) for s in q.selectors] == [
        ("fluidpd:ttft_seconds_bucket", [("model_name", "=~", "$m")])
    ]
    assert q.groupings == [(("le",), frozenset({"fluidpd:ttft_seconds_bucket"}))]
    assert missing(q, EXPORTED) == []
    assert missing(q, {"fluidpd:ttft_seconds_bucket": {"model_name": {"m"}}}) == [
        "label le of fluidpd:ttft_seconds_bucket (grouped by)"
    ]
    assert missing(q, {}) == ["metric fluidpd:ttft_seconds_bucket"]


def test_groupings_are_scoped_to_what_they_aggregate_and_join_labels_to_the_query():
    q = refs(
        'sum by (tier) (rate(fluidpd:tier_hits_total{tier="store", worker!="9"}[$__rate_interval]))'
        " / ignoring (tier) group_left sum(rate(fluidpd:queries_total[1m])) by (worker)"
    )
    assert q.names == {"fluidpd:tier_hits_total", "fluidpd:queries_total"}
    assert q.groupings == [
        (("tier",), frozenset({"fluidpd:tier_hits_total"})),
        (("worker",), frozenset({"fluidpd:queries_total"})),
    ]
    assert q.joins == {"tier"}
    assert missing(q, EXPORTED) == []  # tier is on one side only: what ignoring is for


def test_the_checker_reports_a_wrong_name_label_value_grouping_or_legend():
    assert missing(refs('fluidpd:tier_hits_total{tier="disk"}'), EXPORTED) == [
        "fluidpd:tier_hits_total{tier='disk'}: no sample has that value"
    ]
    assert missing(refs('fluidpd:tier_hits_total{tier=~"dev.*|host"}'), EXPORTED) == []
    assert missing(refs('fluidpd:tier_hits_total{tier=~"dev"}'), EXPORTED) != []  # anchored, as Prometheus does
    assert missing(refs("fluidpd:tier_hit_total"), EXPORTED) == ["metric fluidpd:tier_hit_total"]
    assert missing(refs('fluidpd:queries_total{role="prefill"}'), EXPORTED) == ["label role of fluidpd:queries_total"]
    assert missing(refs("max by (worker) (fluidpd:num_requests_running)"), EXPORTED) == [
        "label worker of fluidpd:num_requests_running (grouped by)"
    ]
    q = refs("fluidpd:num_requests_running")
    q.shown = {"worker"}
    assert missing(q, EXPORTED) == ["label worker (in the legend) of none of ['fluidpd:num_requests_running']"]


def test_unreadable_queries_are_refused_not_skipped():
    for expr in ('{__name__="fluidpd:x"}', "fluidpd:x{worker}", "fluidpd:x @ 5"):
        with pytest.raises(ValueError):
            refs(expr)
    q = template_refs("label_values(fluidpd:worker_role, model_name)")
    assert q.names == {"fluidpd:worker_role"} and q.groupings == [(("model_name",), frozenset(q.names))]


def _script():
    spec = importlib.util.spec_from_file_location("make_dashboard", ROOT / "scripts" / "make_dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_dashboard_is_the_scripts_output():
    assert DASHBOARD.read_text() == _script().render(), "stale: run python scripts/make_dashboard.py"


def test_the_dashboard_charts_every_quantity_of_the_live_view():
    dash = json.loads(DASHBOARD.read_text())
    found = dashboard_refs(dash)
    queried = set().union(*(q.names for _, q in found))
    assert queried >= {
        "fluidpd:worker_role",
        "fluidpd:worker_in_transition",
        "fluidpd:worker_num_requests_running",
        "fluidpd:worker_num_requests_waiting",
        "fluidpd:kv_cache_usage_perc",
        "fluidpd:kv_cached_blocks",
        "fluidpd:prefix_cache_hits_total",
        "fluidpd:prefix_cache_queries_total",
        "fluidpd:prefix_cache_tier_hits_total",
        "fluidpd:worker_step_time_seconds",
        "fluidpd:worker_generation_tokens_total",
        "fluidpd:fluidtoken_borrowed_chunks_total",
        "fluidpd:prefill_pressure_index",
        "fluidpd:decode_pressure_index",
        "fluidpd:time_to_first_token_seconds_bucket",
        "fluidpd:inter_token_latency_seconds_bucket",
        "fluidpd:e2e_request_latency_seconds_bucket",
        "fluidpd:request_slo_attained_total",
        "fluidpd:request_success_total",
        "fluidpd:request_rejected_overload_total",
        "fluidpd:role_transitions_total",
        "fluidpd:worker_lost_total",
        "fluidpd:kv_transfer_bytes_total",
        "fluidpd:kv_store_usage_perc",
        "fluidpd:kv_offload_bytes_total",
        "fluidpd:kv_load_bytes_total",
        "fluidpd:server_draining",
    }
    assert all(n.startswith("fluidpd:") for n in queried)
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert variables == {"DS_PROMETHEUS", "model_name"}
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    assert all(p["datasource"]["uid"] == "${DS_PROMETHEUS}" for p in panels)
    in_panels = [s for where, q in found if where.startswith("panel") for s in q.selectors]
    assert all(("model_name", "=~", "$model_name") in s.matchers for s in in_panels)  # the model chosen


def test_the_prometheus_config_scrapes_a_default_fluidpd_serve():
    yaml = pytest.importorskip("yaml")
    from fluidpd.server.config import ServeConfig

    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    serve = ServeConfig()
    assert job["metrics_path"] == "/metrics" and config["global"]["scrape_interval"] == "5s"
    assert job["static_configs"] == [{"targets": [f"{serve.host}:{serve.port}"]}]
