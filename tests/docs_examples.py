"""The documentation's code examples: found in the Markdown, run in order, page by page.

The convention (docs/reference/tested.md, "The examples on this site"):

- ```` ```python ```` blocks run, in order, in one namespace per page;
- ```` ```console ```` blocks run their ``$ COMMAND`` lines (a line ending in ``\\``
  continues on the next) as a user pastes them: the text after ``$ ``, continuation lines
  and comments included, goes unchanged to bash, one bash per page (a terminal: what one
  command exports or starts in the background, the next sees), in the page's directory
  with ``tfckpt`` and ``python`` on its PATH. The lines after a command, up to the next
  ``$``, are output it must print (stdout and stderr together): each line, in order, must
  equal a line of its output (``...`` in a line matches any text; runs of spaces count as
  one); none given, only the exit status is checked. A command expects exit status 0, or
  N when it ends with ``# exit status N`` (a comment to bash). What the page started in
  the background is ended with the page;
- ```` ```python ```` blocks see the environment the page's bash has exported so far (a
  Python started from that terminal);
- a task table (a Markdown table whose first column is "I want to …", the README's)
  runs the code spans of its ``command`` column, in order, in the page's bash, each
  exactly as it reads: a span that starts with ``tfckpt `` is a command (exit status 0;
  1 too for ``tfckpt diff``, whose 1 means "they differ"), a span ``tfckpt.NAME...``
  names the Python API and must resolve; any other span must be one word (a path, an
  option, a URL scheme). No code span of a table holds a ``|``, escaped or not (a
  Markdown table needs ``\\|`` there, which pastes as a backslash and a pipe), and no
  code anywhere holds ``\\|`` (:func:`escaped_pipes`);
- ```` ```toml ````, ```` ```json ```` or ```` ```text ```` blocks preceded by
  ``<!-- file: NAME -->`` are written to NAME before the next block runs; other
  ``text`` blocks are output or listings and do not run;
- ``<!-- skip: REASON -->`` just before a python or console block keeps it from running;
  the test counts these and asks for a reason;
- any other fence (``sh``, ``bash``, none) is an error: an example is either run or
  marked.

A page's setup (``<!-- examples: setup=NAME -->``, see docs_setups.py) is the directory
its examples run in, a fresh copy per page. Run as a script (``python docs_examples.py
SPECS.json``), this module is that run: page after page, each in its directory with a
namespace of its own, in one process (so TensorFlow is imported once); it prints one JSON
line per block.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import json
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

TABLE = "table"  # a task table ("I want to …") and its `command` column
RUNNABLE = {"python", "console", TABLE}
FILES = {"toml", "json", "text"}

_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\s*$")
# A mark is a comment alone on its line.
_MARK = re.compile(r"\s*<!--\s*(?P<kind>skip|file|examples):\s*(?P<value>.*?)\s*-->\s*")
_EXIT = re.compile(r"#\s*exit status (\d+)\s*$")
_SPAN = re.compile(r"`([^`]+)`")
_API_NAME = re.compile(r"tfckpt(\.\w+)+")
_TABLE_RULE = re.compile(r"^\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")


@dataclasses.dataclass
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    skip: str | None = None  # the reason, when marked
    file: str | None = None  # where a file block goes

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


@dataclasses.dataclass
class Page:
    path: str
    setup: str
    blocks: list[Block]


def parse(path: Path, name: str) -> Page:
    """The page's setup and its fenced blocks, with the marks just before each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    setup, blocks, pending = "none", [], {}
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _MARK.fullmatch(line)
        if m:
            if m["kind"] == "examples":
                setup = m["value"].removeprefix("setup=").strip()
            else:
                pending[m["kind"]] = m["value"]
        fence = _FENCE.match(line)
        if not fence and _command_column(lines, i) is not None:
            start = i
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                i += 1
            text = "\n".join(lines[start:i]) + "\n"
            blocks.append(Block(name, start + 1, TABLE, text, skip=pending.get("skip")))
            pending = {}
            continue
        if not fence:
            if line.strip() and not m:
                pending = {}
            i += 1
            continue
        indent, start = len(fence["indent"]), i
        body = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            text = lines[i]
            body.append(text[indent:] if text[:indent].strip() == "" else text.lstrip())
            i += 1
        blocks.append(
            Block(
                name,
                start + 1,
                fence["lang"],
                "\n".join(body) + "\n",
                skip=pending.get("skip"),
                file=pending.get("file"),
            )
        )
        pending = {}
        i += 1
    return Page(name, setup, blocks)


