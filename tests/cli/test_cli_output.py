"""What the command line prints, on checkpoints TensorFlow wrote during the run.

- ``--json``: stdout is one JSON document for every command, names exact;
- human-readable output: no tensor name, path or message from a file reaches the terminal
  as control characters, bidi overrides or bytes that are not UTF-8;
- names that are not UTF-8 (TensorFlow takes any bytes): read, verified, rewritten and
  printed, keys byte-identical to TensorFlow's.

Commands run with a strict UTF-8 stdout and stderr, as a terminal has: most in this
process (fast), some as their own process.
"""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from cli_helpers import (  # noqa: E402
    assert_cli_error,
    assert_terminal_safe,
    bytes_name,
    run,
    run_process,
    tf_keys,
)

import tfckpt  # noqa: E402
import tfckpt.cli  # noqa: E402
from tfckpt.format import orderedcode  # noqa: E402

# Names TensorFlow saves as given: window title, clear screen, a forged table row, a
# right-to-left override, a clipboard write (OSC 52), bidi isolates, a C1 CSI, DEL.
HOSTILE = [
    "\x1b]0;pwned\x07",
    "\x1b[2J",
    "a\nb  float32  [1]",
    "\u202eevil",
    "\x1b]52;c;cHduZWQ=\x07",
    "\u2066iso\u2069",
    "c1\x9b31m",
    "del\x7f",
]
PARTITIONED = "\x1b[2J"  # also written as two slices: its slice keys hold the escape


def tf_value(prefix: str, name: str) -> np.ndarray:
    return np.asarray(tf.train.load_checkpoint(prefix).get_tensor(bytes_name(name)))


# ---------------------------------------------------------------- TensorFlow writers


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """A SaveV2 checkpoint with HOSTILE names, found through a state file TensorFlow wrote,
    whose directory and prefix hold escapes too; and a TF2 checkpoint with a hostile
    attribute name, for the object graph."""
    root = tmp_path_factory.mktemp("hostile") / "run\x1b]0;dir\x07"
    root.mkdir()
    prefix = str(root / "model\x1b[2J\x1b]0;prefix\x07.ckpt")
    rng = np.random.default_rng(7)
    values = {n: rng.standard_normal(3).astype(np.float32) for n in HOSTILE}
    names, specs, tensors = [], [], []
    for n in HOSTILE:
        if n == PARTITIONED:
            names += [bytes_name(n)] * 2
            specs += ["3 0,1", "3 1,2"]
            tensors += [values[n][:1], values[n][1:]]
        else:
            names.append(bytes_name(n))
            specs.append("")
            tensors.append(values[n])
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=tf.constant(names),
        shape_and_slices=specs,
        tensors=[tf.constant(t) for t in tensors],
    )
    tf.compat.v1.train.update_checkpoint_state(str(root), prefix)
    assert tf.train.get_checkpoint_state(str(root)).model_checkpoint_path == prefix

    tf2_dir = root / "tf2"
    ckpt = tf.train.Checkpoint(
        **{"\x1b]0;attr\x07": tf.Variable([1.0, 2.0]), "step": tf.Variable(3, dtype=tf.int64)}
    )
    tf.train.CheckpointManager(
        ckpt, str(tf2_dir), max_to_keep=1, checkpoint_name="ck\x1b[2J"
    ).save()

    # Derived with tfckpt, for diff: values changed (float16) and names missing.
    f16 = str(root / "f16\x1b[2J" / "m")
    tfckpt.convert(prefix, f16, "float16")
    fewer = str(root / "fewer" / "m")
    tfckpt.transform([prefix], fewer, exclude=["^a"])
    return {
        "dir": str(root),
        "prefix": prefix,
        "values": values,
        "tf2": str(tf2_dir),
        "f16": f16,
        "fewer": fewer,
        "out": str(root / "out\x1b]0;out\x07"),
    }


BYTES_NAMES = [b"caf\xe9", b"\xff\xfe", b"\xe9t\xe9/kernel", b"plain"]


