"""The documentation's code examples: found in the Markdown, run in order, page by page.

The convention (docs/tested.md, "The examples in these pages"):

- ```` ```python ```` blocks run, in order, in one namespace per page;
- ```` ```console ```` blocks run their ``$ COMMAND`` lines (a line ending in ``\\``
  continues on the next); ``$ tfckpt ...`` runs the command line in-process, anything
  else in bash. The lines after a command, up to the next ``$``, are output it must print:
  each line, in order, must equal a line of its output (``...`` in a line matches any
  text; runs of spaces count as one); none given, only the exit status is checked. A command expects exit status 0,
  or N when it ends with ``# exit status N``;
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
import io
import json
import os
import re
import shlex
import subprocess
import sys
import traceback
from pathlib import Path

RUNNABLE = {"python", "console"}
FILES = {"toml", "json", "text"}

_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\s*$")
# A mark is a comment alone on its line.
_MARK = re.compile(r"\s*<!--\s*(?P<kind>skip|file|examples):\s*(?P<value>.*?)\s*-->\s*")
_EXIT = re.compile(r"#\s*exit status (\d+)\s*$")


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
    return found


def commands(text: str) -> list[tuple[str, list[str]]]:
    """A console block's ``$`` commands, each with the output lines that follow it."""
    result: list[tuple[str, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            cmd = line[2:]
            while cmd.endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd = cmd[:-1] + " " + lines[i].strip()
            result.append((cmd, []))
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


def _run_tfckpt(argv: list[str]) -> tuple[int, str]:
    from tfckpt import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            status = cli.main(argv)
        except SystemExit as e:  # argparse's usage errors and --help
            status = e.code if isinstance(e.code, int) else 2
    return status, out.getvalue()


def _shell_env() -> dict[str, str]:
    """The environment of a command bash runs: ``tfckpt`` and ``python`` on its PATH are
    this interpreter's (the suite runs without the virtual environment's bin/ on PATH)."""
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


def _run_console(block: dict) -> str | None:
    for cmd, expected in commands(block["text"]):
        m = _EXIT.search(cmd)
        want_status = int(m[1]) if m else 0
        # A comment starts at a `#` after whitespace, as in bash (`a.tar#member` is a path).
        line = re.sub(r"(^|\s)#.*$", "", cmd)
        argv = shlex.split(line)
        piped = re.search(r"[|<>;&`$]", line)  # the shell's work: redirections, pipes...
        if not piped and (argv[:1] == ["tfckpt"] or argv[:3] == ["python", "-m", "tfckpt"]):
            status, output = _run_tfckpt(argv[1:] if argv[0] == "tfckpt" else argv[3:])
        else:
            done = subprocess.run(
                ["bash", "-c", cmd], capture_output=True, text=True, env=_shell_env()
            )
            status, output = done.returncode, done.stdout + done.stderr
        if status != want_status:
            return f"`$ {cmd}` exited {status}, not {want_status}:\n{output[-3000:]}"
        miss = _matches(expected, output)
        if miss:
            return f"`$ {cmd}`: {miss}\noutput:\n{output[-3000:]}"
    return None


def run(spec: dict) -> None:
    """Run a page's blocks in its directory, in order; one JSON line per block on stdout.

    The first block that fails ends the page (the later ones may depend on it).
    """
    os.chdir(spec["cwd"])
    namespace: dict = {"__name__": "__docs__"}
    report = sys.stdout
    for block in spec["blocks"]:
        error = None
        try:
            if block["file"]:
                Path(block["file"]).parent.mkdir(parents=True, exist_ok=True)
                Path(block["file"]).write_text(block["text"], encoding="utf-8")
            elif block["lang"] == "python":
                code = compile(block["text"], block["where"], "exec")
                with contextlib.redirect_stdout(io.StringIO()):
                    exec(code, namespace)
            elif block["lang"] == "console":
                error = _run_console(block)
        except BaseException:  # reported against the block, whatever it is
            error = traceback.format_exc(limit=-3)
        line = {"page": spec["page"], "where": block["where"], "error": error}
        print(json.dumps(line), file=report, flush=True)
        if error:
            return


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
