"""The examples of the README and docs/*.md run or parse, and every relative link of the README and docs/ resolves.

README: every example runs, verbatim, and succeeds. Its quickstart block must be exactly the two-command
contract (`make run`, `make test`; CI runs the second). Every fenced `bash` line runs through bash (curl
examples must answer 2xx) and every `python` block runs with this interpreter; `fluidpd` commands run
from a scratch directory so their outputs land there. The README is a front page: the reference lives in
docs/. (One file with the docs' examples: both talk to `make run`'s server on port 8000, and `make test`'s
pytest workers each take whole files.)

docs:
Every fenced `bash` and `python` block of a docs page is tested; its first line says how (the
convention is written down for docs writers in docs/index.md, "The examples on these pages are
tested"):

* no marker: each command runs as written from a scratch directory and must succeed (commands that
  finish in under a minute; RUN_TIMEOUT_S leaves room for a busy machine);
* `# parse-only` (or `# parse-only: why`): each command is a `fluidpd` command line, parsed by
  `fluidpd.cli.build_parser()` (flags and values must exist) and not run;
* `# server`: the block talks to `make run`'s server, which the test starts (as for the README's examples).

Blocks in any other language (`text`) are not run. Links: every `[text](target)` outside code
whose target is not a URL must name an existing file, and its `#anchor`, when it names a Markdown
file, one of that file's headings.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from doc_examples import ROOT, check_http, check_python, commands, fenced_blocks, run

DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
RUN_TIMEOUT_S = 900  # a hang guard: a one-minute example can take several on a loaded host
MODES = {"# parse-only": "parse", "# server": "server"}
HTTP_COMMANDS = ("curl ", "fluidpd bench ", "fluidpd top ")  # what a `# server` block may run


@dataclass(frozen=True)
class Example:
    page: str
    lang: str
    mode: str  # run | parse | server
    body: str

    @property
    def commands(self) -> list[str]:
        return commands(self.body) if self.lang == "bash" else [self.body]


def mode(body: str) -> str:
    first = body.split("\n", 1)[0].strip()
    return next((m for marker, m in MODES.items() if first == marker or first.startswith(marker + ":")), "run")


EXAMPLES = [
    Example(page.name, lang, mode(body), body)
    for page in PAGES
    for lang, body in fenced_blocks(page.read_text())
    if lang in ("bash", "python")
]


def cases(wanted: str) -> list:
    """(language, command or python block) of every example in mode `wanted`."""
    return [
        pytest.param(ex.lang, cmd, id=f"{ex.page}:{cmd[:60] if ex.lang == 'bash' else f'python{i}'}")
        for i, ex in enumerate(EXAMPLES)
        if ex.mode == wanted
        for cmd in ex.commands
    ]


def test_every_example_is_one_this_test_knows():
    assert {ex.mode for ex in EXAMPLES} == {"run", "parse", "server"}
    for ex in EXAMPLES:
        for cmd in ex.commands if ex.lang == "bash" else []:
            if ex.mode == "server":
                assert cmd.startswith(HTTP_COMMANDS), f"{ex.page}: not an HTTP example: {cmd}"
            else:
                assert cmd.startswith("fluidpd "), f"{ex.page}: only fluidpd commands run or parse here: {cmd}"
        if ex.lang == "python":
            assert ex.mode != "parse", f"{ex.page}: a python block runs (no marker) or talks to the server"


@pytest.mark.parametrize("lang,cmd", cases("parse"))
def test_parse_only_command(lang, cmd, capsys):
    from fluidpd.cli import build_parser

    argv = shlex.split(cmd, comments=True)[1:]
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"`{cmd}` does not parse (exit {exc.code}): {capsys.readouterr().err}")
    assert callable(args.func)


@pytest.mark.slow
@pytest.mark.parametrize("lang,cmd", cases("run"))
def test_example_runs(lang, cmd, tmp_path):
    if lang == "python":
        check_python(cmd, tmp_path, timeout=RUN_TIMEOUT_S)
    else:
        res = run(cmd, tmp_path, timeout=RUN_TIMEOUT_S)
        assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.usefixtures("make_run_idle")
@pytest.mark.parametrize("lang,cmd", cases("server"))
def test_example_against_the_server(lang, cmd, tmp_path):
    if lang == "python":
        check_python(cmd, tmp_path)
    else:
        check_http(cmd, run(cmd, tmp_path, timeout=600))


# links: [text](target) and ![alt](target), outside fenced blocks and inline code
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*$", re.M)


def prose(text: str) -> str:
    return re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))


def anchors(page: Path) -> set[str]:
    """The heading ids MkDocs gives a page (Python-Markdown's toc slugify on the heading's text)."""
    from markdown.extensions.toc import slugify

    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slugify(h.replace("`", ""), "-") for h in HEADING.findall(text)}


def links() -> list:
    out = []
    for page in [ROOT / "README.md", *PAGES]:
        for target in LINK.findall(prose(page.read_text())):
            if not re.match(r"[a-z][a-z0-9+.-]*:", target):
                out.append(pytest.param(page, target, id=f"{page.name}->{target}"))
    return out


@pytest.mark.parametrize(("page", "target"), links())
def test_relative_link_resolves(page: Path, target: str):
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    assert dest.exists(), f"{page.name}: {target} names no file"
    if anchor and dest.suffix == ".md":
        assert anchor in anchors(dest), f"{page.name}: {target}: no heading with that id in {dest.name}"


def test_every_page_is_in_the_nav():
    def names(nav) -> set[str]:
        if isinstance(nav, str):
            return {nav}
        items = nav.values() if isinstance(nav, dict) else nav
        return set().union(*(names(i) for i in items))

    nav = names(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    assert nav == {p.name for p in PAGES}


# ---------------------------------------------------------------------- the README
README = (ROOT / "README.md").read_text()
BLOCKS = fenced_blocks(README)
QUICKSTART = "make run"
MAX_LINES = 110
MAX_CLAIM_WORDS = 45

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
    claims = README[README.index("## Where the numbers come from") :].split("\n## ")[0]
    rows = [r for r in claims.splitlines() if r.startswith("| ") and not r.startswith(("| claim", "| ---"))]
    assert len(rows) >= 8
    for row in rows:  # today's figure, its date and command; the history lives in docs/benchmarks.md
        assert len(row.replace("|", " ").split()) < MAX_CLAIM_WORDS, row
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", row), f"undated claim: {row}"


@pytest.mark.slow
@pytest.mark.parametrize("example", ONLINE + PYTHON + OFFLINE)
def test_example(example, tmp_path, request):
    """Each command or python block, as written; those that talk to the server get `make run`'s."""
    if example in OFFLINE:
        res = run(example, tmp_path, timeout=900)
        assert res.returncode == 0, res.stderr[-3000:]
        return
    request.getfixturevalue("make_run_idle")
    if example in PYTHON:
        check_python(example, tmp_path)
    else:
        check_http(example, run(example, tmp_path, timeout=600))
