"""Every code example of README.md and docs/ runs (the convention: tests/docs_examples.py).

Each page runs in a process of its own, in a fresh copy of its setup's directory
(tests/docs_setups.py; the TensorFlow-written setup is made once, by one TensorFlow
process). A block that fails names its page and line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import docs_examples
import docs_setups
import pytest

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


def _setup(name: str, root: Path) -> subprocess.Popen | None:
    """Write the setup's files; a TensorFlow-written setup's process, started, is returned."""
    if name in ("demo", "tf"):
        docs_setups.write_demo(root)
    if name not in ("tf", "releases"):
        return None
    return subprocess.Popen(
        [sys.executable, str(Path(docs_setups.__file__)), name, str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


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
        proc = _setup(name, root)
        if proc is not None:
            writing.append((name, proc))
    for name, proc in writing:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"setup {name}:\n{err[-4000:]}"
    groups: list[list[dict]] = [[], []]  # TensorFlow's pages, transformers' pages
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


@pytest.mark.parametrize("name", [n for n in PAGES if docs_examples.spec_of(_parse(n))["blocks"]])
def test_page_examples(name, page_results):
    results, stderr = page_results[name]
    failed = [r for r in results if r["error"]]
    assert not failed, f"{failed[0]['where']}: {failed[0]['error']}"
    expected = len(docs_examples.spec_of(_parse(name))["blocks"])
    assert len(results) == expected, (
        f"{name}: the run stopped after {len(results)} of {expected} blocks\n" + stderr[-4000:]
    )