def table_cells(row: str) -> list[str]:
    """A Markdown table row's cells (a ``\\|`` stays in its cell, as Markdown keeps it)."""
    cells = re.split(r"(?<!\\)\|", row.strip())
    if cells and not cells[0].strip():
        cells = cells[1:]
    if cells and not cells[-1].strip():
        cells = cells[:-1]
    return [c.strip() for c in cells]


def _command_column(lines: list[str], i: int) -> int | None:
    """The index of the ``command`` column when a table starts at line ``i``, else None."""
    if not lines[i].lstrip().startswith("|") or i + 1 >= len(lines):
        return None
    if not _TABLE_RULE.match(lines[i + 1].strip()):
        return None
    header = [c.lower() for c in table_cells(lines[i])]
    if not header or not header[0].startswith("i want to") or "command" not in header:
        return None
    return header.index("command")


def table_spans(text: str) -> list[tuple[int, str]]:
    """The code spans of a table's command column, in order, each with its line (0-based,
    in the table)."""
    lines = text.splitlines()
    column = _command_column(lines, 0)
    assert column is not None
    spans = []
    for k, row in enumerate(lines[2:], start=2):
        cells = table_cells(row)
        if column < len(cells):
            spans += [(k, span) for span in _SPAN.findall(cells[column])]
    return spans


def span_kind(span: str) -> str | None:
    """What a command column's code span is: a ``command``, an API ``name``, a one-word
    ``fragment``, or None (none of these: it would not paste)."""
    if span.startswith("tfckpt "):
        return "command"
    if _API_NAME.fullmatch(span):
        return "name"
    if not any(c.isspace() for c in span):
        return "fragment"
    return None


def escaped_pipes(text: str, name: str) -> list[str]:
    """Where a page's code (a fenced block, or an inline code span other than ``\\|``
    itself) holds ``\\|``, and where a table's code span holds a ``|`` at all: neither
    pastes as the command it shows."""
    found = []
    in_fence = False
    for n, line in enumerate(text.splitlines(), start=1):
        if _FENCE.match(line) or (in_fence and line.strip() == "```"):
            in_fence = not in_fence
            continue
        if in_fence:
            if "\\|" in line:
                found.append(f"{name}:{n}: `\\|` in a code block: {line.strip()}")
            continue
        if line.lstrip().startswith("|"):
            # In a table a `|` ends the cell, even inside a code span: whatever was
            # written, the span as read holds a `\` before it or is cut in two.
            for cell in table_cells(line):
                if cell.count("`") % 2 or any("\\|" in s for s in _SPAN.findall(cell)):
                    found.append(f"{name}:{n}: a `|` in a table's code span: {cell}")
            continue
        for span in _SPAN.findall(line):
            if "\\|" in span and span.strip() != "\\|":
                found.append(f"{name}:{n}: `\\|` in a code span: `{span}`")
    return found


def problems(page: Page) -> list[str]:
    """What breaks the convention: unknown fences, marks without a reason or a block."""
    found = []
    for b in page.blocks:
        if b.lang not in RUNNABLE | FILES:
            found.append(
                f"{b.where}: a ```{b.lang or '(no language)'} block: use console, "
                "python or text (or mark it <!-- skip: REASON -->)"
            )
        if b.skip is not None and not b.skip.strip():
            found.append(f"{b.where}: <!-- skip: --> without a reason")
        if b.skip is not None and b.lang not in RUNNABLE:
            found.append(f"{b.where}: <!-- skip --> on a block that would not run anyway")
        if b.file is not None and b.lang not in FILES:
            found.append(f"{b.where}: <!-- file: --> on a ```{b.lang} block")
        if b.lang == TABLE:
            for k, span in table_spans(b.text):
                if span_kind(span) is None:
                    found.append(
                        f"{b.page}:{b.line + k}: `{span}` in the command column is neither a "
                        "command (`tfckpt ...`), an API name (`tfckpt.NAME`) nor one word"
                    )
    return found


