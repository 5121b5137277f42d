"""The import graph of fluidpd/, read from the source, and docs/images/packages.png drawn from it.

    python scripts/import_graph.py           # (re)draw docs/images/packages.png
    python scripts/import_graph.py --check   # exit 1 if the picture's arrows are not the source's

Every import counts: at module level, inside a function (what runs lazily still runs) and under
`if TYPE_CHECKING:` (a cycle through an annotation is still two modules that each need the other).
`from pkg import name` depends on the module `pkg.name` when it is one, else on `pkg` itself (its
__init__); a module's own parent packages are not dependencies. tests/test_architecture.py checks
this graph (no cycle, packages top-down) and that the picture's arrows, kept in the PNG's metadata
("Edges"), are the ones the source has now.

The picture: one box per package (core, specs, engine, policy, ...), an arrow from A to B where a
module of A imports one of B; each package one row above the deepest package it imports (core at
the bottom), the order within a row chosen to shorten the arrows. matplotlib only, no graphviz.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "fluidpd"
OUT = REPO / "docs" / "images" / "packages.png"


def module_name(path: Path) -> str:
    parts = ["fluidpd", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports(name: str) -> set[str]:
    """Every module (of fluidpd, or external top-level) that module `name` imports, anywhere in it."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                keep = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(keep + ([base] if base else []))
            for a in node.names:
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base)
    return found


def module_graph() -> dict[str, set[str]]:
    """module -> the fluidpd modules it imports (not itself, not its parent packages)."""
    return {m: {i for i in imports(m) if i in MODULES and not m.startswith(i + ".")} - {m} for m in MODULES}


def package(module: str) -> str:
    """The package of fluidpd a module belongs to ("" for fluidpd/__init__.py)."""
    return module.split(".")[1] if module.count(".") else ""


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp: list[str] = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def package_edges(graph: dict[str, set[str]] | None = None) -> list[tuple[str, str]]:
    """(A, B) for every package A with a module that imports a module of package B, sorted."""
    graph = module_graph() if graph is None else graph
    edges = {(package(m), package(i)) for m, deps in graph.items() for i in deps}
    return sorted((a, b) for a, b in edges if a and b and a != b)


def layers(edges: list[tuple[str, str]]) -> list[list[str]]:
    """The packages by depth (row 0: those that import no other), each row ordered to shorten the arrows."""
    nodes = sorted({n for e in edges for n in e} | {package(m) for m in MODULES if package(m)})
    deps = {n: [b for a, b in edges if a == n] for n in nodes}
    depth: dict[str, int] = {}

    def level(n: str) -> int:
        if n not in depth:
            depth[n] = 1 + max((level(d) for d in deps[n]), default=-1)
        return depth[n]

    rows: list[list[str]] = [[] for _ in range(max(level(n) for n in nodes) + 1)]
    for n in nodes:
        rows[level(n)].append(n)
    users = {n: [a for a, b in edges if b == n] for n in nodes}
    for _ in range(4):  # barycentre sweeps: up (by what a package imports), then down (by its users)
        for i in range(1, len(rows)):
            pos = {n: x for row in rows[:i] for x, n in enumerate(row)}
            rows[i].sort(key=lambda n: (_mean([pos[d] for d in deps[n] if d in pos]), n))
        for i in range(len(rows) - 2, -1, -1):
            pos = {n: x for row in rows[i + 1 :] for x, n in enumerate(row)}
            rows[i].sort(key=lambda n: (_mean([pos[u] for u in users[n] if u in pos]), n))
    return rows


def _mean(xs: list[int]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def draw(edges: list[tuple[str, str]], path: Path = OUT) -> None:
    """Write the picture, its arrows (`edges`) kept in the PNG's "Edges" metadata."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.patches import FancyArrowPatch

    rows = layers(edges)
    width = max(len(r) for r in rows)
    xy = {n: ((x + 0.5) * width / len(row), 1.6 * y) for y, row in enumerate(rows) for x, n in enumerate(row)}
    fig, ax = plt.subplots(figsize=(9.0, 0.5 + 0.8 * len(rows)), dpi=80)
    for a, b in edges:
        (x0, y0), (x1, y1) = xy[a], xy[b]
        span = round((y0 - y1) / 1.6)
        rad = 0.0 if span == 1 else 0.12 * (1 if x1 >= x0 else -1)
        ax.add_patch(
            FancyArrowPatch(
                (x0, y0 - 0.25), (x1, y1 + 0.25), arrowstyle="-|>", mutation_scale=9, lw=0.7,
                color="#1f77b4" if span == 1 else "#9aa7b4", alpha=0.9 if span == 1 else 0.55,
                connectionstyle=f"arc3,rad={rad}", shrinkA=0, shrinkB=0, zorder=1,
            )
        )  # fmt: skip
    for n, (x, y) in xy.items():
        ax.text(
            x, y, n, ha="center", va="center", fontsize=10, zorder=2,
            bbox=dict(boxstyle="round,pad=0.35", fc="#f4f1e8", ec="#555555", lw=0.8),
        )  # fmt: skip
    ax.set_xlim(-0.2, width + 0.2)
    ax.set_ylim(-0.6, 1.6 * (len(rows) - 1) + 0.6)
    ax.axis("off")
    ax.set_title("fluidpd/: an arrow A -> B where package A imports package B (blue: to the row below)", fontsize=10)
    fig.tight_layout()
    meta = {"Edges": json.dumps([list(e) for e in edges]), "Software": None}
    fig.savefig(path, metadata=meta)
    plt.close(fig)


def drawn_edges(path: Path = OUT) -> list[tuple[str, str]]:
    """The arrows the picture at `path` was drawn with (from its metadata)."""
    from PIL import Image

    with Image.open(path) as im:
        text = getattr(im, "text", {}).get("Edges", "[]")
    return [(a, b) for a, b in json.loads(text)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the picture is stale")
    args = ap.parse_args(argv)
    found = cycles(module_graph())
    if found:
        print(f"import cycles: {found}", file=sys.stderr)
        return 1
    edges = package_edges()
    if args.check:
        stale = not OUT.exists() or drawn_edges() != edges
        print(f"{OUT} is stale: run python scripts/import_graph.py" if stale else f"{OUT} is up to date")
        return int(stale)
    draw(edges)
    print(f"wrote {OUT} ({len(edges)} arrows, {OUT.stat().st_size // 1024} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
