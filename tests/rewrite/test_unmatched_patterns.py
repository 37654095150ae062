"""Patterns that match nothing, patterns that would take forever, hostile rules files,
and optional dependencies checked before anything is written (issue 37, items 4, 11, 6).

Every source here is written by TensorFlow's own Saver; every command runs as a user
runs it, in its own process where the time or the import machinery matters.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

import tfckpt
from tests import transform_helpers as th
from tests.cli_helpers import assert_cli_error, in_process, run_text, user_env
from tfckpt.rewrite.regex import Regex

# A name Python's backtracking takes about 2**60 steps to refuse '^(a+)+$' on.
LONG = "a" * 60 + "-"
CATASTROPHIC = "^(a+)+$"


@pytest.fixture(scope="module")
def tf1(tmp_path_factory):
    return th.write_tf1_float32(tmp_path_factory.mktemp("tf1"))


def nothing_written(directory) -> bool:
    return not os.path.exists(directory) or os.listdir(directory) == []


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--include", "nothing"], ["--include 'nothing' matches no tensor"]),
        (["--include", "dense/kernl"], ["--include 'dense/kernl'", "nearest: 'dense/kernel'"]),
        (["--exclude", "^conv/weight$"], ["--exclude '^conv/weight$'", "'conv/weights'"]),
        (["--map", "^dense2/=head/"], ["--map '^dense2/' matches no tensor"]),
        (
            ["--dtype", "float16", "--keep-dtype", "LayerNorm"],
            ["--keep-dtype 'LayerNorm' matches no tensor"],
        ),
        (["--dtype-rule", "embeddings=bfloat16"], ["--dtype-rule 'embeddings' matches"]),
        # Copied from a Markdown table, where | is written \|: a literal bar in a regex.
        (["--include", r"^(conv\|dense)/"], [r"'^(conv\\|dense)/'", "literal |", "Markdown"]),
    ],
)
def test_a_pattern_that_matches_nothing_is_an_error(tf1, tmp_path, flags, fragments):
    prefix, _ = tf1
    out = tmp_path / "out"
    result = in_process("convert", prefix, f"{out}/", *flags)
    line = assert_cli_error(result, *fragments, "--allow-unmatched")
    assert "allow_unmatched" not in line
    assert nothing_written(out)
    # Meant: written as asked.
    rc, _, err = in_process("convert", prefix, f"{out}/", *flags, "--allow-unmatched")
    assert rc == 0, err


def test_a_selection_that_keeps_nothing_is_an_error(tf1, tmp_path):
    prefix, _ = tf1
    out = tmp_path / "out"
    # Each pattern matches, together they keep nothing.
    result = in_process("select", prefix, f"{out}/", "--include", "conv", "--exclude", "/")
    assert_cli_error(result, "none of the 5 tensors is kept", "--allow-unmatched")
    assert nothing_written(out)
    rc, _, err = in_process(
        "select", prefix, f"{out}/", "--include", "conv", "--exclude", "/", "--allow-unmatched"
    )
    assert rc == 0 and "0 tensors kept" in err, err


def test_the_library_is_strict_by_default(tf1, tmp_path):
    prefix, values = tf1
    with pytest.raises(tfckpt.CheckpointError, match="allow_unmatched=True") as e:
        tfckpt.plan(prefix, str(tmp_path / "a") + "/", include=["nothing"])
    assert "include 'nothing' matches no tensor" in str(e.value)
    # A pattern some tensor matches, though the others leave that tensor out: matched.
    p = tfckpt.plan(prefix, str(tmp_path / "b") + "/", include=["dense"], exclude=["conv"])
    assert sorted(p.tensors.new_name) == ["dense/bias", "dense/kernel"]
    p = tfckpt.plan(
        prefix, str(tmp_path / "c") + "/", include=["nothing"], exclude=["x"], allow_unmatched=True
    )
    assert p.unmatched == [("include", "nothing"), ("exclude", "x")]
    assert len(p.tensors) == 0


def test_rules_files_and_other_commands_are_strict_too(tf1, tmp_path):
    prefix, _ = tf1
    rules = tmp_path / "r.toml"
    rules.write_text("exclude = ['adam_[mv]$']\n")
    out = tmp_path / "out"
    assert_cli_error(
        in_process("convert", prefix, f"{out}/", "--rules", str(rules)),
        "--exclude 'adam_[mv]$' matches no tensor",
    )
    rules.write_text("exclude = ['adam_[mv]$']\nallow_unmatched = true\n")
    rc, _, err = in_process("convert", prefix, f"{out}/", "--rules", str(rules))
    assert rc == 0, err
    export = tmp_path / "x" / "model.safetensors"
    assert_cli_error(
        in_process("export", prefix, str(export), "--map", "^nothing/=x/"),
        "--map '^nothing/' matches no tensor",
    )
    assert nothing_written(export.parent)
    avg = tmp_path / "avg"
    assert_cli_error(
        in_process(
            "average", prefix, prefix, "-o", f"{avg}/", "--keep-dtype", "x", "--dtype", "float16"
        ),
        "--keep-dtype 'x' matches no tensor",
    )
    assert nothing_written(avg)


def test_a_catastrophic_pattern_takes_linear_time(tmp_path):
    """'^(a+)+$' against 60 a's and a '-': Python's re would take centuries; RE2 reads the
    name once. The generous timeout stands for "finishes"; no speed is asserted."""
    prefix = th.tf1_save(
        tmp_path / "src" / "model.ckpt",
        {LONG: np.zeros(2, np.float32), "aa": np.ones(2, np.float32), "w": np.ones(2, np.float32)},
        trainable=[LONG, "aa", "w"],
    )
    for args in (
        ["convert", prefix, f"{tmp_path}/c/", "--include", f"{CATASTROPHIC}|^w$"],
        ["export", prefix, f"{tmp_path}/e.safetensors", "--exclude", CATASTROPHIC],
    ):
        done = run_text(*args, timeout=300)
        assert done.returncode == 0, done.stderr
    with tfckpt.open(f"{tmp_path}/c/model.ckpt") as ckpt:
        assert sorted(ckpt.keys()) == ["aa", "w"]


@pytest.mark.parametrize(
    "pattern, why",
    [
        ("(?<=query/)kernel", "invalid perl operator: (?<="),
        ("(a)\\1", "invalid escape sequence: \\1"),
        ("a++", "bad repetition operator"),
        ("conv/(", "missing ), unterminated subpattern"),
    ],
)
def test_a_pattern_that_needs_backtracking_is_refused_clearly(tf1, tmp_path, pattern, why):
    prefix, _ = tf1
    line = assert_cli_error(
        in_process("convert", prefix, f"{tmp_path}/o/", "--include", pattern),
        f"bad include pattern {pattern!r}",
        why,
    )
    assert ("linear time" in line) == (pattern != "conv/(")


def test_regex_matches_and_expands_as_python_does():
    """Where RE2 takes a pattern, it finds what Python's re finds, and a replacement
    template expands alike (undecodable bytes of a name, Python's \\Z and {,n} too)."""
    patterns = [
        r"^dense/",
        r"kernel\Z",
        r"(?P<a>\w+)/(\d+)",
        r"a{,2}b",
        r"[]a]x",
        r"[^]a]+",
        r"(x)?y",
        r"layer_(\d+)/(query|key)",
        r"[{,2}]",
        r"é(.)",
        r"(?i)DENSE",
        r".(.)$",
    ]
    names = [
        "dense/kernel",
        "aab",
        "]x",
        "xy",
        "layer_12/query/x",
        "{",
        "éx/é",
        "DENSE/k",
        "\udc80dense/",
        "dense/\udcff",
        "x\udcffé",
        "y",
    ]
    templates = [
        r"\1",
        r"x\g<0>y",
        r"\n\t\\",
        r"\0",
        r"\012",
        r"\g<a>",
        r"\&",
        r"é\1é",
        r"\q",
        "\\",
        r"\g<zz>",
        r"\g<9>",
        r"\10",
        r"\400",
        r"\1a",
        r"\g<1a>",
    ]

    def outcome(m, t):
        try:
            return m.expand(t)
        except (re.error, IndexError) as e:
            return type(e)

    for p in patterns:
        ours, theirs = Regex.compile(p, "test"), re.compile(p)
        for n in names:
            for how in ("search", "match", "fullmatch"):
                a, b = getattr(ours, how)(n), getattr(theirs, how)(n)
                assert (a is None) == (b is None), (p, n, how)
                if a is not None:
                    assert a.end() == b.end()
                    assert [outcome(a, t) for t in templates] == [outcome(b, t) for t in templates]


@pytest.mark.parametrize(
    "make, fragment",
    [
        (lambda p: p.write_text("a = " + "[" * 100_000 + "]" * 100_000), "nest deeper than 32"),
        (lambda p: p.write_text("a = " + "{b = " * 5000 + "1" + "}" * 5000), "nest deeper than 32"),
        (lambda p: None, "not a regular file (a character device)"),
        (lambda p: os.mkfifo(p), "not a regular file (a named pipe)"),
    ],
    ids=["arrays", "tables", "dev-zero", "fifo"],
)
def test_a_hostile_rules_file_is_one_line(tf1, tmp_path, make, fragment):
    prefix, _ = tf1
    path = tmp_path / "rules.toml"
    make(path)
    rules = "/dev/zero" if not path.exists() else str(path)
    result = run_text("convert", prefix, f"{tmp_path}/o/", "--rules", rules, timeout=120)
    assert_cli_error(result, rules, fragment)
    assert nothing_written(tmp_path / "o")


def test_a_report_without_matplotlib_writes_nothing(tf1, tmp_path):
    """Without matplotlib, convert --report fails before the checkpoint is written, so a
    rerun with matplotlib meets no "destination already exists"."""
    prefix, _ = tf1
    blocked = tmp_path / "blocked" / "matplotlib"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'matplotlib'\", name='matplotlib')\n"
    )
    env = user_env()
    env["PYTHONPATH"] = os.pathsep.join([str(blocked.parent), env["PYTHONPATH"]])
    out = tmp_path / "out"
    args = ["convert", prefix, f"{out}/", "--dtype", "float16", "--report", f"{tmp_path}/r.html"]
    result = run_text(*args, env=env)
    assert_cli_error(result, "an HTML report needs matplotlib")
    assert nothing_written(out) and not (tmp_path / "r.html").exists()


def test_backend_tf_without_tensorflow_writes_nothing(tf1, tmp_path):
    prefix, _ = tf1
    blocked = tmp_path / "blocked" / "tensorflow"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'tensorflow'\", name='tensorflow')\n"
    )
    env = user_env()
    env["PYTHONPATH"] = os.pathsep.join([str(blocked.parent), env["PYTHONPATH"]])
    out = tmp_path / "out"
    args = ["convert", prefix, f"{out}/", "--dtype", "float16", "--backend", "tf"]
    result = run_text(*args, "--tf-threshold", "0", env=env)
    assert_cli_error(result, "TensorFlow is needed")
    assert nothing_written(out)
