"""The inspection commands as a user meets them: separate processes, exit codes, one-line
errors, help texts, terminal widths, and a Python in which TensorFlow cannot be imported.

Checkpoints are TensorFlow-written session fixtures (read-only; copied before damage) or
small planted ones written with ``tfckpt.save``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from cli_helpers import assert_cli_error, in_process, run_text, user_env  # noqa: E402

import tfckpt
import tfckpt.cli
import tfckpt.inspection as tfi

COMMANDS = ["dump", "diff", "stats", "verify", "convert", "rename", "select", "merge"]


# ---------------------------------------------------------------- helpers


def flip_byte(path, offset: int, mask: int = 0x01) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ mask]))


# ---------------------------------------------------------------- planted checkpoints


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """Small checkpoints written by tfckpt: A and B differ in names, values and NaN places."""
    d = tmp_path_factory.mktemp("inspect_cli")
    base = {
        "common/w": np.array([1.0, np.nan, 3.0, -np.inf, 0.0], dtype=np.float32),
        "common/step": np.array(5, dtype=np.int64),
        "common/words": np.array([b"a", b"b"], dtype=object),
    }
    a = dict(base, **{"only_a/x": np.zeros(3, np.float32), "only_a/y": np.ones(2, np.int32)})
    b = dict(base, **{"only_b/z": np.arange(4, dtype=np.float64)})
    # A different NaN payload in the same place still counts as equal.
    w = base["common/w"].copy()
    w.view(np.uint32)[1] |= 0x1234
    same_nan = dict(base, **{"common/w": w})
    moved_nan = dict(base, **{"common/w": np.array([1.0, 2.0, np.nan, -np.inf, 0.0], np.float32)})
    big = {"big": np.arange(2500, dtype=np.float32) / 7, "step": np.array(1, np.int64)}
    out = {}
    for name, tensors in [
        ("a", a),
        ("b", b),
        ("same_nan", same_nan),
        ("moved_nan", moved_nan),
        ("big", big),
        ("base", base),
    ]:
        out[name] = tfckpt.save(tensors, str(d / name / "model.ckpt"))
    out["dir"] = d
    return out


# ---------------------------------------------------------------- without TensorFlow

_BLOCK_TF = r"""
import sys, importlib.abc

class _NoTensorFlow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            raise ImportError(f"No module named {name!r} (blocked by the test)", name=name)
        return None

sys.meta_path.insert(0, _NoTensorFlow())
for mod in [m for m in sys.modules if m == "tensorflow" or m.startswith("tensorflow.")]:
    del sys.modules[mod]
import tfckpt.cli
code = tfckpt.cli.main(sys.argv[1:])
if "tensorflow" in sys.modules:
    sys.exit(99)
