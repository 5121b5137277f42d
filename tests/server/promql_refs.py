"""What a PromQL query refers to, and whether a /metrics page exports it: the metric names it selects, the
labels of its matchers (with their literal values), of its `by`/`without` clauses (scoped to the metrics
aggregated) and of its `on`/`ignoring`/`group_left`/`group_right` clauses. Grafana variables (`$name`,
`$__rate_interval`) are placeholders, never checked as values. Enough PromQL for a dashboard, not all of it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

TOKEN = re.compile(
    r"""(?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    |(?P<range>\[[^\]]*\])
    |(?P<var>\$\{?\w+\}?)
    |(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)
    |(?P<ident>[A-Za-z_:][\w:]*)
    |(?P<op>=~|!~|!=|==|>=|<=|[-+*/%^<>=(){},])
    |(?P<ws>\s+)""",
    re.X,
)
AGGREGATIONS = frozenset(
    {"sum", "avg", "min", "max", "count", "group", "stddev", "stdvar"}
    | {"topk", "bottomk", "quantile", "count_values", "limitk", "limit_ratio"}
)
GROUPING = frozenset({"by", "without"})
JOINING = frozenset({"on", "ignoring", "group_left", "group_right"})
KEYWORDS = GROUPING | JOINING | {"bool", "and", "or", "unless", "offset", "atan2"}
LABEL_VALUES = re.compile(r"^\s*label_values\(\s*([A-Za-z_:][\w:]*)\s*(\{[^}]*\})?\s*,\s*(\w+)\s*\)\s*$")


@dataclass
class Selector:
    """A metric selector: `name{label op "value", ...}`."""

    name: str
    matchers: list[tuple[str, str, str]] = field(default_factory=list)  # (label, op, value)


@dataclass
class Refs:
    """What one query refers to."""

    selectors: list[Selector] = field(default_factory=list)
    groupings: list[tuple[tuple[str, ...], frozenset[str]]] = field(default_factory=list)  # (labels, metrics)
    joins: set[str] = field(default_factory=set)  # labels of on / ignoring / group_left / group_right
    shown: set[str] = field(default_factory=set)  # labels a legend shows (`{{label}}`)

    @property
    def names(self) -> set[str]:
        return {s.name for s in self.selectors}


def tokens(expr: str) -> list[tuple[str, str]]:
    """(kind, text) of every token but whitespace (ValueError on a character PromQL has no use for)."""
    out, pos = [], 0
    while pos < len(expr):
        m = TOKEN.match(expr, pos)
        if m is None:
            raise ValueError(f"cannot read {expr[pos : pos + 20]!r} in {expr!r}")
        if m.lastgroup != "ws":
            out.append((m.lastgroup or "", m.group()))
        pos = m.end()
    return out


def _closing(toks: list[tuple[str, str]], i: int) -> int:
    """The index of the `)` or `}` closing the bracket at `i`."""
    depth = 0
    for j in range(i, len(toks)):
        if toks[j][1] in "({":
            depth += 1
        elif toks[j][1] in ")}":
            depth -= 1
            if depth == 0:
                return j
    raise ValueError("unbalanced brackets")


def _labels(toks: list[tuple[str, str]], i: int) -> tuple[tuple[str, ...], int]:
    """The label list `( a, b )` at `i` (none there: empty), and the index after it."""
    if i >= len(toks) or toks[i][1] != "(":
        return (), i
    j = _closing(toks, i)
    return tuple(t for k, t in toks[i + 1 : j] if k == "ident"), j + 1


def _matchers(toks: list[tuple[str, str]], i: int) -> tuple[list[tuple[str, str, str]], int]:
    """The matchers `{ label op "value", ... }` at `i`, and the index after them."""
    j = _closing(toks, i)
    body = [t for t in toks[i + 1 : j] if t[1] != ","]
    if len(body) % 3 or any(body[k][0] != "ident" or body[k + 2][0] != "str" for k in range(0, len(body), 3)):
        raise ValueError(f"cannot read the matchers {' '.join(t for _, t in toks[i : j + 1])}")
    return [(body[k][1], body[k + 1][1], body[k + 2][1][1:-1]) for k in range(0, len(body), 3)], j + 1


def refs(expr: str) -> Refs:
    """Every metric, matcher and clause label `expr` refers to."""
    toks = tokens(expr)
    out = Refs()
    spans: list[tuple[tuple[str, ...], int, int]] = []  # (grouping labels, first, last token of the aggregated)
    where: list[tuple[int, Selector]] = []
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        nxt = toks[i + 1][1] if i + 1 < len(toks) else ""
        if kind == "op" and text == "{":
            raise ValueError(f"a selector without a metric name in {expr!r}")
        if kind != "ident":
            i += 1
        elif text in GROUPING:
            labels, after = _labels(toks, i + 1)
            if toks[i - 1][1] == ")":  # sum (...) by (labels)
                first = next(k for k in range(i - 1, -1, -1) if toks[k][1] == "(" and _closing(toks, k) == i - 1)
                spans.append((labels, first, i - 1))
            else:  # sum by (labels) (...)
                spans.append((labels, after, _closing(toks, after)))
            i = after
        elif text in JOINING:
            labels, i = _labels(toks, i + 1)
            out.joins.update(labels)
        elif text in AGGREGATIONS and nxt == "(":
            end = _closing(toks, i + 1)
            if end + 1 >= len(toks) or toks[end + 1][1] not in GROUPING:
                spans.append(((), i + 1, end))
            i += 1
        elif nxt == "(" or text in KEYWORDS or (text in AGGREGATIONS and nxt in GROUPING):  # not a metric
            i += 1
        else:
            sel = Selector(text)
            where.append((i, sel))
            out.selectors.append(sel)
            i += 1
            if nxt == "{":
                sel.matchers, i = _matchers(toks, i)
    for labels, first, last in spans:
        out.groupings.append((labels, frozenset(s.name for k, s in where if first <= k <= last)))
    return out


def template_refs(query: str) -> Refs:
    """A Grafana template query `label_values(metric{...}, label)`: the metric and both labels."""
    m = LABEL_VALUES.match(query)
    if m is None:
        raise ValueError(f"not a label_values(metric, label) query: {query!r}")
    found = refs(m.group(1) + (m.group(2) or ""))
    found.groupings.append(((m.group(3),), frozenset({m.group(1)})))
    return found


def _value_ok(op: str, value: str, values: set[str]) -> bool:
    if "$" in value or op in ("!=", "!~"):
        return True  # a Grafana variable, or a matcher that anything missing satisfies
    if op == "=~":
        return any(re.fullmatch(value, v) for v in values)
    return value in values


def missing(query: Refs, exported: dict[str, dict[str, set[str]]]) -> list[str]:
    """What `query` refers to that a /metrics page does not export: `exported` is sample name -> label ->
    values ({} for none)."""
    out = []
    for s in query.selectors:
        if s.name not in exported:
            out.append(f"metric {s.name}")
            continue
        for label, op, value in s.matchers:
            if label not in exported[s.name]:
                out.append(f"label {label} of {s.name}")
            elif not _value_ok(op, value, exported[s.name][label]):
                out.append(f"{s.name}{{{label}{op}{value!r}}}: no sample has that value")
    for labels, names in query.groupings:
        for name in sorted(names & exported.keys()):
            out += [f"label {lb} of {name} (grouped by)" for lb in labels if lb not in exported[name]]
    have = set().union(*(exported[n].keys() for n in query.names if n in exported))
    out += [f"label {lb} (matched on) of none of {sorted(query.names)}" for lb in sorted(query.joins - have)]
    out += [f"label {lb} (in the legend) of none of {sorted(query.names)}" for lb in sorted(query.shown - have)]
    return out


def exported_labels(families) -> dict[str, dict[str, set[str]]]:
    """Sample name -> label -> values, from prometheus_client.parser.text_string_to_metric_families."""
    out: dict[str, dict[str, set[str]]] = {}
    for fam in families:
        for sample in fam.samples:
            labels = out.setdefault(sample.name, {})
            for k, v in sample.labels.items():
                labels.setdefault(k, set()).add(v)
    return out


def dashboard_refs(dashboard: dict) -> list[tuple[str, Refs]]:
    """(where, refs) of every query of a Grafana dashboard: its panels' targets (with their legends' labels),
    rows' collapsed panels included, and its query variables."""
    out = []
    panels = list(dashboard.get("panels", []))
    while panels:
        p = panels.pop(0)
        panels += p.get("panels", [])
        for t in p.get("targets", []):
            found = refs(t["expr"])
            found.shown = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", t.get("legendFormat", "")))
            out.append((f"panel {p.get('title')!r}: {t['expr']}", found))
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            query = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            out.append((f"variable ${v['name']}: {query}", template_refs(query)))
    return out
