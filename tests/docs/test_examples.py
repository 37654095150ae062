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

import pytest

import docs_examples
import docs_setups

ROOT = Path(__file__).resolve().parents[2]

# Pages whose examples are not run yet, with the reason (the presets' pages run real
# releases' checkpoints, which tests/interop/test_presets_*.py write and test).
NOT_RUN = {
    "docs/check.md": "written before the examples convention; its command is run in tests/inspection/test_check.py",
    "docs/match.md": "written before the examples convention; tests/interop/test_match.py runs its steps",
    **{
        f"docs/presets/{p.name}": "a research release's checkpoint; tests/interop/test_presets_*.py"
        for p in (ROOT / "docs" / "presets").glob("*.md")
    },
}

# Blocks marked <!-- skip: REASON --> (a remote bucket, the suite itself...) stay few.
MAX_SKIPPED = 12


def _pages() -> list[str]:
    names = ["README.md"] + sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")
    )
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
    assert runnable >= 50


@pytest.fixture(scope="session")
def setup_dirs(tmp_path_factory):
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            root = tmp_path_factory.mktemp(f"docs-setup-{name}")
            if name in ("demo", "tf"):
                docs_setups.write_demo(root)
            if name == "tf":
                env = {**os.environ, "PYTHONPATH": str(ROOT)}
                done = subprocess.run(
                    [sys.executable, str(Path(docs_setups.__file__)), "tf", str(root)],
                    capture_output=True, text=True, env=env, timeout=600,
                )
                assert done.returncode == 0, done.stderr[-4000:]
            made[name] = root
        return made[name]

    return get


@pytest.mark.parametrize(
    "name", [n for n in PAGES if docs_examples.spec_of(_parse(n))["blocks"]]
)
def test_page_examples(name, setup_dirs, tmp_path):
    page = _parse(name)
    spec = docs_examples.spec_of(page)
    work = tmp_path / "work"
    shutil.copytree(setup_dirs(page.setup), work)
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec), encoding="utf-8")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "COLUMNS": "100",
    }
    done = subprocess.run(
        [sys.executable, str(Path(docs_examples.__file__)), str(spec_file)],
        cwd=work, capture_output=True, text=True, env=env, timeout=600,
    )
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    failed = [r for r in results if r["error"]]
    assert not failed, f"{failed[0]['where']}: {failed[0]['error']}"
    assert len(results) == len(spec["blocks"]), (
        f"{name}: the run stopped after {len(results)} of {len(spec['blocks'])} blocks\n"
        + done.stderr[-4000:]
    )