sys.exit(code)
"""


def run_without_tf(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _BLOCK_TF, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=user_env(),
    )


def test_tensorflow_really_is_blocked():
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _BLOCK_TF.replace("import tfckpt.cli", "import tensorflow"),
            "dump",
            "x",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "blocked by the test" in proc.stderr


@pytest.mark.parametrize(
    "argv,rc,expect",
    [
        (["dump", "{keras}"], 0, "tensors     24"),
        (["dump", "--json", "{keras}"], 0, '"tensor_count": 24'),
        (["dump", "--object-graph", "{keras}"], 0, "object graph of "),
        (["dump", "--object-graph", "--json", "{keras}"], 0, '"nodes"'),
        (["dump", "{slices}", "--tensor", "^emb$", "--full"], 0, "emb (float32 [10,4])"),
        (["diff", "{keras}", "{keras_first}"], 1, "with different values"),
        (["diff", "{keras}", "{keras}"], 0, "same"),
        (["stats", "{keras}"], 0, "MEAN"),
        (["stats", "--json", "{dtypes}"], 0, '"cast"'),
        (["verify", "{keras}"], 0, "ok: "),
        (["verify", "{slices}"], 0, "ok: "),
        (["convert", "{keras}", "{out}/fp16/", "--dtype", "float16"], 0, ""),
    ],
)
def test_commands_work_without_tensorflow(tf_checkpoints, tmp_path, argv, rc, expect):
    keras = tf_checkpoints("keras_manager")
    paths = {
        "keras": keras.path,
        "keras_first": keras.extra["first"],
        "out": tmp_path,
        "slices": tf_checkpoints("savev2_slices").path,
        "dtypes": tf_checkpoints("all_dtypes").path,
    }
    proc = run_without_tf(*[a.format(**paths) for a in argv])
    assert proc.returncode == rc, proc.stderr
    assert expect in proc.stdout
    assert "Traceback" not in proc.stderr
    if argv[0] == "convert":
        assert "wrote " in proc.stderr
        assert run_without_tf("verify", tmp_path / "fp16").returncode == 0


def test_verify_tf_without_tensorflow_is_one_line_error(tf_checkpoints):
    proc = run_without_tf("verify", tf_checkpoints("corruptible").path, "--tf")
    line = assert_cli_error(proc, "pip install ", "[tf]'")  # from a checkout: its path
    assert "install" in line
    assert proc.stdout == ""


# ---------------------------------------------------------------- errors


@pytest.fixture
def damaged(tmp_path):
    """A checkpoint with a corrupt index and one with a corrupt data shard."""
    values = {"a": np.arange(64, dtype=np.float32), "b": np.arange(10, dtype=np.int64)}
    bad_index = tfckpt.save(values, str(tmp_path / "bad_index" / "m"))
    flip_byte(bad_index + ".index", 5, 0x40)
    bad_data = tfckpt.save(values, str(tmp_path / "bad_data" / "m"))
    with tfckpt.open(bad_data) as ckpt:
        offset = ckpt.info("a").offset
    flip_byte(bad_data + ".data-00000-of-00001", offset + 9)
    good = tfckpt.save(values, str(tmp_path / "good" / "m"))
    return {
        "bad_index": bad_index,
        "bad_data": bad_data,
        "good": good,
        "shard": bad_data + ".data-00000-of-00001",
        "missing": str(tmp_path / "nope" / "m"),
        "out": str(tmp_path / "out" / "m"),
    }


@pytest.mark.parametrize(
    "argv,names",
    [
        (["dump", "{missing}"], ["{missing}"]),
        (["dump", "{missing}", "--json"], ["{missing}"]),
        (["dump", "{missing}", "--object-graph"], ["{missing}"]),
        (["diff", "{missing}", "{good}"], ["{missing}"]),
        (["diff", "{good}", "{missing}"], ["{missing}"]),
        (["stats", "{missing}"], ["{missing}"]),
        (["convert", "{missing}", "{out}", "--dtype", "float16"], ["{missing}"]),
        (["rename", "{missing}", "{out}", "--map", "a=b"], ["{missing}"]),
        (["select", "{missing}", "{out}", "--include", "a"], ["{missing}"]),
        (["merge", "{good}", "{missing}", "-o", "{out}"], ["{missing}"]),
        (["dump", "{bad_index}"], ["{bad_index}.index", "checksum"]),
        (["dump", "{bad_index}", "--json"], ["{bad_index}.index"]),
        (["diff", "{good}", "{bad_index}"], ["{bad_index}.index"]),
        (["stats", "{bad_index}"], ["{bad_index}.index"]),
        (["stats", "{bad_data}"], ["{shard}", "'a'", "checksum"]),
        (["diff", "{bad_data}", "{good}"], ["{shard}", "'a'", "checksum"]),
        (["dump", "{bad_data}", "--tensor", "^a$"], ["{shard}", "'a'", "checksum"]),
        (["convert", "{bad_data}", "{out}", "--dtype", "float16"], ["{shard}", "'a'"]),
        (["dump", "{good}", "--tensor", "no_such_tensor"], ["{good}", "no_such_tensor"]),
        (["dump", "{good}", "--filter", "("], ["regular expression"]),
        (["diff", "{good}", "{good}", "--filter", "[z"], ["regular expression"]),
        (["stats", "{good}", "--filter", "*"], ["regular expression"]),
    ],
)
def test_errors_are_one_line(damaged, argv, names):
    proc = run_text(*[a.format(**damaged) for a in argv])
    assert_cli_error(proc, *[n.format(**damaged) for n in names])
    assert proc.stdout == ""


def test_verify_missing_path_is_an_error(damaged):
    proc = run_text("verify", damaged["missing"])
    assert_cli_error(proc, damaged["missing"])


def test_verify_problems_are_one_line_each(damaged):
    for which, text in [("bad_index", ".index"), ("bad_data", damaged["shard"])]:
        proc = run_text("verify", damaged[which])
        assert proc.returncode == 1 and proc.stdout == ""
        assert "Traceback" not in proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and text in lines[0], proc.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["dump", "{missing}"],
        ["stats", "{bad_data}"],
        ["diff", "{good}", "{bad_index}"],
        ["dump", "{good}", "--tensor", "zzz"],
    ],
)
def test_debug_shows_traceback(damaged, argv):
    proc = run_text("--debug", *[a.format(**damaged) for a in argv])
    assert proc.returncode == 2
    assert proc.stderr.startswith("Traceback (most recent call last):"), proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("tfckpt: error: ")
    assert "CheckpointError" in proc.stderr or "NotFoundError" in proc.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_help_has_examples(command):
    rc, out, _ = in_process(command, "--help")
    assert rc == 0
    assert "examples:" in out
    assert f"tfckpt {command} " in out.split("examples:")[1]


# ---------------------------------------------------------------- diff on planted checkpoints


def test_diff_names_only_in_a_and_b(planted):
    proc = run_text("diff", planted["a"], planted["b"])
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert "- only_a/x  (only in A)" in lines and "- only_a/y  (only in A)" in lines
    assert "+ only_b/z  (only in B)" in lines
    assert lines[-1] == (
        "different: 2 only in A, 1 only in B, 0 changed dtype/shape, 0 with different values"
    )
    data = json.loads(run_text("diff", planted["a"], planted["b"], "--json").stdout)
    assert data["only_in_a"] == ["only_a/x", "only_a/y"] and data["only_in_b"] == ["only_b/z"]
    assert data["changed"] == [] and data["values"] == [] and data["same"] is False
    assert (data["a"], data["b"]) == (planted["a"], planted["b"])
    # --filter narrows both sides.
    data = json.loads(
        run_text("diff", planted["a"], planted["b"], "--json", "--filter", "^common/").stdout
    )
    assert data["same"] is True and data["only_in_a"] == data["only_in_b"] == []


def test_diff_nan_in_the_same_place_is_equal(planted):
    proc = run_text("diff", planted["base"], planted["same_nan"])
    assert (proc.returncode, proc.stdout.strip()) == (0, "same"), proc.stderr
    proc = run_text("diff", planted["base"], planted["moved_nan"], "--json")
    assert proc.returncode == 1
    data = json.loads(proc.stdout)
    assert [v["name"] for v in data["values"]] == ["common/w"]
    v = data["values"][0]
    assert (v["elements"], v["differing"]) == (5, 2)
    assert set(v) == {"name", "elements", "differing", "max_abs", "max_rel"}
    # NaN against a number has no finite distance (strict JSON spells it out).
    assert v["max_abs"] == "Infinity"
    # --names-only ignores values.
    proc = run_text("diff", planted["base"], planted["moved_nan"], "--names-only")
    assert (proc.returncode, proc.stdout.strip()) == (0, "same")


def test_diff_values_and_names_only_with_dtype_change(planted, tmp_path):
    src = planted["big"]
    dst = str(tmp_path / "half" / "model.ckpt")
    tfckpt.convert(src, dst, "float16")
    a = np.arange(2500, dtype=np.float32) / 7
    err = np.abs(a.astype(np.float64) - a.astype(np.float16).astype(np.float64))
    data = json.loads(run_text("diff", src, dst, "--json").stdout)
    assert data["changed"] == [
        {
            "name": "big",
            "dtype_a": "float32",
            "dtype_b": "float16",
            "shape_a": [2500],
            "shape_b": [2500],
        }
    ]
    (v,) = data["values"]
    assert (v["name"], v["elements"], v["differing"]) == ("big", 2500, int((err > 0).sum()))
    assert v["max_abs"] == err.max()
    data = json.loads(run_text("diff", src, dst, "--json", "--names-only").stdout)
    assert data["values"] == [] and len(data["changed"]) == 1
    assert run_text("diff", src, dst, "--names-only").returncode == 1
    # Chunk boundaries never change the answer (float32 and float16 chunks differ in length).
    with tfckpt.open(src) as x, tfckpt.open(dst) as y:
        want = tfi.compare_values(x, y, "big")
        for chunk in (2, 6, 64, 1000, 9999):
            assert tfi.compare_values(x, y, "big", chunk_bytes=chunk) == want, chunk


@pytest.mark.parametrize("argv", [["diff", "{missing}", "{missing}"], ["diff", "{a}", "{missing}"]])
def test_diff_missing_path_exit_2(planted, argv):
    paths = dict(planted, missing=str(planted["dir"] / "nothing" / "here"))
    assert_cli_error(run_text(*[x.format(**paths) for x in argv]), paths["missing"])


# ---------------------------------------------------------------- dump values and tables


def test_dump_tensor_summarizes_large_tensors_unless_full(planted):
    rc, out, _ = in_process("dump", planted["big"], "--tensor", "big")
    assert rc == 0 and "..." in out and len(out) < 2000
    rc, out, _ = in_process("dump", planted["big"], "--tensor", "big", "--full")
    assert rc == 0 and "..." not in out
    body = out.split("\n", 1)[1].replace("[", " ").replace("]", " ").split()
    got = np.array(body, dtype=np.float64).astype(np.float32)
    assert got.tobytes() == (np.arange(2500, dtype=np.float32) / 7).tobytes()


def test_dump_tensor_by_regex_and_repeated(planted):
    rc, out, _ = in_process("dump", planted["a"], "--tensor", "^only_a/", "--tensor", "only_a/x")
    assert rc == 0
    headers = [line for line in out.splitlines() if "(" in line]
    assert headers == ["only_a/x (float32 [3])", "only_a/y (int32 [2])"]  # each once


def test_dump_table_width(tmp_path):
    names = {
        f"encoder/block_{i}/attention/multi_head/query_projection/kernel/ExponentialMovingAverage": np.zeros(
            (i + 1, 3), np.float32
        )
        for i in range(3)
    }
    names["step"] = np.array(1, np.int64)
    prefix = tfckpt.save(names, str(tmp_path / "m"))
    narrow = run_text("dump", "m", cwd=tmp_path, env=user_env(COLUMNS="80"))
    assert narrow.returncode == 0
    assert all(len(line) <= 80 for line in narrow.stdout.splitlines()), narrow.stdout
    assert "…" in narrow.stdout
    wide = run_text("dump", "m", cwd=tmp_path, env=user_env(COLUMNS="200"))
    assert all(name in wide.stdout for name in names)
    piped = run_text("dump", prefix)
    assert all(name in piped.stdout for name in names) and "…" not in piped.stdout
    assert "\033[" not in piped.stdout  # no colour when not a terminal


def test_stats_table_fits_80_columns(tf_checkpoints):
    case = tf_checkpoints("keras_manager")
    proc = run_text("stats", case.path, env=user_env(COLUMNS="80"))
    assert proc.returncode == 0
    too_long = [line for line in proc.stdout.splitlines() if len(line) > 80]
    assert not too_long, too_long


def test_diff_table_fits_80_columns(tf_checkpoints, tmp_path):
    case = tf_checkpoints("keras_manager")
    dst = str(tmp_path / "fp16" / "ckpt")
    tfckpt.convert(case.path, dst, "float16")
    proc = run_text("diff", case.path, dst, env=user_env(COLUMNS="80"))
    assert proc.returncode == 1
    table = proc.stdout.split("NAME", 1)[1].splitlines()[1:-1]
    assert table and all(len(line) <= 80 for line in table), table


# ---------------------------------------------------------------- stats


def test_stats_text_and_json_agree(planted):
    proc = run_text("stats", planted["a"])
    assert proc.returncode == 0
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines() if line.strip()}
    assert rows["common/w"][1:] == ["float32", "-inf", "3", "1.333", "1.247", "1", "1", "20.0%"]
    assert rows["common/words"][1:] == ["string"] + ["-"] * 7
    assert rows["only_a/y"][1:] == ["int32", "1", "1", "1", "0", "0", "0", "0.0%"]
    assert (
        "every floating-point tensor casts to float16 and bfloat16 without overflow, flush "
        "to zero or subnormals"
    ) in proc.stdout
    data = json.loads(run_text("stats", planted["a"], "--json", "--filter", "^common/w$").stdout)
    assert data["tensors"][0]["min"] == "-Infinity"  # strict JSON
    data["tensors"][0]["min"] = float("-inf")
    (rec,) = data["tensors"]
    finite = np.array([1.0, 3.0, 0.0])
    assert rec["mean"] == finite.mean() and rec["std"] == pytest.approx(finite.std(), rel=1e-15)
    assert (rec["nan"], rec["inf"], rec["zeros"], rec["min"], rec["max"]) == (
        1,
        1,
        0.2,
        -np.inf,
        3.0,
    )
    assert rec["cast"] == {
        t: {"overflow": 0, "to_zero": 0, "subnormal": 0} for t in ("float16", "bfloat16")
    }


def test_stats_planted_cast_counts_with_tfckpt_save(tmp_path):
    x = np.concatenate(
        [
            np.full(3, 1e5),
            np.full(2, -7e4),
            np.full(4, 1e-9),
            np.full(5, 1e-6),
            np.full(6, 0.5),
            [np.nan, np.inf],
        ]
    ).astype(np.float32)
    bf = np.array([1e10, 1e-10, 3.0, -2e9], dtype=np.float32).astype(ml_dtypes.bfloat16)
    prefix = tfckpt.save({"x": x, "bf": bf}, str(tmp_path / "m"))
    with tfckpt.open(prefix) as ckpt:
        for chunk in (1 << 20, 4, 7):
            recs = {r["name"]: r for r in tfi.stats(ckpt, chunk_bytes=chunk)["tensors"]}
            assert recs["x"]["cast"]["float16"] == {"overflow": 5, "to_zero": 4, "subnormal": 5}
            assert recs["x"]["cast"]["bfloat16"] == {"overflow": 0, "to_zero": 0, "subnormal": 0}
            assert recs["bf"]["cast"] == {"float16": {"overflow": 2, "to_zero": 1, "subnormal": 0}}
            assert (recs["x"]["nan"], recs["x"]["inf"]) == (1, 1)
    proc = run_text("stats", prefix)
    risky = proc.stdout.split("if cast:")[1].splitlines()
    assert ["x", "float16", "5", "4", "5"] in [r.split() for r in risky]
    assert ["bf", "float16", "2", "1", "0"] in [r.split() for r in risky]


def test_stats_prints_no_numpy_warnings(tf_checkpoints):
    proc = run_text("stats", tf_checkpoints("all_dtypes").path)
    assert proc.returncode == 0
    assert proc.stderr == ""


# ---------------------------------------------------------------- verify


def test_verify_ok_line_and_json(planted):
    proc = run_text("verify", planted["a"])
    assert proc.returncode == 0 and proc.stderr == ""
    assert re.fullmatch(
        rf"ok: {re.escape(planted['a'])}: 5 tensors, \d+ B, every checksum, "
        r"shard, slice and object-graph key checked\n",
        proc.stdout,
    ), proc.stdout
    data = json.loads(run_text("verify", planted["a"], "--json").stdout)
    assert data == {
        "prefix": planted["a"],
        "tensors": 5,
        "bytes": data["bytes"],
        "problems": [],
        "warnings": [],
        "partial": [],
    }


def test_verify_reports_every_problem_once(tmp_path):
    values = {n: np.arange(50, dtype=np.int32) + i for i, n in enumerate("abcd")}
    prefix = tfckpt.save(values, str(tmp_path / "m"))
    with tfckpt.open(prefix) as ckpt:
        offsets = {n: ckpt.info(n).offset for n in values}
    shard = prefix + ".data-00000-of-00001"
    for n in "bd":
        flip_byte(shard, offsets[n] + 3)
    proc = run_text("verify", prefix)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and "'b'" in lines[0] and "'d'" in lines[1], lines
    assert all(line.startswith(shard + ": tensor ") for line in lines)


def test_verify_extra_shard_file_and_missing_shard(tmp_path):
    prefix = tfckpt.save(
        {"a": np.arange(100, dtype=np.float32), "b": np.ones(100, np.float64)},
        str(tmp_path / "m"),
        max_shard_bytes=500,
    )
    with tfckpt.open(prefix) as ckpt:
        assert ckpt.header.num_shards == 2
        in_1 = [n for n in ckpt if ckpt.info(n).shard == 1]
    stray = prefix + ".data-00000-of-00005"
    Path(stray).write_bytes(b"x")
    missing = prefix + ".data-00001-of-00002"
    os.remove(missing)
    proc = run_text("verify", prefix)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert any(line.startswith(stray + ":") and "5-shard" in line for line in lines), lines
    assert any(line.startswith(missing + ":") and "missing" in line for line in lines), lines
    assert all(line.startswith((stray, missing)) for line in lines), lines
    assert len(lines) == 2 + len(in_1)
