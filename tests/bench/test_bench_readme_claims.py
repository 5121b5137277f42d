"""benchmarks/readme_claims.py knows how to rerun every command the README's claims table names, each
claim finds its one row, and --list shows them with their README dates (nothing is run here: the
claims take hours)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "readme_claims.py"


def load():
    spec = importlib.util.spec_from_file_location("readme_claims", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def test_every_command_the_readme_names_is_a_claim_with_one_row():
    rc = load()
    rows = rc.readme_rows((ROOT / "README.md").read_text())
    assert len(rows) >= 8
    for claim in rc.CLAIMS:
        rc.row_of(claim, rows)  # exactly one row, else LookupError
        script = next((a for a in claim.argv if a.startswith("benchmarks/")), None)
        assert script is None or (ROOT / script).is_file(), script
    named = {cmd for r in rows for cmd in re.findall(r"`([^`]+)`", r.commands)}
    covered = {cmd for cmd in named if any(cmd == c.row.strip("`") for c in rc.CLAIMS)}
    assert named == covered, f"README commands with no claim to rerun them: {sorted(named - covered)}"


def test_a_row_is_dated_by_the_newest_date_it_quotes():
    rc = load()
    row = rc.Row("c", "x (2026-12-02); y (2026-12-04)", "`benchmarks/x.py`")
    assert rc.age(row, rc.dt.date(2026, 12, 10)) == "2026-12-04, 6 days old"
    assert rc.age(rc.Row("c", "no date", "`x`"), rc.dt.date(2026, 12, 10)) == "undated"


def test_list_shows_every_claim_and_runs_nothing():
    out = subprocess.run([sys.executable, str(SCRIPT), "--list"], capture_output=True, text=True, check=True).stdout
    rc = load()
    for claim in rc.CLAIMS:
        assert claim.name in out
    assert out.strip().splitlines()[-1].startswith(f"{len(rc.CLAIMS)} claims")