@pytest.fixture(scope="module")
def bytes_ckpt(tmp_path_factory):
    """Names that are not UTF-8, one of them partitioned, written by SaveV2."""
    prefix = str(tmp_path_factory.mktemp("bytes") / "model.ckpt")
    rng = np.random.default_rng(8)
    cafe = rng.standard_normal((4, 2)).astype(np.float32)
    values = {
        b"caf\xe9": cafe,
        b"\xff\xfe": np.array([1, 2], np.int32),
        b"\xe9t\xe9/kernel": rng.standard_normal((2, 3)).astype(np.float32),
        b"plain": np.array([b"x", b"\xff"], dtype=object),
    }
    names = [b"caf\xe9", b"caf\xe9", b"\xff\xfe", b"\xe9t\xe9/kernel", b"plain"]
    specs = ["4 2 0,1:-", "4 2 1,3:-", "", "", ""]
    tensors = [
        cafe[:1],
        cafe[1:],
        values[b"\xff\xfe"],
        values[b"\xe9t\xe9/kernel"],
        values[b"plain"],
    ]
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=tf.constant(names),
        shape_and_slices=specs,
        tensors=[tf.constant(t) for t in tensors],
    )
    return {"prefix": prefix, "values": values}


# ---------------------------------------------------------------- --json: JSON, always


def _from_json(t: dict) -> np.ndarray:
    """A ``dump --tensor --json`` record back to an array of its dtype."""
    dtype, shape, values = t["dtype"], tuple(t["shape"]), t["values"]
    if dtype == "string":
        decode = (lambda s: s.encode("utf-8")) if t["encoding"] == "utf-8" else base64.b64decode
        flat = np.array(values, dtype=object).reshape(-1)
        out = np.empty(flat.size, dtype=object)
        out[:] = [decode(s) for s in flat]
        return out.reshape(shape)
    np_dtype = np.dtype(tf.as_dtype(dtype).as_numpy_dtype)
    flat = np.array(values, dtype=object).reshape(-1).tolist()
    if np_dtype.names:  # quantized: TensorFlow's one-field structured dtype
        return np.array(flat, dtype=np_dtype[0]).view(np_dtype).reshape(shape)
    if np_dtype.kind in "biu" or dtype.startswith(("int", "uint")):
        return np.array(flat, dtype=np_dtype).reshape(shape)
    special = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
    floats = np.array(
        [special.get(v, v) if isinstance(v, str) else v for v in flat], dtype=np.float64
    )
    if dtype.startswith("complex"):
        parts = floats.reshape(-1, 2)
        floats = np.empty(len(parts), np.complex128)
        floats.real, floats.imag = parts[:, 0], parts[:, 1]
    return floats.astype(np_dtype).reshape(shape)


