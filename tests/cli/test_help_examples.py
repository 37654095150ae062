"""Every example a command's ``--help`` shows runs as written (issue 38, item 1).

The examples are read from each command's parser (its ``--help`` text, so a new command
is covered) and run as a user pastes them: each command's lines in order, in one bash
(docs_examples.Shell, as the docs' console blocks run), in a fresh copy of the inputs the
documentation's examples use (tests/docs_setups.py): what ``make demo`` writes
(``demo-out/``), the checkpoints TensorFlow writes for the ``tf`` setup (``A/``, ``B/``,
``run/``, ``tf1/``, ``tf2/``, ``v1/``, ``keras/``) and the ``releases`` setup's research
releases, built once per session. ``HOME`` is a directory of the test's own; an example on
``s3://bucket/`` runs against a moto S3 server on loopback whose bucket ``bucket`` is
emptied before each command.

An example exits 0, unless :data:`EXIT_STATUS` lists it: then with the status its
command's help documents, for the reason the entry gives, which its output shows.
"""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path

import docs_examples
import docs_setups
import pytest
from s3_helpers import s3_server  # noqa: F401  (a fixture, started for the S3 examples)

from tfckpt.cli import build_parser

pytest.importorskip("tensorflow")  # the setups are written by TensorFlow

# Wider than this, a terminal of 80 columns wraps the line (the help's 40 lines are
# counted at 80 columns).
WIDTH = 80

BUCKET = "bucket"  # the bucket the examples name: s3://bucket/...


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def help_examples(parser: argparse.ArgumentParser) -> list[str]:
    """The example lines ``parser``'s ``--help`` shows under ``examples:``, each as bash
    gets it (a line ending in ``\\`` continues on the next, kept as written)."""
    lines = parser.format_help().splitlines()
    if "examples:" not in lines:
        return []
    found: list[str] = []
    continued = False
    for line in lines[lines.index("examples:") + 1 :]:
        if not line.strip():
            break
        if continued:
            found[-1] += "\n" + line
        else:
            assert re.match(r"  \S", line), f"an example line not indented by 2: {line!r}"
            found.append(line[2:])
        continued = line.endswith("\\")
    return found


PARSERS = _subparsers()
# The commands' parsers (`help` is not one: it has no examples of its own).
COMMANDS = sorted(name for name, p in PARSERS.items() if getattr(p, "short_help", False))

# The examples that exit with a status other than 0: {example: (status, what the status
# means in the command's `exit status:` line, a pattern the example's output matches)}.
EXIT_STATUS: dict[str, tuple[int, str, str]] = {
    # float16 values differ from the float32 ones, and the copy lacks the Adam slots
    "tfckpt diff demo-out/ demo-out/fp16/   # how much error did float16 add?": (
        1,
        "different",
        r"^logits/weights +\d+ +\d+ +[0-9.e-]+ +[0-9.e-]+$",
    ),
    "tfckpt diff demo-out/ demo-out/fp16/ --names-only   # what does fp16/ lack?": (
        1,
        "different",
        r"^- logits/weights/Adam +\(only in A\)$",
    ),
    # B/model.ckpt's variables are b1/, b2/; A/model.ckpt holds a1/, a2/
    "tfckpt check A/model.ckpt --against B/model.ckpt   # other names: would fail": (
        1,
        "it would fail",
        r"^MISSING +no value for b1/w",
    ),
}


def test_every_command_shows_examples():
    """Each command's --help has examples, none wider than 80 columns; the table of exit
    statuses names only examples there are, each with a status its command documents."""
    assert len(COMMANDS) >= 20 and "convert" in COMMANDS and "completion" in COMMANDS
    shown = {}
    for name in COMMANDS:
        examples = help_examples(PARSERS[name])
        assert examples, f"tfckpt {name} --help shows no examples"
        for example in examples:
            shown[example] = name
            for i, line in enumerate(example.splitlines()):
                width = len(line) + (2 if i == 0 else 0)  # as the help shows it
                assert width <= WIDTH, (name, line)
    for example, (status, meaning, _) in EXIT_STATUS.items():
        assert example in shown, f"not an example any more: {example!r}"
        assert status != 0
        documented = PARSERS[shown[example]].format_help()
        legend = re.search(r"^exit status: (.*)$", documented, re.M)
        assert legend, f"tfckpt {shown[example]} --help documents no exit status"
        assert f"{status} {meaning}" in legend[1], (example, legend[1])


@pytest.fixture(scope="session")
def example_inputs(tmp_path_factory) -> Path:
    """One directory holding the docs' `tf` and `releases` setups, written once."""
    base = tmp_path_factory.mktemp("help-examples")
    roots = {name: base / name for name in ("tf", "releases")}
    procs = []
    for name, root in roots.items():
        root.mkdir()
        procs.append((name, docs_setups.start(name, root)))
    for name, proc in procs:
        assert proc is not None
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"setup {name}:\n{err[-4000:]}"
    inputs = base / "inputs"
    for root in roots.values():
        shutil.copytree(root, inputs, dirs_exist_ok=True)
    return inputs


@pytest.fixture(scope="module")
def s3_bucket(request):
    """The S3 server (tests/s3_helpers.py), started on first use, this process and its
    children pointed at it, with the examples' bucket: its file system."""
    import fsspec

    request.getfixturevalue("s3_server")
    fs = fsspec.filesystem("s3")
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    return fs


@pytest.mark.parametrize("command", COMMANDS)
def test_help_examples_run_as_pasted(command, example_inputs, tmp_path, monkeypatch, request):
    examples = help_examples(PARSERS[command])
    work, home = tmp_path / "work", tmp_path / "home"
    shutil.copytree(example_inputs, work)
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    if any("s3://" in e for e in examples):
        fs = request.getfixturevalue("s3_bucket")
        for path in fs.ls(BUCKET, refresh=True):
            fs.rm(path, recursive=True)
        fs.invalidate_cache()
    shell = docs_examples.Shell(str(work))
    try:
        for example in examples:
            status, output = shell.run(example)
            want, meaning, shows = EXIT_STATUS.get(example, (0, "", ""))
            assert status == want, f"`{example}` exited {status}, not {want}:\n{output[-3000:]}"
            assert "Traceback" not in output, f"`{example}`:\n{output[-3000:]}"
            if shows:
                assert re.search(shows, output, re.M), (example, meaning, output[-3000:])
    finally:
        shell.close()
