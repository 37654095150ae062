"""Every code example of README.md and docs/ runs (the convention: tests/docs_examples.py).

Each page runs in a process of its own, in a fresh copy of its setup's directory
(tests/docs_setups.py; the TensorFlow-written setup is made once, by one TensorFlow
process). A block that fails names its page and line.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import docs_examples
import docs_setups
import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # the package's own dependency there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]

# Pages whose examples are not run, with the reason (none now).
NOT_RUN: dict[str, str] = {}

# Blocks marked <!-- skip: REASON --> (a remote bucket, the suite itself...) stay few.
MAX_SKIPPED = 10


def _pages() -> list[str]:
    names = ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))
    return [n for n in names if n not in NOT_RUN]


PAGES = _pages()


def _parse(name: str) -> docs_examples.Page:
    return docs_examples.parse(ROOT / name, name)


def test_convention():
    """Every block is run, written as a file, plain output, or marked with a reason."""
    found, skipped = [], []
    for name in PAGES:
        page = _parse(name)
        assert page.setup in docs_setups.SETUPS, f"{name}: unknown setup {page.setup!r}"
        found += docs_examples.problems(page)
        skipped += [f"{b.where}: {b.skip}" for b in page.blocks if b.skip is not None]
    assert not found, "\n".join(found)
    assert len(skipped) <= MAX_SKIPPED, "too many examples not run:\n" + "\n".join(skipped)


def test_runnable_blocks_exist():
    """The examples test tests something: most pages have examples that run."""
    runnable = sum(len(docs_examples.spec_of(_parse(n))["blocks"]) for n in PAGES)
    assert runnable >= 80


def test_no_code_holds_an_escaped_pipe():
    """No code on any page holds `\\|`, and no table's code span a `|`: pasted from the
    file or from a rendering that keeps the backslash, `'^(a1\\|b1)/'` matches nothing."""
    found = []
    for name in PAGES:
        found += docs_examples.escaped_pipes((ROOT / name).read_text(encoding="utf-8"), name)
    assert not found, "\n".join(found)


def test_readme_task_table_is_run_as_pasted():
    """The README's "I want to …" table is one of its runnable blocks: every code span of
    its command column is a command run as it reads, an API name, or one word."""
    page = _parse("README.md")
    tables = [b for b in page.blocks if b.lang == docs_examples.TABLE]
    assert len(tables) == 1 and tables[0].skip is None
    spans = docs_examples.table_spans(tables[0].text)
    kinds = [docs_examples.span_kind(span) for _, span in spans]
    assert None not in kinds, [s for (_, s), k in zip(spans, kinds) if k is None]
    assert kinds.count("command") >= 20  # every row has one
    rows = {k for k, _ in spans}
    assert len(rows) == len(tables[0].text.splitlines()) - 2
    assert tables[0].where in [b["where"] for b in docs_examples.spec_of(page)["blocks"]]


# The words a page's examples use for its inputs: the top-level entries of its setup's
# directory (tests/docs_setups.py), and what the page's prose must say about each.
INPUTS = {
    "demo": {"demo-out": "make demo"},
    "tf": {
        "demo-out": "make demo",
        **{name: None for name in ("A", "B", "run", "tf1", "tf2", "v1", "keras")},
    },
}


def _prose(text: str) -> str:
    """A page without its fenced blocks and its task tables."""
    out, fence = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence and not line.lstrip().startswith("|"):
            out.append(line)
    return "\n".join(out)


def test_pages_state_their_input():
    """A page whose examples use a file of its setup names it in its prose (`A/model.ckpt`,
    `run/`...), and a page on what `make demo` writes says so: a reader knows what to
    have before pasting."""
    missing = []
    for name in PAGES:
        page = _parse(name)
        used = "\n".join(b["text"] for b in docs_examples.spec_of(page)["blocks"])
        prose = _prose((ROOT / name).read_text(encoding="utf-8"))
        for entry, needs in INPUTS.get(page.setup, {}).items():
            if not re.search(rf"(?<![\w./#-]){re.escape(entry)}/", used):
                continue
            if not re.search(rf"`{re.escape(entry)}/[^`]*`", prose):
                missing.append(f"{name}: uses {entry}/ without naming it in its prose")
            if needs and needs not in prose:
                missing.append(f"{name}: uses {entry}/ without saying it is what `{needs}` writes")
    assert not missing, "\n".join(missing)


def _extras() -> dict[str, list[str]]:
    """pyproject.toml's extras: {name: the distributions each installs}."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    extras = data["project"]["optional-dependencies"]
    return {
        name: [re.match(r"[A-Za-z0-9_.-]+(\[[^\]]*\])?", r)[0] for r in reqs]
        for name, reqs in extras.items()
    }


