"""The KV-reuse table printed: the setting, per workload the saturation search and one table per load,
then the goals."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

from fluidpd.bench.experiments.envelope import EnvelopePoint, describe
from fluidpd.bench.experiments.output import ms, pct, per_hour

COLUMNS = (
    "system",
    "hit",
    "oracle",
    "T2+ TTFT p50 (ms)",
    "T2+ TTFT p95 (ms)",
    "P99 TBT (ms)",
    "joint",
    "strict",
    "KV MB/req",
    "max/mean load",
    "switches",
)


def print_setting(console: Console, s: dict) -> None:
    j = s["ttft_justification"]
    console.print(
        f"[bold]KV-reuse setting[/]: {s['workers']} x {s['gpu']} (TP {s['tp']}), {s['model']} {s['dtype']}, "
        f"prefix cache on, step jitter CV {s['jitter_cv']}, SLO TTFT {s['slo_ttft_s']:g} s, "
        f"TBT {s['slo_tbt_s'] * 1e3:g} ms, context {s['context_tokens']:,} tokens"
    )
    console.print(
        f"SLO_TTFT: a cold {j['cold_prompt_tokens']:,}-token context prefills alone in {j['cold_prefill_s']:.2f} s on "
        f"one {s['gpu']} (roofline), a follow-up's {j['hit_new_tokens']:,} new tokens after a cache hit in "
        f"{j['hit_prefill_s']:.2f} s; {j['slo_ttft_s']:g} s admits up to "
        f"{j['largest_new_tokens_in_slo']:,} uncached tokens alone: a hit meets it, a cold context misses it by "
        f"{j['cold_prefill_s'] / j['slo_ttft_s']:.1f}x."
    )


def print_results(console: Console, results: dict) -> None:
    print_legend(console, results)
    for name, entry in results["workloads"].items():
        print_saturation(console, name, entry)
        for share, rows in results["kv"][name].items():
            print_load(console, name, entry, share, rows)
    print_goals(console, results["goals"])
    console.print(describe([EnvelopePoint.from_json(p) for p in results["envelope"]]))
    if "kv_host" in results:
        print_host_tier(console, results)


def print_host_tier(console: Console, results: dict) -> None:
    """The rows again with the host KV tier, and issue 37's checks on them."""
    h = results["host_tier"]
    where = "one pool per node" if h["pooled"] else "per worker"
    console.print(f"\n[bold]With a host KV tier[/] ({h['gib_per_worker']:g} GiB a worker, {where}); hit (host part)")
    for name, entry in results["workloads"].items():
        for share, rows in results["kv_host"][name].items():
            print_load(console, name, entry, share, rows)
    for w, g in h.items():
        if not isinstance(g, dict):
            continue
        detail = "" if not g["misses"] else ": " + "; ".join(g["misses"])
        console.print(
            f"(host) {w}: fluidpd hit at 0.8 {_f(g['hit_0.8'], '.1%')} (host tier {_f(g['host_hit_0.8'], '.1%')}) = "
            f"{_f(g['of_oracle_0.8'], '.1%')} of oracle (goal >= 90%); every row with the tier >= without it "
            f"(worst {g['worst_delta'] * 100:+.1f} points): {_verdict(g['met'])}{detail}"
        )
    console.print("with the tier: " + describe([EnvelopePoint.from_json(p) for p in results["envelope_host"]]))


def print_legend(console: Console, results: dict) -> None:
    """What each row imitates, once (the load tables stay narrow)."""
    seen: dict[str, str] = {}
    for loads in results["kv"].values():
        for rows in loads.values():
            for r in rows:
                seen.setdefault(r["system"], r["imitates"])
    table = Table(title="systems")
    table.add_column("system", justify="left")
    table.add_column("imitates", justify="left")
    for system, what in seen.items():
        table.add_row(system, what)
    console.print(table)


def print_saturation(console: Console, name: str, entry: dict) -> None:
    sat = entry["saturation"]
    probes = ", ".join(f"{p['load']:.3g}: {p['attainment']:.1%} ({p['best']})" for p in sat["probes"])
    reached = "" if sat["reached"] else " [red](target not reached at any probe: the lowest load tried)[/]"
    console.print(
        f"\n[bold]{name}[/] ({entry['about']}): saturation {sat['saturation_load']:.3g} {entry['knob']}{reached}; "
        f"history probes (best baseline's joint attainment): {probes}"
    )


