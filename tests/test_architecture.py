"""The package structure: no import cycles, packages depend top-down, pure packages stay pure,
functions stay short, files hold one concept each (and stay small), and docs/images/packages.png shows
the packages' imports as they are.

The import graph is scripts/import_graph.py's (one parser for the checks and the picture): every
import counts, at module level, inside a function (what runs lazily still runs) and under
`if TYPE_CHECKING:` (a cycle through annotations is still two modules that each need the other;
a protocol or a module both import takes the place of such an import). `from pkg import name`
depends on the module `pkg.name` when it is one, else on `pkg` itself (its __init__); a module's
own parent packages are not dependencies.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path


def _script():
    path = Path(__file__).resolve().parents[1] / "scripts" / "import_graph.py"
    spec = importlib.util.spec_from_file_location("import_graph", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("import_graph", module)
    spec.loader.exec_module(module)
    return module


IG = _script()
ROOT, MODULES, imports, top = IG.ROOT, IG.MODULES, IG.imports, IG.package
GRAPH = IG.module_graph()
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
# a function (def line to its last line, docstring included) longer than this is split along its steps
MAX_FUNCTION_LINES = 50
LONG_FUNCTIONS: dict[str, str] = {}  # "module:function" -> why it stays long (keep this tiny)
# a module (a file: one concept) longer than this is split along its concepts
MAX_FILE_LINES = 300
# "module" -> why it stays whole though longer: only a file that truly is one concept (keep this tiny;
# none today)
LONG_FILES: dict[str, str] = {}


def test_no_import_cycles():
    found = IG.cycles(GRAPH)
    assert not found, (
        "import cycles (move what both need to a module both import, or read it through a protocol):\n"
        + "\n".join(" <-> ".join(c) for c in found)
    )


def test_the_cycle_finder_finds_cycles():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e2"}, "e2": {"e"}, "f": {"d"}}
    assert sorted(IG.cycles(g)) == [["a", "b", "c"], ["e", "e2"]]
    assert IG.cycles({"a": {"b"}, "b": set()}) == []


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
    assert "fluidpd.policy.fluidconfig" in GRAPH["fluidpd.policy.base"]  # under TYPE_CHECKING


def _functions():
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno is not None
                yield f"{name}:{node.name}", node.end_lineno - node.lineno + 1


def test_functions_are_short():
    long = {f: n for f, n in _functions() if n > MAX_FUNCTION_LINES}
    bad = [f"{f}: {n} lines" for f, n in sorted(long.items()) if f not in LONG_FUNCTIONS]
    assert not bad, f"functions over {MAX_FUNCTION_LINES} lines (split them along their steps):\n" + "\n".join(bad)
    assert not set(LONG_FUNCTIONS) - set(long), "LONG_FUNCTIONS lists a function that is no longer long"


def test_files_are_small():
    lines = {name: len(path.read_text().splitlines()) for name, path in MODULES.items()}
    long = {m: n for m, n in lines.items() if n > MAX_FILE_LINES}
    bad = [f"{m}: {n} lines" for m, n in sorted(long.items()) if m not in LONG_FILES]
    assert not bad, f"files over {MAX_FILE_LINES} lines (split them along their concepts):\n" + "\n".join(bad)
    assert not set(LONG_FILES) - set(long), "LONG_FILES lists a file that is no longer long"


def test_the_package_picture_is_the_source_s():
    assert IG.drawn_edges() == IG.package_edges(GRAPH), (
        "docs/images/packages.png is stale: run python scripts/import_graph.py"
    )
    assert IG.OUT.stat().st_size <= 150 * 1024
    assert ("cli", "bench") in IG.package_edges(GRAPH) and ("core", "engine") not in IG.package_edges(GRAPH)
