"""benchmarks/ has a folder per what a script measures, docs/benchmarks.md a section per folder with
that folder's rows, and every benchmark path the README and docs/ name exists."""

import re

from benchscript import BENCHMARKS

ROOT = BENCHMARKS.parent
# folder -> its section of docs/benchmarks.md
GROUPS = {
    "engine": "The engine",
    "runtime": "The runtime and the server",
    "simulation": "The simulator, placement and the control plane",
    "peers": "Against peers",
}


def test_every_script_is_in_a_group_but_the_claims_runner():
    assert {p.name for p in BENCHMARKS.glob("*.py")} == {"readme_claims.py"}
    assert {p.name for p in BENCHMARKS.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(GROUPS)
    names = [p.name for p in BENCHMARKS.glob("*/*.py")]
    assert len(names) == len(set(names)), "a script name in two groups"  # tests load scripts by name


def test_each_group_has_its_section_and_its_rows_are_there():
    parts = re.split(r"^## (.+)\n", (ROOT / "docs" / "benchmarks.md").read_text(), flags=re.M)
    sections = dict(zip(parts[1::2], parts[2::2], strict=True))
    for group, heading in GROUPS.items():
        rows = [line for line in sections[heading].splitlines() if line.startswith("| `benchmarks/")]
        assert rows, heading
        for row in rows:
            for path in re.findall(r"benchmarks/[\w/]+\.py", row.split(" | ")[0]):
                assert path.startswith(f"benchmarks/{group}/"), f"{path} is a row of {heading!r}"


def test_every_benchmark_path_the_docs_name_exists():
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for path in re.findall(r"\bbenchmarks/[a-z0-9_/]+\.(?:py|png|yaml|jsonl)\b", page.read_text()):
            assert (ROOT / path).is_file(), f"{page.name} names {path}"
