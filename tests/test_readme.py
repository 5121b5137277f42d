"""Every example in the README runs, verbatim, and succeeds.

The quickstart block must be exactly the two-command contract (`make run`, `make test`; CI runs
the second). The server every HTTP example talks to is started with the very command `make run`
runs (read from `make -n run`), on 127.0.0.1:8000 as the examples say. Then every fenced `bash`
line runs through bash (curl examples must answer 2xx) and every `python` block runs with this
interpreter; `fluidpd` commands run from a scratch directory so their outputs land there.
The README is a front page: the reference lives in docs/ (tests/test_docs.py runs its examples).
"""

from __future__ import annotations

import pytest
from doc_examples import ROOT, check_http, check_python, commands, fenced_blocks, run

README = (ROOT / "README.md").read_text()
BLOCKS = fenced_blocks(README)
QUICKSTART = "make run"
MAX_LINES = 150

BASH = [c for lang, b in BLOCKS if lang == "bash" for c in commands(b)]
PYTHON = [b for lang, b in BLOCKS if lang == "python"]
ONLINE = [c for c in BASH if c.startswith(("curl ", "fluidpd bench ", "fluidpd top "))]
OFFLINE = [c for c in BASH if c.startswith("fluidpd ") and c not in ONLINE]


def test_the_readme_is_made_of_runnable_examples():
    assert BLOCKS and BASH and PYTHON
    quick = [b for lang, b in BLOCKS if lang == "bash" and QUICKSTART in b]
    first = [c.split(" #")[0].strip() for c in commands(quick[0])] if quick else []
    assert first == ["make run", "make test"], "the quickstart is the two commands"
    other = [c for c in BASH if c not in ONLINE + OFFLINE and not c.startswith(("make run ", "make test "))]
    assert not other, f"README commands this test does not know how to run: {other}"


def test_the_readme_is_a_front_page():
    assert len(README.splitlines()) <= MAX_LINES, "the reference belongs in docs/, the README is the front page"


@pytest.mark.slow
@pytest.mark.parametrize("example", ONLINE + PYTHON + OFFLINE)
def test_example(example, tmp_path, request):
    """Each command or python block, as written; those that talk to the server get `make run`'s."""
    if example in OFFLINE:
        res = run(example, tmp_path, timeout=900)
        assert res.returncode == 0, res.stderr[-3000:]
        return
    request.getfixturevalue("make_run_server")
    if example in PYTHON:
        check_python(example, tmp_path)
    else:
        check_http(example, run(example, tmp_path, timeout=600))
