"""The package structure: no import cycles, packages depend top-down, pure packages stay pure.

Every import counts, at module level or inside a function (what runs lazily still runs), except
those under `if TYPE_CHECKING:`. `from pkg import name` depends on the module `pkg.name` when it is
one, else on `pkg` itself (its __init__); a module's own parent packages are not dependencies.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "fluidpd"
# package -> the packages it may import (besides itself); read top-down: cli and bench on top
ALLOWED = {
    "core": set(),
    "specs": {"core"},
    "latency": {"core", "specs"},
    "workload": {"core"},
    "policy": {"core"},
    "world": {"core", "latency", "policy"},
    "sim": {"core", "specs", "latency", "workload", "policy", "world"},
    "placement": {"core", "specs", "latency", "workload", "policy", "world", "sim"},
    "engine": {"core"},
    "runtime": {"core", "latency", "policy", "world", "engine"},
    "server": {"core", "engine", "runtime"},
    "bench": set(),  # below: everything but cli
    "cli": set(),
}
ALLOWED["bench"] = {p for p in ALLOWED if p not in ("bench", "cli")}
ALLOWED["cli"] = ALLOWED["bench"] | {"bench"}
PURE = ("core", "specs", "latency", "workload", "policy", "world", "sim", "placement")  # no torch, no engine


def module_name(path: Path) -> str:
    parts = ["fluidpd", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(name: str) -> set[str]:
    """Every module (of fluidpd, or external top-level) that module `name` imports."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    stack: list[ast.AST] = [ast.parse(path.read_text())]
    while stack:
        node = stack.pop()
        if _type_checking(node):
            continue
        stack.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            for a in node.names:
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base)
    return found


GRAPH = {m: {i for i in imports(m) if i in MODULES and not m.startswith(i + ".")} - {m} for m in MODULES}


def top(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def test_no_import_cycles():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for m in sorted(GRAPH):
        if m not in index:
            visit(m)
    assert not cycles, f"import cycles: {cycles}"


def test_packages_depend_top_down():
    assert set(ALLOWED) == {top(m) for m in MODULES if top(m)}, "a package is missing from ALLOWED"
    bad = [
        f"{m} -> {i}"
        for m, deps in GRAPH.items()
        for i in deps
        if top(m) and top(i) and top(i) != top(m) and top(i) not in ALLOWED[top(m)]
    ]
    assert not bad, "imports against the layering:\n" + "\n".join(sorted(bad))


def test_pure_packages_never_import_torch_or_the_engine():
    bad = [
        f"{m} -> {i}"
        for m in MODULES
        if top(m) in PURE
        for i in imports(m)
        if i.split(".")[0] in ("torch", "transformers") or top(i) in ("engine", "runtime", "server")
    ]
    assert not bad, "\n".join(sorted(bad))


def test_the_checker_sees_lazy_and_relative_imports():
    assert "fluidpd.engine.engine" in GRAPH["fluidpd.runtime.build"]  # imported inside a function
    assert "fluidpd.core.registry" in GRAPH["fluidpd.policy.registry"]
    assert "fluidpd.policy.fluidconfig" not in GRAPH["fluidpd.policy.base"]  # TYPE_CHECKING only
