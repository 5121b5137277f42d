"""The docs' figures: every image a docs page references exists and is small, and `make figures` resolves."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from doc_examples import ROOT

DOCS = ROOT / "docs"
MAX_BYTES = 150_000
IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")


def references() -> list[tuple[str, str, str]]:
    """(page, alt text, target) of every Markdown image in docs/*.md."""
    return [(p.name, alt, target) for p in sorted(DOCS.glob("*.md")) for alt, target in IMAGE.findall(p.read_text())]


def test_the_docs_show_figures():
    assert len(references()) >= 10


@pytest.mark.parametrize(("page", "alt", "target"), references(), ids=lambda x: str(x)[:40])
def test_every_referenced_image_exists_small_and_described(page, alt, target):
    path = (DOCS / target).resolve()
    assert path.is_file(), f"{page}: {target} does not exist"
    assert path.stat().st_size <= MAX_BYTES, f"{page}: {target} is {path.stat().st_size} bytes (> {MAX_BYTES})"
    assert len(alt.split()) >= 3, f"{page}: {target}'s alt text should say what it shows"


def test_every_image_in_docs_images_is_small():
    for path in (DOCS / "images").glob("*.png"):
        assert path.stat().st_size <= MAX_BYTES, f"{path.name} is {path.stat().st_size} bytes"


def test_make_figures_resolves():
    out = subprocess.run(["make", "-n", "figures"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "scripts/make_figures.py" in out


def test_make_figures_lists_its_parts_and_figures():
    out = subprocess.run(
        [sys.executable, "scripts/make_figures.py", "--list"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    for line in out.splitlines():
        if line.startswith("docs/images/") and "drawn from" not in line:
            name = line.split()[0]
            assert name.endswith(".png")
    referenced = {t.split("/")[-1] for _, _, t in references()}
    made = {line.split()[0].split("/")[-1] for line in out.splitlines() if line.startswith("docs/images/")}
    assert made <= referenced | {"scale.png"}, f"made but never shown: {made - referenced}"
