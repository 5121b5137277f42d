"""What `fluidpd top` reads and draws: `/v1/admin/cluster` fetched, and one frame of it (rich)."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request

from rich.console import Group
from rich.table import Table
from rich.text import Text

SPARKS = "▁▂▃▄▅▆▇█"
ROLE_STYLE = {"prefill": "bold magenta", "decode": "bold cyan", "colocated": "bold green"}


class TopError(RuntimeError):
    """The server cannot be read: unreachable, the key refused, or not a FluidPD server (a plain message)."""


def fetch(url: str, key: str | None, timeout_s: float = 5.0) -> dict:
    """The server's `/v1/admin/cluster`, or TopError saying plainly why not."""
    req = urllib.request.Request(url.rstrip("/") + "/v1/admin/cluster")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            hint = (
                "pass --api-key (or set FLUIDPD_ADMIN_KEY)" if not key else "check --api-key: it is not the admin key"
            )
            raise TopError(f"{url} refused the key (HTTP {exc.code}): {hint}") from None
        if exc.code == 404:
            raise TopError(f"{url} has no /v1/admin/cluster: is it a FluidPD server (fluidpd serve)?") from None
        raise TopError(f"{url} answered HTTP {exc.code}: {_message(exc)}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TopError(f"cannot reach {url} ({reason}): is `fluidpd serve` running there?") from None
    except json.JSONDecodeError:
        raise TopError(f"{url}/v1/admin/cluster did not answer JSON: is it a FluidPD server?") from None


def _message(exc: urllib.error.HTTPError) -> str:
    try:
        return json.loads(exc.read())["error"]["message"]
    except Exception:  # noqa: BLE001 - any body: the status says enough
        return exc.reason


def sparkline(values: list[float], width: int = 40) -> str:
    """`values` (the last `width`) as block characters scaled to their largest."""
    vals = [v if v is not None and math.isfinite(v) else 0.0 for v in values[-width:]]
    top = max(vals, default=0.0)
    if top <= 0:
        return SPARKS[0] * len(vals)
    return "".join(SPARKS[min(len(SPARKS) - 1, int(v / top * (len(SPARKS) - 1) + 0.5))] for v in vals)


def render(snap: dict, prev: dict | None = None, error: str | None = None):
    """One frame: the cluster line, PPI/DPI sparklines, the last minute, a row per worker, the switches."""
    parts: list = []
    if error:
        parts.append(Text(f"! {error} (showing the last answer; retrying)", style="bold red"))
    state = snap.get("state") or "-"
    head = Text.assemble(
        ("FluidPD ", "bold"),
        f"{snap.get('model', '?')} · policy {snap.get('policy', '?')} · state {state} · "
        f"{len(snap.get('workers', []))} workers · up {snap.get('now_s', 0):.0f} s · "
        f"{snap.get('outstanding', 0)} in flight",
    )
    if snap.get("draining"):
        head.append("  DRAINING", style="bold yellow")
    if snap.get("workers_down"):
        head.append(f"  down: {snap['workers_down']}", style="bold red")
    parts.append(head)
    hist = snap.get("history") or {}
    for name in ("ppi", "dpi"):
        series = hist.get(name) or []
        now = snap.get(name)
        line = Text(f"{name.upper()} {_num(now):>6}  ", style="bold")
        line.append(sparkline(series, 60), style="yellow" if name == "ppi" else "blue")
        line.append(f"  max {_num(max(series, default=0.0))} over {len(series)} s", style="dim")
        parts.append(line)
    parts.append(_recent(snap.get("recent") or {}, snap.get("slo") or {}))
    parts.append(_workers(snap, prev))
    parts.extend(_events(snap))
    return Group(*parts)


def _recent(r: dict, slo: dict) -> Text:
    if not r:
        return Text("last minute: -")
    return Text(
        f"last {r.get('window_s', 60):.0f} s: {r.get('finished', 0)} finished · "
        f"TTFT p50 {_s(r.get('ttft_p50_s'))} p99 {_s(r.get('ttft_p99_s'))} (SLO {_s(slo.get('ttft_s'))}) · "
        f"TBT p50 {_ms(r.get('tbt_p50_s'))} p99 {_ms(r.get('tbt_p99_s'))} (SLO {_ms(slo.get('tbt_s'))}) · "
        f"joint {_pct(r.get('attainment'))} strict {_pct(r.get('strict_attainment'))} · "
        f"refused {r.get('refused', 0)} · failed {r.get('failed', 0)}"
    )


def _workers(snap: dict, prev: dict | None) -> Table:
    t = Table(expand=False, show_edge=False, pad_edge=False)
    for col in ("worker", "role", "switch", "run", "wait", "KV used", "cached", "hit", "step", "tok/s", "borrowed"):
        t.add_column(col, justify="left" if col in ("role", "switch") else "right")
    before = {w["id"]: w for w in (prev or {}).get("workers", [])}
    dt = snap.get("now_s", 0) - (prev or {}).get("now_s", 0) if prev else 0
    for w in snap.get("workers", []):
        role = w.get("role", "?")
        tr = w.get("transition")
        switch = f"→{tr['to']} ({tr['phase']})" if tr else ("" if w.get("routable", True) else "unroutable")
        used, total = w.get("kv_blocks_used", 0), w.get("kv_blocks_total", 0) or 1
        pc = w.get("prefix_cache") or {}
        rate = "-"
        old = before.get(w["id"])
        if old is not None and dt > 0 and w.get("tokens_out", 0) >= old.get("tokens_out", 0):
            rate = f"{(w.get('tokens_out', 0) - old.get('tokens_out', 0)) / dt:.1f}"
        t.add_row(
            str(w["id"]),
            Text(role, style=ROLE_STYLE.get(role, "")),
            Text(switch, style="bold yellow"),
            str(w.get("running", w.get("decoding", 0))),
            str(w.get("waiting", w.get("queue", 0))),
            f"{used}/{total} {used / total:.0%}",
            str(pc.get("cached_blocks", 0)),
            _pct(pc.get("hit_rate")),
            _ms(w.get("step_time_ewma_s")),
            rate,
            str(w.get("borrowed_chunks", 0)),
        )
    return t


def _events(snap: dict) -> list:
    out: list = []
    switches = snap.get("transitions") or []
    if switches:
        out.append(Text("role switches (latest last):", style="bold"))
        for tr in switches[-5:]:
            took = f"done in {tr['total_s']:.2f} s" if tr.get("done") and tr.get("total_s") is not None else tr["phase"]
            out.append(
                Text(
                    f"  t={tr['began_s']:.1f} s worker {tr['worker']} {tr['from']}→{tr['to']} ({tr['reason']}): {took}"
                )
            )
    losses = snap.get("losses") or []
    if losses:
        out.append(Text("worker failures:", style="bold red"))
        for x in losses[-5:]:
            out.append(Text(f"  t={x['at_s']:.1f} s worker {x['worker']}: {x['reason']} ({x['restarted']} restarted)"))
    return out


def _num(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _s(x) -> str:
    return "-" if x is None else f"{x:.2f} s"


def _ms(x) -> str:
    return "-" if x is None else f"{x * 1e3:.0f} ms"


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1%}"
