"""The command line helps (issue 28): every dtype name means the same everywhere, a bad
value is one line with the nearest good one, bare ``tfckpt`` lists the commands, a
command's help shows its own arguments first, ``--debug`` anywhere, options named as
flags, names in natural order, one meaning of a size. Checkpoints are TensorFlow's."""

from __future__ import annotations

import re

import numpy as np
import pytest
from cli_helpers import assert_cli_error, in_process

import tfckpt
from tfckpt.format import dtypes as _dt

tf = pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A TF2 checkpoint of twelve float32 variables in a list (keys vs/0 ... vs/11) and
    an int64 step: names whose plain sort puts 10 before 2."""
    d = tmp_path_factory.mktemp("helpful")
    rng = np.random.default_rng(28)
    vs = [tf.Variable(rng.standard_normal(3 + i).astype(np.float32)) for i in range(12)]
    return tf.train.Checkpoint(vs=vs, step=tf.Variable(np.int64(7))).write(str(d / "ckpt"))


# --- dtype names: one parser ------------------------------------------------------


@pytest.mark.parametrize(
    "given, name",
    [
        ("half", "float16"),
        ("fp16", "float16"),
        ("f16", "float16"),
        ("FP16", "float16"),
        ("f2", "float16"),
        ("float", "float32"),
        ("fp32", "float32"),
        ("double", "float64"),
        ("bf16", "bfloat16"),
        ("bfloat16", "bfloat16"),
        ("int8", "int8"),
        ("i4", "int32"),
    ],
)
def test_dtype_names(given, name):
    assert _dt.lookup(given).name == name


def test_unknown_dtype_is_a_checkpoint_error_with_the_nearest_name():
    with pytest.raises(tfckpt.UnknownDTypeError, match="did you mean 'float32'") as e:
        _dt.lookup("flaot32")
    assert isinstance(e.value, tfckpt.CheckpointError) and isinstance(e.value, ValueError)


@pytest.mark.parametrize("flag", ["--dtype", "--from", "--dtype-rule"])
def test_every_flag_takes_every_name(ckpt, tmp_path, flag):
    """``half`` through --dtype, --from and --dtype-rule alike; TensorFlow reads float16."""
    extra = {
        "--dtype": ["--dtype", "half"],
        "--from": ["--dtype", "fp16", "--from", "float"],
        "--dtype-rule": ["--dtype-rule", "vs/=half"],
    }[flag]
    rc, out, err = in_process("convert", ckpt, tmp_path / "out" / "ckpt", *extra)
    assert rc == 0, err
    reader = tf.train.load_checkpoint(str(tmp_path / "out" / "ckpt"))
    assert reader.get_variable_to_dtype_map()["vs/3/.ATTRIBUTES/VARIABLE_VALUE"] == tf.float16


def test_python_convert_takes_tensorflow_and_short_names(ckpt, tmp_path):
    for i, name in enumerate(["half", "bf16", "f2"]):
        tfckpt.convert(ckpt, tmp_path / str(i) / "ckpt", name)
    with pytest.raises(tfckpt.UnknownDTypeError, match="did you mean 'float16'"):
        tfckpt.convert(ckpt, tmp_path / "x" / "ckpt", "flaot16")
    with pytest.raises(tfckpt.CheckpointError, match="did you mean 'float32'"):
        tfckpt.convert(ckpt, tmp_path / "y" / "ckpt", "float16", cast_from=["flaot32"])
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--dtype", "flaot16"], "did you mean 'float16'?"),
        (["--dtype", "int8"], "cannot cast to 'int8'"),
        (["--dtype", "half", "--from", "flaot32"], "did you mean 'float32'?"),
        (["--dtype-rule", "vs/=flaot16"], "did you mean 'float16'?"),
        (["--overflow", "clp"], "did you mean 'clip'?"),
    ],
)
def test_bad_values_are_one_line(ckpt, tmp_path, flags, fragment):
    line = assert_cli_error(in_process("convert", ckpt, tmp_path / "o", *flags), fragment)
    assert "usage:" not in line and not (tmp_path / "o").exists()


def test_unknown_command_suggests_the_nearest():
    assert_cli_error(in_process("dupm", "x"), "unknown command 'dupm'", "did you mean 'dump'?")


def test_a_bad_argument_is_shown_escaped():
    line = assert_cli_error(in_process("dump", "a", "b\x1b[31mc"), "unrecognized arguments")
    assert "\x1b" not in line and "b\\x1b[31mc" in line


def test_missing_argument_is_one_line():
    assert_cli_error(in_process("convert"), "required", "tfckpt convert --help")


def test_tensor_name_and_preset_suggestions(ckpt, tmp_path):
    assert_cli_error(
        in_process("edit", ckpt, tmp_path / "e", "--set", "vs/3/.ATTRIBUTES/VARIABLE_VALU=0"),
        "did you mean 'vs/3/.ATTRIBUTES/VARIABLE_VALUE'?",
    )
    assert_cli_error(
        in_process("dump", ckpt, "--tensor", "vs/11/.ATTRIBUTES/VARIABLE_VALEU"),
        "did you mean 'vs/11/.ATTRIBUTES/VARIABLE_VALUE'?",
    )
    with tfckpt.open(ckpt) as c, pytest.raises(tfckpt.TensorNotFoundError, match="did you mean"):
        c["vs/3/.ATTRIBUTES/VARIABLE_VALU"]
    assert_cli_error(
        in_process("export", ckpt, tmp_path / "hf", "--preset", "hf-bret"),
        "did you mean 'hf-bert'?",
    )


# --- help ---------------------------------------------------------------------------


def test_bare_tfckpt_lists_the_commands():
    rc, out, err = in_process()
    assert rc == 2 and err == ""
    for command, summary in [("dump", "list the tensors"), ("convert", "cast floating-point")]:
        assert re.search(rf"^\s+{command}\s+{summary}", out, re.M), out
    assert "completion" in out


def test_command_help_shows_its_own_arguments_first():
    rc, out, _ = in_process("convert", "--help-all")
    assert rc == 0
    assert out.splitlines()[0] == "usage: tfckpt convert [options] SRC DST"
    # Positionals have help; --dtype comes before the shared options, which come last.
    assert re.search(r"^  SRC\s+\S", out, re.M) and re.search(r"^  DST\s+\S", out, re.M)
    order = [out.index(s) for s in ("--dtype DTYPE", "--prefer", "shared options:")]
    assert order == sorted(order)
    shared = out[out.index("shared options:") : out.index("examples:")]
    for flag in ("--storage-option", "--executor", "--backend", "--chunk-bytes", "--debug"):
        assert flag in shared
    # The real default of --backend: NumKong where the CPU has it.
    assert "NumKong" in " ".join(shared.split())


def test_debug_anywhere(tmp_path):
    missing = tmp_path / "nothing"
    for argv in (["--debug", "dump", missing], ["dump", missing, "--debug"]):
        rc, out, err = in_process(*argv)
        assert rc == 2 and "Traceback" in err, argv
    rc, out, err = in_process("dump", missing)
    assert rc == 2 and "Traceback" not in err


# --- flags on the command line, arguments in Python ----------------------------------


def test_messages_name_flags_on_the_command_line_and_arguments_in_python(ckpt, tmp_path):
    out = tmp_path / "o" / "ckpt"
    tfckpt.convert(ckpt, out, "half")
    line = assert_cli_error(in_process("convert", ckpt, out, "--dtype", "half"), "--overwrite")
    assert "overwrite=True" not in line and "use overwrite)" not in line
    with pytest.raises(tfckpt.CheckpointError, match=r"overwrite=True") as e:
        tfckpt.convert(ckpt, out, "half")
    assert "--overwrite" not in str(e.value)
    line = assert_cli_error(
        in_process("merge", ckpt, ckpt, "-o", tmp_path / "m"), "--prefer first|last"
    )
    assert "prefer=" not in line
    with pytest.raises(tfckpt.CheckpointError, match="prefer='first' or 'last'") as e:
        tfckpt.merge([ckpt, ckpt], tmp_path / "m")
    assert "--prefer" not in str(e.value)
    # The library's edit speaks arguments too, its command flags.
    assert_cli_error(
        in_process("edit", ckpt, tmp_path / "e", "--set", "nope=0"), "--set: no tensor"
    )
    with pytest.raises(tfckpt.CheckpointError, match="set: no tensor 'nope'") as e:
        tfckpt.edit(ckpt, tmp_path / "e", set={"nope": 0})
    assert "--set" not in str(e.value) and "--set" in e.value.cli_message


# --- listings -------------------------------------------------------------------------


def test_dump_lists_names_in_natural_order(ckpt):
    rc, out, err = in_process("dump", ckpt)
    assert rc == 0, err
    listed = [int(m) for m in re.findall(r"^vs/(\d+)/", out, re.M)]
    assert listed == list(range(12)), listed
    rc, out, err = in_process("dump", ckpt, "--json")
    names = [t["name"] for t in __import__("json").loads(out)["tensors"]]
    vs = [int(n.split("/")[1]) for n in names if n.startswith("vs/")]
    assert vs == list(range(12))


def test_sizes_mean_one_thing(ckpt):
    """dump's total, dump --all's SIZE: the bytes of the tensor data on disk (the data
    files' size, for a bundle TensorFlow wrote)."""
    import json
    from pathlib import Path

    _, out, _ = in_process("dump", ckpt, "--json")
    total = json.loads(out)["total_bytes"]
    data = sum(p.stat().st_size for p in Path(ckpt).parent.glob(Path(ckpt).name + ".data-*"))
    assert total == data
    _, out, _ = in_process("dump", Path(ckpt).parent, "--all", "--json")
    (row,) = json.loads(out)["checkpoints"]
    assert row["tensor_bytes"] == total
    _, text, _ = in_process("dump", ckpt)
    assert f"({total} bytes of tensor data on disk)" in text
    _, text, _ = in_process("dump", Path(ckpt).parent, "--all")
    assert re.search(rf"\b{Path(ckpt).name}\s+-\s+14\s+{re.escape(tfckpt_bytes(total))}", text), (
        text
    )


def tfckpt_bytes(n: int) -> str:
    from tfckpt.cli.display import human_bytes

    return human_bytes(n)


def test_a_rules_file_takes_the_same_names(ckpt, tmp_path):
    rules = tmp_path / "r.toml"
    rules.write_text(
        'cast = "bf16"\ncast_from = ["float"]\n[[dtype]]\nmatch = "vs/1/"\ndtype = "half"\n'
    )
    rc, out, err = in_process("convert", ckpt, tmp_path / "out" / "ckpt", "--rules", rules)
    assert rc == 0, err
    dtypes = tf.train.load_checkpoint(str(tmp_path / "out" / "ckpt")).get_variable_to_dtype_map()
    assert dtypes["vs/1/.ATTRIBUTES/VARIABLE_VALUE"] == tf.float16
    assert dtypes["vs/2/.ATTRIBUTES/VARIABLE_VALUE"] == tf.bfloat16
    rules.write_text('cast = "bfloat61"\n')
    assert_cli_error(
        in_process("convert", ckpt, tmp_path / "bad", "--rules", rules), "did you mean 'bfloat16'?"
    )
