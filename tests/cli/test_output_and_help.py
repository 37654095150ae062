"""One way to name the output, and help that leads (issue 38, items 1 to 3).

- Every command that writes takes its output as ``-o/--output`` (the positional stays
  where there is one) and writes the same files either way; both, or neither, is one
  line; an option no parser takes points at that command's help.
- ``tfckpt help CMD``; a command's ``--help`` shows its own options first and the common
  ones, in under 40 lines at 80 columns, ``--help-all`` every option (checked from the
  parser, for every command).
- ``convert`` without a cast says so; a ``memory://`` output warns that it vanishes.
- The install hints of errors name the checkout tfckpt runs from, or the release.

Checkpoints are written by TensorFlow and by tfckpt (the demo's tensors) in the test.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import ROOT, assert_cli_error, in_process, user_env

import tfckpt
from tfckpt.cli import build_parser
from tfckpt.cli import options as opt
from tfckpt.cli.parsers import option_rows
from tfckpt.cli.parsers.helptext import docs_page, format_help
from tfckpt.demo import example_tensors

tf = pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """Sources for every writing command: TF1-style checkpoints of the demo's tensors
    (two steps, and one of other names), a TF2 checkpoint written by TensorFlow, a TF1
    one whose names are its paths (for graft), and a safetensors file exported from the
    first."""
    d = tmp_path_factory.mktemp("sources")
    out = {
        "tf1": tfckpt.save(example_tensors(0), str(d / "tf1" / "model.ckpt-7")),
        "tf1b": tfckpt.save(example_tensors(1), str(d / "tf1b" / "model.ckpt-8")),
        "other": tfckpt.save({"extra/w": np.arange(6, dtype=np.float32)}, str(d / "o" / "x")),
    }
    rng = np.random.default_rng(38)
    a, b = (rng.standard_normal(n).astype(np.float32) for n in (4, 5))
    out["tf2"] = tf.train.Checkpoint(a=tf.Variable(a), b=tf.Variable(b)).write(
        str(d / "tf2" / "ckpt")
    )
    out["named"] = tfckpt.save({"a": a * 2, "b": b * 2}, str(d / "named" / "model.ckpt"))
    out["st"] = str(d / "model.safetensors")
    rc, _, err = in_process("export", out["tf1"], out["st"])
    assert rc == 0, err
    return out


# How each writing command is run: {OUT} is where the output goes. The first group takes
# it as a positional too; the second only as -o/--output.
POSITIONAL = {
    "convert": ["{tf1}", "{OUT}", "--dtype", "float16"],
    "rename": ["{tf1}", "{OUT}", "--map", "logits/=head/"],
    "select": ["{tf1}", "{OUT}", "--exclude", "/Adam"],
    "flatten": ["{tf2}", "{OUT}"],
    "export": ["{tf1}", "{OUT}.safetensors"],
    "import": ["{st}", "{OUT}"],
    "edit": ["{tf1}", "{OUT}", "--set", "global_step=3"],
    "cp": ["{tf1}", "{OUT}"],
    "mv": ["{fresh}", "{OUT}"],
}
FLAGGED = {
    "merge": ["{tf1}", "{other}", "-o", "{OUT}"],
    "average": ["{tf1}", "{tf1b}", "-o", "{OUT}"],
    "graft": ["{tf2}", "{named}", "-o", "{OUT}"],
    "match": ["{tf1}", "{st}", "-o", "{OUT}.toml"],
}


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _run_into(root: Path, command: str, argv: list[str], ckpts: dict) -> dict[str, bytes]:
    """Run ``tfckpt COMMAND ARGV`` with the output under ``root/out``; its files."""
    names = dict(ckpts, OUT=str(root / "out" / "m"))
    if command == "mv":  # mv takes its source away: each form moves its own copy
        names["fresh"] = tfckpt.save(example_tensors(0), str(root / "src" / "model.ckpt-7"))
    rc, out, err = in_process(command, *[a.format(**names) for a in argv])
    assert rc == 0, (command, argv, err)
    files = _files(root / "out")
    assert files, (command, argv)
    return files


def test_every_writing_command_takes_o_and_output(ckpts):
    """From the parser: each command that writes a checkpoint or files has -o/--output
    (the commands' test cases below cover each one)."""
    parsers = _subparsers()
    writing = {name for name, p in parsers.items() if p.get_default("output_arg")}
    assert writing == (set(POSITIONAL) | set(FLAGGED)) - {"match"}
    for name in [*POSITIONAL, *FLAGGED]:
        flags = {s for a in parsers[name]._actions for s in a.option_strings}
        assert {"-o", "--output"} <= flags, name
    for name in POSITIONAL:  # the positional stays, and -o names the same place
        alias = parsers[name].output_alias
        assert alias is not None and alias[1].option_strings == ["-o", "--output"], name


@pytest.mark.parametrize("command", list(POSITIONAL))
def test_o_and_output_write_what_the_positional_writes(command, ckpts, tmp_path):
    argv = POSITIONAL[command]
    at = argv.index(next(a for a in argv if a.startswith("{OUT}")))
    out = argv[at]
    rest = argv[:at] + argv[at + 1 :]
    forms = {
        "positional": argv,
        "-o": [rest[0], "-o", out, *rest[1:]],
        "-o first": ["-o", out, *rest],
        "--output=": [*rest, f"--output={out}"],
    }
    results = {
        form: _run_into(tmp_path / str(i), command, a, ckpts)
        for i, (form, a) in enumerate(forms.items())
    }
    for form, files in results.items():
        assert files == results["positional"], (command, form)


@pytest.mark.parametrize("command", list(FLAGGED))
def test_o_and_output_are_the_same(command, ckpts, tmp_path):
    argv = FLAGGED[command]
    long = [("--output" if a == "-o" else a) for a in argv]
    assert _run_into(tmp_path / "a", command, argv, ckpts) == _run_into(
        tmp_path / "b", command, long, ckpts
    )


def test_output_given_twice_or_not_at_all(ckpts, tmp_path):
    src = ckpts["tf1"]
    line = assert_cli_error(
        in_process("convert", src, tmp_path / "a", "-o", tmp_path / "b"),
        "given twice",
        "DST",
        "-o/--output",
        "(see tfckpt convert --help)",
    )
    assert "usage" not in line
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert_cli_error(
        in_process("export", src, "--output", tmp_path / "c.npz", tmp_path / "d.npz"),
        "given twice",
        "tfckpt export --help",
    )
    assert_cli_error(
        in_process("convert", src, "--dtype", "float16"),
        "required: DST (or -o/--output)",
        "tfckpt convert --help",
    )
    assert_cli_error(in_process("merge", src, ckpts["tf1b"]), "required: -o/--output")
    assert_cli_error(in_process("edit", src, "--set", "global_step=1"), "--in-place")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv, command",
    [
        (["convert", "{tf1}", "{OUT}", "--bogus"], "convert"),
        (["convert", "{tf1}", "{OUT}", "extra"], "convert"),
        (["merge", "{tf1}", "-o", "{OUT}", "--prefr", "last"], "merge"),
        (["dump", "{tf1}", "--dtype", "float16"], "dump"),
    ],
)
def test_an_option_no_parser_takes_points_at_the_commands_help(argv, command, ckpts, tmp_path):
    names = dict(ckpts, OUT=str(tmp_path / "out"))
    line = assert_cli_error(
        in_process(*[a.format(**names) for a in argv]), "unrecognized arguments"
    )
    assert line.endswith(f"(see tfckpt {command} --help)"), line
    assert not (tmp_path / "out").exists()