def commands(text: str) -> list[tuple[str, list[str]]]:
    """A console block's ``$`` commands, as bash gets them (continuation lines kept as
    written), each with the output lines that follow it."""
    result: list[tuple[str, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            cmd = [line[2:]]
            while cmd[-1].endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd.append(lines[i])
            result.append(("\n".join(cmd), []))
        elif result:
            result[-1][1].append(line)
        elif line.strip():
            raise ValueError(f"console text before the first `$ ` command: {line!r}")
        i += 1
    return result


def _matches(expected: list[str], output: str) -> str | None:
    """None when every expected line appears, in order, among the output's lines."""
    got = [" ".join(line.split()) for line in output.splitlines()]
    k = 0
    for want in (" ".join(w.split()) for w in expected):
        if not want:
            continue
        pattern = re.compile(".*".join(re.escape(p) for p in want.split("...")) + r"\Z")
        while k < len(got) and not pattern.match(got[k]):
            k += 1
        if k == len(got):
            return f"expected line not found (in order): {want!r}"
        k += 1
    return None


def _shell_env() -> dict[str, str]:
    """The environment of the page's bash: ``tfckpt`` and ``python`` on its PATH are this
    interpreter's (the suite may run without the virtual environment's bin/ on PATH)."""
    shims = Path(os.environ.get("TMPDIR", "/tmp")) / f"tfckpt-docs-shims-{os.getpid()}"
    if not shims.is_dir():
        shims.mkdir(parents=True)
        for name, body in (("tfckpt", "-m tfckpt "), ("python", "")):
            shim = shims / name
            shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" {body}"$@"\n')
            shim.chmod(0o755)
    root = str(Path(__file__).resolve().parent.parent)
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": path}


# How long one command may take before the page fails (a command waiting on something
# that never comes).
COMMAND_TIMEOUT = 600


class Shell:
    """One bash for a page, as a user's terminal: each command's text is sourced unchanged
    (``. FILE``, so what it exports, starts in the background or ``cd``\\s into stays for
    the next), its stdin /dev/null, its stdout and stderr one file; its status comes back
    on bash's stdout. Closing ends bash and whatever the page left running (its process
    group)."""

    _MARK = "tfckpt-docs-status"

    def __init__(self, cwd: str) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="tfckpt-docs-shell-"))
        self._count = 0
        self._proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=cwd,
            env=_shell_env(),
            start_new_session=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _send(self, text: str) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(text)
        self._proc.stdin.flush()

    def _status(self) -> int:
        """Bash's answer to the last request: the status it echoed."""
        while True:
            try:
                line = self._lines.get(timeout=COMMAND_TIMEOUT)
            except queue.Empty:
                raise TimeoutError(f"no answer from bash in {COMMAND_TIMEOUT} s") from None
            if line is None:
                raise RuntimeError("bash ended")
            if line.startswith(self._MARK):
                return int(line.split()[1])

    def run(self, cmd: str) -> tuple[int, str]:
        """``cmd`` run as typed; its exit status and output."""
        self._count += 1
        script = self._dir / f"{self._count}.sh"
        out = self._dir / f"{self._count}.out"
        script.write_text(cmd + "\n", encoding="utf-8")
        q = shlex.quote
        self._send(f". {q(str(script))} </dev/null >{q(str(out))} 2>&1\necho {self._MARK} $?\n")
        status = self._status()
        return status, out.read_text(encoding="utf-8", errors="replace")

    def environment(self) -> dict[str, str]:
        """What bash exports now."""
        dump = self._dir / "env"
        self._send(f"env -0 >{shlex.quote(str(dump))}\necho {self._MARK} $?\n")
        self._status()
        pairs = dump.read_bytes().decode("utf-8", "replace").split("\0")
        return dict(p.split("=", 1) for p in pairs if "=" in p)

    def close(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=60)
        # The page's background jobs (a server it started) are in bash's process group.
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self._proc.pid, sig)
            except ProcessLookupError:
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=30)
            for _ in range(100):  # at most 10 s for the group's other members to go
                try:
                    os.killpg(self._proc.pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
        self._reader.join(timeout=60)
        shutil.rmtree(self._dir, ignore_errors=True)


def _run_console(block: dict, shell: Shell) -> str | None:
    for cmd, expected in commands(block["text"]):
        m = _EXIT.search(cmd)
        want_status = int(m[1]) if m else 0
        status, output = shell.run(cmd)
        if status != want_status:
            return f"`$ {cmd}` exited {status}, not {want_status}:\n{output[-3000:]}"
        miss = _matches(expected, output)
        if miss:
            return f"`$ {cmd}`: {miss}\noutput:\n{output[-3000:]}"
    return None


def _run_table(block: dict, shell: Shell) -> str | None:
    """A command column's spans: commands run as they read, API names resolved."""
    for _, span in table_spans(block["text"]):
        kind = span_kind(span)
        if kind == "command":
            status, output = shell.run(span)
            allowed = (0, 1) if span.startswith("tfckpt diff ") else (0,)
            if status not in allowed or "Traceback" in output:
                return f"`{span}` exited {status}:\n{output[-3000:]}"
        elif kind == "name":
            parts = span.split(".")
            obj = importlib.import_module(parts[0])
            for k, part in enumerate(parts[1:], start=2):
                try:
                    obj = getattr(obj, part)
                except AttributeError:
                    obj = importlib.import_module(".".join(parts[:k]))
        elif kind is None:
            return f"`{span}` is neither a command, an API name nor one word"
    return None


def _use_environment(env: dict[str, str]) -> None:
    """This process's environment becomes ``env`` (the page's bash's, for its Python)."""
    for name in set(os.environ) - set(env):
        del os.environ[name]
    os.environ.update(env)


def run(spec: dict) -> None:
    """Run a page's blocks in its directory, in order; one JSON line per block on stdout.

    The first block that fails ends the page (the later ones may depend on it).
    """
    os.chdir(spec["cwd"])
    namespace: dict = {"__name__": "__docs__"}
    report = sys.stdout
    saved_env = dict(os.environ)
    shell = Shell(spec["cwd"])
    try:
        for block in spec["blocks"]:
            error = None
            try:
                if block["file"]:
                    Path(block["file"]).parent.mkdir(parents=True, exist_ok=True)
                    Path(block["file"]).write_text(block["text"], encoding="utf-8")
                elif block["lang"] == "python":
                    _use_environment({**shell.environment(), "PATH": saved_env["PATH"]})
                    code = compile(block["text"], block["where"], "exec")
                    with contextlib.redirect_stdout(io.StringIO()):
                        exec(code, namespace)
                elif block["lang"] == "console":
                    error = _run_console(block, shell)
                elif block["lang"] == TABLE:
                    error = _run_table(block, shell)
            except BaseException:  # reported against the block, whatever it is
                error = traceback.format_exc(limit=-3)
            line = {"page": spec["page"], "where": block["where"], "error": error}
            print(json.dumps(line), file=report, flush=True)
            if error:
                return
    finally:
        shell.close()
        _use_environment(saved_env)


def run_pages(specs: list[dict]) -> None:
    """Run several pages one after another in this process, each in its own directory.

    What a page leaves in fsspec's in-memory file system is cleared before the next.
    """
    for spec in specs:
        run(spec)
        if "fsspec" in sys.modules:
            import fsspec

            fsspec.filesystem("memory").store.clear()
            fsspec.filesystem("memory").pseudo_dirs[:] = [""]


def needs_own_process(page: Page) -> bool:
    """A page that chooses Keras' backend runs alone: the choice is per process."""
    return any("KERAS_BACKEND" in b.text for b in page.blocks if b.lang == "python")


def uses_transformers(page: Page) -> bool:
    """A page that loads its output in transformers (PyTorch) runs apart from TensorFlow's
    pages, with the other such pages: the tests never import both in one process."""
    return any(
        re.search(r"^\s*(import|from) transformers\b", b.text, re.M)
        for b in page.blocks
        if b.lang == "python" and b.skip is None
    )


def markers(page: Page) -> set[str]:
    """The suite's markers (pyproject.toml) for what the page's examples need beyond
    `make test-core`'s packages: transformers or PyTorch (``hf``), JAX (``jax``)."""
    text = "\n".join(b.text for b in page.blocks if b.skip is None)
    found = set()
    if uses_transformers(page) or re.search(r"\b(import|from) torch\b", text):
        found.add("hf")
    if re.search(r"KERAS_BACKEND\W+jax\b|\b(import|from) jax\b", text):
        found.add("jax")
    return found


def spec_of(page: Page) -> dict:
    """The blocks to run (and the files to write), in order, for :func:`run`."""
    return {
        "page": page.path,
        "blocks": [
            {"where": b.where, "lang": b.lang, "text": b.text, "file": b.file}
            for b in page.blocks
            if b.skip is None and (b.lang in RUNNABLE or b.file)
        ],
    }


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with open(sys.argv[1], encoding="utf-8") as f:
        run_pages(json.load(f))