def test_dump_tensor_json_is_exact(tf_checkpoints):
    case = tf_checkpoints("all_dtypes")
    proc = run_process("dump", case.path, "--tensor", ".", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    reader = tf.train.load_checkpoint(case.prefix)
    dtypes = reader.get_variable_to_dtype_map()
    assert data["prefix"] == case.prefix
    assert sorted(t["name"] for t in data["tensors"]) == sorted(dtypes)
    seen_nan = False
    for t in data["tensors"]:
        name, dt = t["name"], dtypes[t["name"]]
        want = np.asarray(reader.get_tensor(name))
        assert t["dtype"] == dt.name and tuple(t["shape"]) == want.shape, name
        got = _from_json(t)
        if dt == tf.string:
            assert got.tolist() == want.tolist(), name
            continue
        pairs = [(got, want)]
        if dt.is_complex:
            pairs = [(got.real, want.real), (got.imag, want.imag)]
        for g, w in pairs:
            if dt.is_floating or dt.is_complex:
                # NaN is written "NaN": its sign and payload are not kept; all else is.
                with np.errstate(invalid="ignore"):
                    nan = np.isnan(w.astype(np.float64))
                seen_nan |= bool(nan.any())
                assert np.array_equal(np.isnan(g.astype(np.float64)), nan), name
                g, w = g[~nan], w[~nan]
            assert g.tobytes() == w.tobytes(), name
    assert seen_nan
    by_name = {t["name"]: t for t in data["tensors"]}
    for name in ("bfloat16", "float8_e4m3fn", "float16"):  # numbers, not text
        assert isinstance(by_name[name]["values"][0][0], float)
    assert by_name["string_2d"]["encoding"] == "base64"
    assert by_name["string_scalar"]["encoding"] == "base64"
    assert (
        by_name["scalar_float32"]["values"] == -0.0
        and math.copysign(1, by_name["scalar_float32"]["values"]) == -1
    )


def test_every_command_prints_only_json(tf_checkpoints, tmp_path):
    sliced = tf_checkpoints("savev2_slices").path
    root = tmp_path / "tf2"
    ckpt = tf.train.Checkpoint(v=tf.Variable([1.0, 2.0]), step=tf.Variable(3, dtype=tf.int64))
    tf.train.CheckpointManager(ckpt, str(root), max_to_keep=1).save()
    out = tmp_path / "out"
    commands = [
        ["dump", sliced],
        ["dump", sliced, "--filter", "^emb"],
        ["dump", sliced, "--tensor", "emb", "--tensor", "^plain"],
        ["dump", root, "--object-graph"],
        ["diff", sliced, root],
        ["diff", sliced, sliced, "--names-only"],
        ["stats", sliced],
        ["verify", sliced],
        ["convert", sliced, out / "c", "--dtype", "float16", "--dry-run"],
        ["convert", sliced, out / "c", "--dtype", "float16"],
        ["rename", sliced, out / "r", "--map", "emb=embedding", "--dry-run"],
        ["rename", sliced, out / "r", "--map", "emb=embedding"],
        ["select", root, out / "s", "--drop-object", "v", "--dry-run"],
        ["select", root, out / "s", "--drop-object", "v"],
        ["merge", sliced, out / "c", "-o", out / "m", "--prefer", "first", "--dry-run"],
        ["merge", sliced, out / "c", "-o", out / "m", "--prefer", "first"],
        ["diff", sliced, out / "c"],
        # Errors: one line on stderr, nothing on stdout.
        ["dump", tmp_path / "missing"],
        ["dump", sliced, "--tensor", "no-such-tensor"],
        ["convert", sliced, out / "c", "--dtype", "float16"],
    ]
    for argv in commands:
        proc = run(*argv, "--json")
        if proc.returncode == 2:
            assert_cli_error(proc)
            continue
        assert proc.returncode in (0, 1), (argv, proc.stderr)
        json.loads(proc.stdout.decode("ascii"))  # ASCII: every name is \u-escaped
    assert tfckpt.open(str(out / "m")).keys()  # the merge really ran


# ---------------------------------------------------------------- terminal control


ERRORS = 3  # the last three of _commands fail (exit status 2)


def _commands(h: dict) -> list[list]:
    d, out = h["dir"], h["out"]
    return [
        ["dump", d],
        ["dump", d, "--filter", "."],
        ["dump", d, "--tensor", "."],
        ["dump", h["tf2"], "--object-graph"],
        ["stats", d],
        ["verify", d],
        ["diff", d, h["f16"]],
        ["diff", d, h["fewer"]],
        ["diff", h["fewer"], d, "--names-only"],
        ["convert", d, out + "/c", "--dtype", "float16", "--dry-run", "--overwrite"],
        ["convert", d, out + "/c", "--dtype", "float16", "--overwrite"],
        ["select", d, out + "/s", "--exclude", "^a", "--dry-run"],
        ["rename", d, out + "/r", "--map", "\x1b=ESC", "--dry-run"],
        ["merge", d, h["fewer"], "-o", out + "/m", "--prefer", "first", "--dry-run"],
        ["merge", d, h["fewer"], "-o", out + "/m"],  # an error: names in both
        ["dump", d, "--tensor", "no-such-tensor"],  # an error naming the prefix
        ["dump", d + "/missing\x1b[2J"],
    ]


def test_human_output_carries_no_terminal_control(hostile):
    commands = _commands(hostile)
    for k, argv in enumerate(commands):
        proc = run(*argv)
        assert (proc.returncode == 2) == (k >= len(commands) - ERRORS), (argv, proc.stderr)
        assert_terminal_safe(proc, argv)
        text = proc.stdout.decode() + proc.stderr.decode()
        # A newline in a name does not start a row of its own.
        assert not any(line.startswith("b  float32  [1]") for line in text.split("\n"))
    proc = run_process("dump", hostile["dir"])
    assert_terminal_safe(proc, "dump as a process")
    dump = proc.stdout.decode()
    assert "\\x1b]0;pwned\\x07" in dump and "\\u202eevil" in dump and "a\\x0ab  float32" in dump
    assert "model\\x1b[2J\\x1b]0;prefix\\x07.ckpt" in dump  # from the state file


def test_problems_and_errors_on_stderr_are_escaped(hostile, tmp_path):
    # A damaged copy: verify names the tensor and the file, one line each, on stderr.
    src = Path(hostile["prefix"])
    dst = tmp_path / "bad\x1b]0;copy\x07"
    for f in src.parent.iterdir():
        if f.name.startswith(src.name + "."):
            (tmp_path / (dst.name + f.name[len(src.name) :])).write_bytes(f.read_bytes())
    data = Path(str(dst) + ".data-00000-of-00001")
    raw = bytearray(data.read_bytes())
    raw[0] ^= 0xFF
    data.write_bytes(bytes(raw))
    proc = run("verify", dst)
    assert proc.returncode == 1 and proc.stderr
    assert_terminal_safe(proc, "verify")
    assert "bad\\x1b]0;copy\\x07" in proc.stderr.decode()
    proc = run("dump", dst, "--tensor", ".")
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1
    assert_terminal_safe(proc, "dump --tensor")


def test_json_keeps_hostile_names_exact(hostile):
    d, names = hostile["dir"], set(HOSTILE)
    dump = json.loads(run("dump", d, "--json").stdout)
    assert {t["name"] for t in dump["tensors"]} == names
    assert dump["prefix"] == hostile["prefix"]
    values = json.loads(run("dump", d, "--tensor", ".", "--json").stdout)
    for t in values["tensors"]:
        assert np.array(t["values"], np.float32).tobytes() == hostile["values"][t["name"]].tobytes()
    assert {t["name"] for t in values["tensors"]} == names
    stats = json.loads(run("stats", d, "--json").stdout)
    assert {t["name"] for t in stats["tensors"]} == names
    diff = json.loads(run("diff", d, hostile["fewer"], "--json").stdout)
    assert set(diff["only_in_a"]) == {n for n in HOSTILE if n.startswith("a")}
    plan = json.loads(
        run("convert", d, hostile["out"] + "/p", "--dtype", "float16", "--dry-run", "--json").stdout
    )
    assert plan_names(plan) == names
    graph = json.loads(run("dump", hostile["tf2"], "--object-graph", "--json").stdout)
    assert "\x1b]0;attr\x07" in {c["name"] for c in graph["nodes"][0]["children"]}
    commands = _commands(hostile)
    for k, argv in enumerate(commands):
        proc = run(*argv, "--json")
        assert (proc.returncode == 2) == (k >= len(commands) - ERRORS), (argv, proc.stderr)
        assert b"\x1b" not in proc.stdout and b"\x7f" not in proc.stdout, argv
        assert_terminal_safe(proc, argv)


def plan_names(plan: dict) -> set[str]:
    return {t["name"] for t in plan["tensors"]}


# ---------------------------------------------------------------- names that are not UTF-8


def test_bytes_names_read_as_tensorflow_does(bytes_ckpt):
    prefix = bytes_ckpt["prefix"]
    keys = tf_keys(prefix)
    reader = tf.train.load_checkpoint(prefix)
    # tf.train.list_variables decodes names strictly (TF 2.21: UnicodeDecodeError on
    # these); TensorFlow's reader itself takes and lists bytes. tfckpt lists every name,
    # in index (byte) order.
    with tfckpt.open(prefix) as ckpt:
        assert [bytes_name(k) for k in ckpt.keys()] == sorted(BYTES_NAMES)
        assert all(reader.has_tensor(bytes_name(k)) for k in ckpt.keys())
        info = ckpt.info("caf\udce9")
        assert len(info.slices) == 2
        assert [orderedcode.encode_slice_key("caf\udce9", s) for s in info.slices] + [
            bytes_name(k) for k in ckpt.keys() if k != "caf\udce9"
        ] == keys
        for name in ckpt.keys():
            got, want = ckpt[name], tf_value(prefix, name)
            assert got.dtype == want.dtype and got.tolist() == want.tolist(), name
            assert got.tolist() == bytes_ckpt["values"][bytes_name(name)].tolist()
    proc = run_process("verify", prefix)
    assert proc.returncode == 0 and proc.stdout.startswith(b"ok: "), proc.stderr


def test_bytes_names_rewritten_and_read_back_by_tensorflow(bytes_ckpt, tmp_path):
    prefix, values = bytes_ckpt["prefix"], bytes_ckpt["values"]
    # float64: TensorFlow's reader cannot reassemble partitioned float16 tensors.
    proc = run("convert", prefix, f"{tmp_path}/f64/", "--dtype", "float64")
    assert proc.returncode == 0, proc.stderr
    out = str(tmp_path / "f64" / "model.ckpt")
    assert tf_keys(out) == tf_keys(prefix)  # slice keys included: still partitioned
    for name in values:
        want = values[name]
        got = tf_value(out, name.decode("utf-8", "surrogateescape"))
        if want.dtype == np.float32:
            want = want.astype(np.float64)
        assert got.dtype == want.dtype and got.tolist() == want.tolist(), name
    # A name that is not UTF-8 given on the command line: argv bytes, as a shell passes them.
    proc = run("select", prefix, f"{tmp_path}/sel/", "--include", b"^caf\xe9$|^\xff")
    assert proc.returncode == 0, proc.stderr
    sel = str(tmp_path / "sel" / "model.ckpt")
    assert tf_keys(sel) == [k for k in tf_keys(prefix) if k[:1] == b"\0"] + [b"\xff\xfe"]
    assert tf_value(sel, "caf\udce9").tobytes() == values[b"caf\xe9"].tobytes()
    proc = run("rename", prefix, f"{tmp_path}/ren/", "--map", b"caf\xe9=caf\xc3\xa9")
    assert proc.returncode == 0, proc.stderr
    assert (
        tf_value(str(tmp_path / "ren" / "model.ckpt"), "café").tobytes()
        == values[b"caf\xe9"].tobytes()
    )


def test_bytes_names_print_without_traceback(bytes_ckpt, tmp_path):
    prefix = bytes_ckpt["prefix"]
    f16 = str(tmp_path / "f16")
    tfckpt.convert(prefix, f16, "float16")
    commands = [
        ["dump", prefix],
        ["dump", prefix, "--tensor", "."],
        ["dump", prefix, "--filter", "caf"],
        ["stats", prefix],
        ["verify", prefix],
        ["diff", prefix, f16],
        ["diff", prefix, tmp_path / "none"],
        ["convert", prefix, tmp_path / "c", "--dtype", "float16", "--dry-run"],
        ["select", prefix, tmp_path / "s", "--exclude", "plain"],
        ["merge", prefix, f16, "-o", tmp_path / "m", "--prefer", "last", "--dry-run"],
    ]
    for argv in commands:
        for json_flag in ([], ["--json"]):
            proc = run(*argv, *json_flag)
            assert proc.returncode in (0, 1, 2), (argv, proc.stderr)
            assert_terminal_safe(proc, argv + json_flag)
    proc = run_process("stats", prefix)
    assert_terminal_safe(proc, "stats as a process")
    dump = run("dump", prefix).stdout.decode()
    assert "caf\\xe9" in dump and "\\xff\\xfe" in dump
    # --json: each byte that is not UTF-8 is the escape \udcXX (Python's surrogateescape).
    data = json.loads(run("dump", prefix, "--json").stdout)
    assert [bytes_name(t["name"]) for t in data["tensors"]] == sorted(BYTES_NAMES)
    assert b'"caf\\udce9"' in run_process("dump", prefix, "--json").stdout
    values = json.loads(run("dump", prefix, "--tensor", "^plain$", "--json").stdout)
    assert values["tensors"][0]["encoding"] == "base64"
    assert [base64.b64decode(v) for v in values["tensors"][0]["values"]] == [b"x", b"\xff"]


def test_rename_map_file_names_must_be_names(bytes_ckpt, tmp_path):
    # JSON names of non-UTF-8 bytes work as map keys; a lone surrogate that stands for no
    # byte is refused in one line.
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"caf\udce9": "cafe"}))
    proc = run("rename", bytes_ckpt["prefix"], f"{tmp_path}/r/", "--map-file", good)
    assert proc.returncode == 0, proc.stderr
    assert "cafe" in tfckpt.open(str(tmp_path / "r" / "model.ckpt"))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"caf\udce9": "\ud800"}))
    assert_cli_error(run("rename", bytes_ckpt["prefix"], tmp_path / "r2", "--map-file", bad))


def test_tf2_graph_keys_stay_utf8(hostile, tmp_path):
    # An object graph keeps its keys as proto strings: renaming into bytes that are not
    # UTF-8 is refused in one line, not a traceback.
    proc = run_process("rename", hostile["tf2"], f"{tmp_path}/r/", "--map", b"step=caf\xe9")
    assert_cli_error(proc, "UTF-8")
    assert_terminal_safe(proc, "rename")
    assert b"UTF-8" in proc.stderr and not (tmp_path / "r").exists()