# --- help -------------------------------------------------------------------------


def test_help_command(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert in_process("help", "convert") == in_process("convert", "--help")
    assert in_process("help", "convert", "--all") == in_process("convert", "--help-all")
    rc, out, err = in_process("help")
    assert rc == 0 and err == "" and out.startswith("usage: tfckpt ")
    assert re.search(r"^\s+convert\s+cast floating-point", out, re.M)
    assert re.search(r"^\s+help\s+show a command's help", out, re.M)
    assert_cli_error(in_process("help", "conver"), "no command 'conver'", "did you mean 'convert'?")
    assert_cli_error(in_process("help", "nosuch"), "no command 'nosuch'", "tfckpt help")


def _option_lines(text: str) -> list[str]:
    """The first flag of each option a help text lists, in order."""
    return re.findall(r"^  (-{1,2}[\w-]+)", text, re.M)


def _first_flag(action: argparse.Action) -> str:
    return action.option_strings[0]


@pytest.mark.parametrize("command", sorted(set(_subparsers()) - {"help"}))
def test_short_help_leads_and_help_all_lists_everything(command, monkeypatch):
    """From the parser, for every command: the short help shows the command's own
    options before the common ones, in under 40 lines at 80 columns, and ends naming
    --help-all and the command's page; --help-all lists every option, its own first."""
    monkeypatch.setenv("COLUMNS", "80")
    p = _subparsers()[command]
    short, whole = p.format_help(), format_help(p, everything=True)
    lines = short.splitlines()
    assert len(lines) < 40, (command, len(lines))
    assert "--help-all" in lines[-1] and docs_page(command) in lines[-1], lines[-1]
    options = [a for a in p._actions if a.option_strings]
    helps = {"-h", "--help-all"}
    shown = [f for f in _option_lines(short)]
    essential = [_first_flag(a) for a in options if opt.is_essential(a)]
    assert sorted(shown) == sorted(essential), command
    own = {_first_flag(a) for a in options if not opt.is_shared(a)} - helps
    for listed in (shown, [f for f in _option_lines(whole) if f not in helps]):
        kinds = [f in own for f in listed]
        assert kinds == sorted(kinds, reverse=True), (command, listed)  # own, then shared
    assert sorted(_option_lines(whole)) == sorted(_first_flag(a) for a in options)
    for a in options:  # every spelling, e.g. --output too
        for flag in a.option_strings:
            assert re.search(rf"(^|[ ,]){re.escape(flag)}\b", whole, re.M), (command, flag)
    # The common options show where the command has them, unless it leaves one out.
    for flag in opt.COMMON:
        action = next((a for a in options if flag in a.option_strings), None)
        if action is not None and getattr(action, opt.ESSENTIAL_MARK, None) is not False:
            assert flag in shown, (command, flag)


def test_rewriting_commands_no_longer_repeat_the_shared_block(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    parsers = _subparsers()
    for command in ("convert", "export", "rename", "select", "merge", "graft"):
        short = parsers[command].format_help()
        for flag in ("--executor", "--backend", "--storage-option", "--split", "--no-fsync"):
            assert flag not in short, (command, flag)
        assert "--dtype" in short and "--overwrite" in short and "--dry-run" in short
    rc, out, _ = in_process("convert", "--help-all")
    assert rc == 0 and "--executor" in out and "--split" in out


def test_option_rows_are_the_parser(monkeypatch):
    """The docs' tables: the options --help-all lists, in its order, with their help,
    default and whether the short help shows them."""
    monkeypatch.setenv("COLUMNS", "80")
    p = _subparsers()["convert"]
    rows = option_rows("convert")
    whole = format_help(p, everything=True)
    assert [r.flags[0] for r in rows] == [
        f for f in _option_lines(whole) if f not in ("-h", "--help-all")
    ]
    by_flag = {r.flags[-1]: r for r in rows}
    assert by_flag["--output"].flags == ("-o", "--output")
    assert by_flag["--output"].metavar == "DST" and by_flag["--output"].essential
    assert by_flag["--overflow"].default == "error"
    assert by_flag["--overflow"].metavar == "{error,clip,inf}"
    assert by_flag["--overwrite"].metavar is None and by_flag["--overwrite"].default is None
    assert by_flag["--executor"].essential is False and by_flag["--dtype"].essential
    assert "float16" in by_flag["--dtype"].help
    with_positionals = option_rows("convert", positionals=True)
    assert [(r.flags, r.metavar) for r in with_positionals[:2]] == [((), "SRC"), ((), "DST")]
    with pytest.raises(ValueError, match="no command"):
        option_rows("nosuch")


# --- convert without a cast; memory:// outputs ----------------------------------------


def test_convert_without_a_cast_says_so(ckpts, tmp_path):
    note = "tfckpt: note: copied without casting (no --dtype); to cast, add e.g. --dtype float16"
    rc, out, err = in_process("convert", ckpts["tf1"], tmp_path / "a")
    assert rc == 0 and note in err.splitlines(), err
    rc, out, err = in_process("convert", ckpts["tf1"], tmp_path / "b", "--json")
    assert rc == 0 and note in err.splitlines()
    assert json.loads(out)["dst"].endswith("b")  # stdout: the JSON alone
    for cast in (
        ["--dtype", "float16"],
        ["--dtype-rule", "logits=bfloat16"],
        ["--exclude", "/Adam"],
    ):
        rc, _, err = in_process("convert", ckpts["tf1"], tmp_path / cast[0], *cast)
        assert rc == 0 and "without casting" not in err, cast
    rc, _, err = in_process("convert", ckpts["tf1"], tmp_path / "c", "--dry-run")
    assert rc == 0 and "would copy without casting" in err


def test_a_memory_output_warns_that_it_vanishes(ckpts, tmp_path):
    for argv in (
        ["convert", ckpts["tf1"], "memory://run38/m"],
        ["export", ckpts["tf1"], "-o", "memory://run38/m.npz"],
        ["merge", ckpts["tf1"], "-o", "memory://run38/merged"],
    ):
        rc, out, err = in_process(*argv)
        assert rc == 0, err
        warnings = [line for line in err.splitlines() if line.startswith("tfckpt: warning:")]
        assert len(warnings) == 1 and "memory://run38/" in warnings[0], err
        assert "gone when the command ends" in warnings[0]
    rc, _, err = in_process("convert", ckpts["tf1"], tmp_path / "local")
    assert rc == 0 and "warning" not in err
    rc, _, err = in_process("convert", ckpts["tf1"], "memory://run38/d", "--dry-run")
    assert rc == 0 and "warning" not in err  # nothing is written


# --- install hints ----------------------------------------------------------------------


def _hint_in(cwd, pythonpath: str, extra: str = "report") -> str:
    env = user_env()
    env["PYTHONPATH"] = pythonpath
    code = f"from tfckpt.errors import install_hint; print(install_hint({extra!r}))"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_install_hint_from_a_checkout(tmp_path):
    assert _hint_in(tmp_path, ROOT) == f"pip install -e '{ROOT}[report]'"
    assert _hint_in(ROOT, ROOT, "tf") == "pip install -e '.[tf]'"


def test_install_hint_of_an_install_from_a_directory_and_of_a_release(tmp_path):
    """pip installs a copy of this checkout (no build isolation, no index: offline);
    its hint names that directory while it is there, and the release once it is gone."""
    clone = tmp_path / "clone"
    shutil.copytree(
        Path(ROOT) / "tfckpt", clone / "tfckpt", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(Path(ROOT) / name, clone / name)
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
    pip += ["--no-build-isolation", "--target", str(site), str(clone)]
    proc = subprocess.run(pip, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    assert _hint_in(elsewhere, str(site)) == f"pip install '{clone}[report]'"
    shutil.rmtree(clone)
    assert _hint_in(elsewhere, str(site), "h5") == "pip install 'tfckpt[h5]'"


@pytest.mark.parametrize(
    "extra, missing, argv",
    [
        ("report", "matplotlib", ["stats", "{tf1}", "--html", "{tmp}/r.html"]),
        ("tf", "tensorflow", ["verify", "{tf1}", "--tf"]),
        ("remote", "fsspec", ["dump", "s3://bucket/run/ckpt"]),
        ("h5", "h5py", ["dump", "{tmp}/w.h5"]),
        ("dask", "dask", ["convert", "{tf1}", "{tmp}/o", "--executor", "dask://127.0.0.1:9"]),
    ],
)
def test_each_install_hint_names_this_checkout(extra, missing, argv, ckpts, tmp_path):
    """Each of the five errors, with its package made unimportable in a fresh process."""
    import h5py

    with h5py.File(tmp_path / "w.h5", "w") as f:
        f["w"] = np.zeros(3, np.float32)
    code = (
        f"import sys; sys.modules[{missing!r}] = None\n"
        "from tfckpt.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    names = dict(ckpts, tmp=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", code, *[a.format(**names) for a in argv]],
        cwd=tmp_path,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = assert_cli_error(proc, f"pip install -e '{ROOT}[{extra}]'")
    assert "tfckpt[" not in line
    assert not os.path.exists(tmp_path / "o")
