"""The scale experiment's printout: one table per cluster size, and the headline."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from fluidpd.bench.experiments.output import ms, pct


def print_results(console: Console, results: dict) -> None:
    st = results["setting"]
    tuned = results["tuned_on_8_gpu_history"]
    console.print(
        f"datacenter load from {st['source']}: {st['rate_per_gpu']:g} req/s per GPU, one population per "
        f"{st['population_gpus']} GPUs, {st['window_s']:g} s evaluated; tuned on the 8-GPU history: split "
        f"{tuned['split_label']}, chunk budget {tuned['chunk_budget']}"
    )
    for size in results["sizes"].values():
        t = Table(title=f"{size['gpus']:,} GPUs: {size['requests']:,} requests ({size['rate']:,.1f} req/s)")
        for col in (
            "system",
            "prefill",
            "joint",
            "strict",
            "P99 TTFT ms",
            "P99 TBT ms",
            "goodput/GPU",
            "switches/h",
            "KV across nodes GB",
            "tick p50 / p99 ms",
            "control ms/cycle",
        ):
            t.add_column(col, justify="left" if col == "system" else "right")
        for r in size["systems"].values():
            t.add_row(
                r["system"],
                str(r["prefill_workers"]),
                pct(r["attainment"]),
                pct(r["strict_attainment"]),
                ms(r["ttft_p99_s"]),
                ms(r["tbt_p99_s"]),
                f"{r['goodput_per_gpu']:.3f}",
                f"{r['switches_per_hour']:,.0f}",
                f"{r['kv_bytes_cross_node'] / 1e9:,.1f}",
                f"{r['tick_p50_ms']:.3f} / {r['tick_p99_ms']:.3f}",
                f"{r['control_cpu_per_cycle_ms']:.3f}",
            )
        console.print(t)


def headline(results: dict) -> str:
    g = results["goal"]
    if g.get("met") is None:
        return "headline: fluidpd's goodput per GPU needs two sizes to compare"
    sizes = results["sizes"]
    small, large = sizes[str(g["small_gpus"])]["systems"], sizes[str(g["large_gpus"])]["systems"]
    static = "static-pd 2P:6D"
    share = ""
    if static in small and static in large:
        share = f"; static-pd 2P:6D {small[static]['goodput_per_gpu']:.3f} -> {large[static]['goodput_per_gpu']:.3f}"
    return (
        f"headline: fluidpd goodput per GPU {small['fluidpd']['goodput_per_gpu']:.3f} at {g['small_gpus']} GPUs -> "
        f"{large['fluidpd']['goodput_per_gpu']:.3f} at {g['large_gpus']:,} ({g['ratio']:.1%}; goal >= 95%: "
        f"{'met' if g['met'] else 'NOT met'}){share}"
    )