def print_load(console: Console, name: str, entry: dict, share: str, rows: list[dict]) -> None:
    info = entry["loads"][share]
    tuned = info["tuned_on_history"]
    table = Table(
        title=f"{name} at {float(share):.0%} of saturation ({info['load']:.3g} {entry['knob']}): "
        f"{info['requests']} requests ({info['followups']} turn 2+, "
        f"{info['clipped_requests']} clipped to the context) "
        f"in {entry['window_s']:g} s; tuned on history: split {tuned['split_label']}, "
        f"chunk budget {tuned['chunk_budget']} (late-last {tuned['chunk_budget_late_last']})"
    )
    for col in COLUMNS:
        table.add_column(col, justify="left" if col == "system" else "right")
    for r in rows:
        table.add_row(*_cells(r))
    console.print(table)


def _cells(r: dict) -> tuple[str, ...]:
    return (
        r["system"],
        pct(r["hit_rate"]) + (f" ({pct(r['host_hit_rate'])})" if r.get("host_hit_rate") else ""),
        pct(r["oracle_hit_rate"]),
        ms(r["ttft_turn2_p50_s"]),
        ms(r["ttft_turn2_p95_s"]),
        ms(r["tbt_p99_s"]),
        pct(r["attainment"]),
        pct(r["strict_attainment"]),
        f"{r['kv_bytes_per_request'] / 1e6:,.1f}",
        f"{r['max_mean_load']:.2f}",
        per_hour(r["transitions"], r.get("switches_per_hour")),
    )


def _verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def _f(v: float, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def print_goals(console: Console, goals: dict) -> None:
    console.print("\n[bold]Goals (issue 26), fluidpd = fluidpd+kv-affinity[/]")
    for w, g in goals["a_hit_rate"].items():
        console.print(
            f"(a) {w}: hit at 0.8 {_f(g.get('hit_0.8'), '.1%')} = {_f(g.get('of_oracle_0.8'), '.1%')} of oracle "
            f"{_f(g.get('oracle_0.8'), '.1%')} (goal >= 95%); drop 0.5 -> 0.95 "
            f"{_f(g.get('drop_0.5_to_0.95', math.nan) * 100, '.1f')} points (goal <= 3): {_verdict(g['met'])}"
        )
    for w, loads in goals["b_turn2_ttft"].items():
        for x, g in loads.items():
            console.print(
                f"(b) {w} {x}: turn-2+ TTFT p50 {_f(g['fluidpd_p50_s'] * 1e3, ',.0f')} vs "
                f"{_f(g['versus_p50_s'] * 1e3, ',.0f')} ms "
                f"({_f(g['p50_cut'], '.0%')} lower, goal 75%), p95 {_f(g['fluidpd_p95_s'] * 1e3, ',.0f')} vs "
                f"{_f(g['versus_p95_s'] * 1e3, ',.0f')} ms ({_f(g['p95_cut'], '.0%')} lower, goal 80%) than "
                f"static-pd+shortest-queue; P99 TBT {_f(g['fluidpd_tbt_p99_s'] * 1e3, '.1f')} ms: {_verdict(g['met'])}"
            )
    for w, loads in goals["c_dominates"].items():
        for x, g in loads.items():
            detail = "" if g["met"] else ": " + "; ".join(g["misses"])
            console.print(
                f"(c) {w} {x}: fluidpd joint {g['attainment']:.1%}, strict {g['strict_attainment']:.1%} >= every "
                f"baseline within 1 point: {_verdict(g['met'])}{detail}"
            )
    for w, loads in goals["d_kv_moved"].items():
        for x, g in loads.items():
            console.print(
                f"(d) {w} {x}: KV moved {g['moved_bytes'] / 1e9:,.2f} GB = {_f(g['ratio'], '.2f')} x the new input + "
                f"generated tokens' {g['new_and_generated_bytes'] / 1e9:,.2f} GB (goal <= 1.05): {_verdict(g['met'])}"
            )
    for x, g in goals.get("e_hot_prefix", {}).items():
        console.print(
            f"(e) hot_prefix {x}: fluidpd max/mean load {g['max_mean_load']:.2f} (goal <= 1.3; pure affinity "
            f"{g['reference_max_mean_load']:.2f}), hit {g['hit_rate']:.1%} vs static-pd+cache-affinity "
            f"{g['reference_hit_rate']:.1%} ({g['hit_lost'] * 100:.1f} points lost, goal <= 5): {_verdict(g['met'])}"
        )
    console.print(f"goodput (>= 1.5x / 1.2x): {goals['goodput']}")