def test_every_extra_is_listed_with_what_it_installs():
    """The README's install block and Getting started's table list every extra of
    pyproject.toml, in the form that works in a clone (`pip install '.[report]'`), each
    with the distributions it installs."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index("## Install")
    install = readme[start : readme.index("\n## ", start + 1)]
    table = {}
    for line in (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8").splitlines():
        cells = docs_examples.table_cells(line) if line.startswith("| `") else []
        if len(cells) == 3:
            table[cells[0].strip("`")] = cells[1]
    missing = []
    for name, dists in _extras().items():
        if name not in table:
            missing.append(f"getting-started.md: no row for the extra {name!r}")
        if name != "dev" and f"pip install '.[{name}]'" not in install:
            missing.append(f"README.md: no `pip install '.[{name}]'`")
        # Another extra included (`tfckpt[test-core]`) is named as that extra.
        named = []
        for dist in dists:
            included = re.fullmatch(r"tfckpt\[(.*)\]", dist)
            named += [f"`{n}`" for n in included[1].split(",")] if included else [dist]
        for dist in named:
            if dist.lower() not in table.get(name, "").lower():
                missing.append(f"getting-started.md: the {name!r} row does not name {dist}")
            if name != "dev" and dist.strip("`").lower() not in install.lower():
                missing.append(f"README.md: the {name!r} line does not name {dist}")
    assert not missing, "\n".join(missing)


def _start(specs: list[dict], where: Path) -> subprocess.Popen:
    where.write_text(json.dumps(specs), encoding="utf-8")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "COLUMNS": "100",
    }
    return subprocess.Popen(
        [sys.executable, str(Path(docs_examples.__file__)), str(where)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.fixture(scope="session")
def page_results(tmp_path_factory):
    """Every page's examples, run once: {page: (block results, the process's stderr)}.

    Pages that choose Keras' backend run in processes of their own, pages that load
    their output in transformers one after another in another, the others one after
    another in one process (TensorFlow imported once), all side by side.
    """
    pytest.importorskip("tensorflow")  # the `tf` setup, and pages that restore with it
    base = tmp_path_factory.mktemp("docs-examples")
    pages = [p for p in map(_parse, PAGES) if docs_examples.spec_of(p)["blocks"]]
    setups = {name: base / f"setup-{name}" for name in sorted({p.setup for p in pages})}
    writing = []  # the TensorFlow-written setups, side by side
    for name, root in setups.items():
        root.mkdir()
        proc = docs_setups.start(name, root)
        if proc is not None:
            writing.append((name, proc))
    for name, proc in writing:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"setup {name}:\n{err[-4000:]}"
    groups: list[list[dict]] = [[], []]  # TensorFlow's pages, transformers' pages
    if os.environ.get("TFCKPT_TEST_CORE") == "1":  # what it leaves out is not installed
        pages = [p for p in pages if not docs_examples.markers(p)]
    for i, page in enumerate(pages):
        work = base / f"page-{i}"
        shutil.copytree(setups[page.setup], work)
        spec = {**docs_examples.spec_of(page), "cwd": str(work)}
        if docs_examples.needs_own_process(page):
            groups.append([spec])
        elif docs_examples.uses_transformers(page):
            groups[1].append(spec)
        else:
            groups[0].append(spec)
    runs = [(g, _start(g, base / f"specs-{k}.json")) for k, g in enumerate(groups) if g]
    results: dict[str, tuple[list[dict], str]] = {}
    for group, proc in runs:
        out, err = proc.communicate(timeout=900)
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        for spec in group:
            results[spec["page"]] = ([r for r in lines if r["page"] == spec["page"]], err)
    return results


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            n, marks=[getattr(pytest.mark, m) for m in sorted(docs_examples.markers(page))]
        )
        for n, page in ((n, _parse(n)) for n in PAGES)
        if docs_examples.spec_of(page)["blocks"]
    ],
)
def test_page_examples(name, page_results):
    results, stderr = page_results[name]
    failed = [r for r in results if r["error"]]
    assert not failed, f"{failed[0]['where']}: {failed[0]['error']}"
    expected = len(docs_examples.spec_of(_parse(name))["blocks"])
    assert len(results) == expected, (
        f"{name}: the run stopped after {len(results)} of {expected} blocks\n" + stderr[-4000:]
    )
