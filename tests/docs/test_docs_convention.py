"""The examples convention itself (tests/docs_examples.py): what runs, what fails, what is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import docs_examples

ROOT = Path(__file__).resolve().parents[2]

PAGE = """# A page
<!-- examples: setup=demo -->

```console
$ tfckpt --version
tfckpt ...
```

<!-- file: notes/x.toml -->
```toml
a = 1
```

<!-- skip: a bucket -->
```python
raise SystemExit("never run")
```

```text
plain output, not run
```

```python
import pathlib
assert pathlib.Path("notes/x.toml").read_text() == "a = 1\\n"
```
"""


def _page(tmp_path, text):
    path = tmp_path / "page.md"
    path.write_text(text, encoding="utf-8")
    return docs_examples.parse(path, "page.md")


def _run(tmp_path, page):
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    specs = tmp_path / "specs.json"
    specs.write_text(json.dumps([{**docs_examples.spec_of(page), "cwd": str(work)}]))
    done = subprocess.run(
        [sys.executable, docs_examples.__file__, str(specs)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_a_page_parses_and_runs(tmp_path):
    page = _page(tmp_path, PAGE)
    assert page.setup == "demo"
    assert [b.lang for b in page.blocks] == ["console", "toml", "python", "text", "python"]
    assert page.blocks[2].skip == "a bucket" and page.blocks[1].file == "notes/x.toml"
    assert docs_examples.problems(page) == []
    results = _run(tmp_path, page)
    assert [r["error"] for r in results] == [None, None, None]  # console, file, python


def test_wrong_output_exit_status_and_exceptions_fail(tmp_path):
    for body, message in [
        ("```console\n$ tfckpt --version\ntfckpt 99\n```\n", "expected line not found"),
        ("```console\n$ tfckpt dump nowhere/\n```\n", "exited 2, not 0"),
        ("```console\n$ tfckpt --version  # exit status 1\n```\n", "exited 0, not 1"),
        ("```python\nassert 1 == 2\n```\n", "AssertionError"),
    ]:
        results = _run(tmp_path, _page(tmp_path, body))
        assert results and message in results[0]["error"], (body, results)


def test_unmarked_blocks_of_other_languages_are_refused(tmp_path):
    page = _page(tmp_path, "```sh\nls\n```\n\n```\nx\n```\n\n<!-- skip:  -->\n```python\n1\n```\n")
    found = docs_examples.problems(page)
    assert len(found) == 3 and "```sh" in found[0] and "without a reason" in found[2]


def test_a_mark_is_a_comment_alone_on_its_line(tmp_path):
    page = _page(tmp_path, "Write `<!-- skip: x -->` before a block.\n\n```python\n1\n```\n")
    assert page.blocks[0].skip is None
