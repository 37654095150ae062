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


def test_a_page_is_one_terminal(tmp_path):
    """The commands go to one bash as written: what one exports the next command and the
    page's Python see; what the page starts in the background ends with the page."""
    page = _page(
        tmp_path,
        "```console\n"
        "$ export GREETING='hello  there'\n"
        "$ printf '%s|' \"$GREETING\" a#b > greeting.txt   # a comment, to bash\n"
        "$ sleep 300 > /dev/null 2>&1 &\n"
        "$ echo $! > sleeper.pid\n"
        "```\n\n"
        "```python\n"
        "import os, pathlib\n"
        "assert os.environ['GREETING'] == 'hello  there'\n"
        "assert pathlib.Path('greeting.txt').read_text() == 'hello  there|a#b|'\n"
        "```\n",
    )
    results = _run(tmp_path, page)
    assert [r["error"] for r in results] == [None, None]
    pid = int((tmp_path / "work" / "sleeper.pid").read_text())
    stat = Path(f"/proc/{pid}/stat")
    # Gone, or a zombie its new parent has not reaped yet.
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_memory_store_does_not_outlive_a_command(tmp_path):
    """Each command is a process of its own, as in a terminal: what one writes to
    `memory://` is gone for the next (an example that relies on it fails)."""
    page = _page(
        tmp_path,
        "```python\nimport numpy as np, tfckpt\n"
        "tfckpt.save({'w': np.zeros(3, np.float32)}, 'ckpt/model')\n```\n\n"
        "```console\n"
        "$ tfckpt convert ckpt/model memory://bucket/out/ --dtype float16\n"
        "$ tfckpt dump memory://bucket/out/\n"
        "```\n",
    )
    results = _run(tmp_path, page)
    assert results[0]["error"] is None
    assert "`$ tfckpt dump memory://bucket/out/` exited 2, not 0" in results[1]["error"]


TABLE = """<!-- examples: setup=none -->

| I want to … | command | tutorial |
| --- | --- | --- |
| know the version | `tfckpt --version`, then `tfckpt.open` in Python; `fp16/` | [x](x.md) |
| compare | `tfckpt diff a/ b/` | [y](y.md) |
"""


def test_a_task_table_runs_its_command_column(tmp_path):
    page = _page(tmp_path, TABLE)
    assert [b.lang for b in page.blocks] == [docs_examples.TABLE]
    assert [s for _, s in docs_examples.table_spans(page.blocks[0].text)] == [
        "tfckpt --version",
        "tfckpt.open",
        "fp16/",
        "tfckpt diff a/ b/",
    ]
    assert docs_examples.problems(page) == []
    results = _run(tmp_path, page)
    assert "`tfckpt diff a/ b/` exited 2" in results[0]["error"]  # no a/ here
    page = _page(tmp_path, TABLE.replace("tfckpt diff a/ b/", "tfckpt --version"))
    assert [r["error"] for r in _run(tmp_path, page)] == [None]
    page = _page(tmp_path, TABLE.replace("`tfckpt.open`", "`tfckpt.nowhere`"))
    assert "nowhere" in _run(tmp_path, page)[0]["error"]
    page = _page(tmp_path, TABLE.replace("`fp16/`", "`--include REGEX`"))
    assert "`--include REGEX` in the command column" in docs_examples.problems(page)[0]


def test_escaped_pipes_are_found_where_they_would_be_pasted():
    text = (
        "| a | b |\n| --- | --- |\n| x | `--include '^(a1\\|b1)/'` |\n\n"
        "Write `\\|` in a table, or `a|b` outside one; `grep 'a\\|b'` pastes badly.\n\n"
        "```console\n$ tfckpt dump x --filter 'a\\|b'\n```\n"
    )
    found = docs_examples.escaped_pipes(text, "p.md")
    assert [f.split(":")[1] for f in found] == ["3", "5", "8"], found
