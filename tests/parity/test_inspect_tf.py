"""The inspection commands (dump, diff, stats, verify) held to TensorFlow's word.

Every checkpoint here is written by real TensorFlow (the session fixtures of
``conftest.py`` / ``tf_checkpoints.py``, or ``tf.raw_ops.SaveV2`` of planted values),
and every expected number is computed independently: by TensorFlow's own reader and
``tf.cast``, or by numpy over the values that were written. Shared fixtures are
never modified; corruption tests work on copies.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import tf_checkpoints as W  # noqa: E402  (conftest puts tests/ on sys.path)
from cli_helpers import assert_cli_error, in_process, run_text, user_env  # noqa: E402

import tfckpt  # noqa: E402
import tfckpt.cli  # noqa: E402
import tfckpt.inspection as tfi  # noqa: E402
from tfckpt.format.natural import natural_key  # noqa: E402

# TensorFlow's C++ logging that ignores TF_CPP_MIN_LOG_LEVEL (absl, before init).
_TF_NOISE = re.compile(
    r"^(WARNING: All log messages before absl|[IWE]\d{4} |To enable the following "
    r"instructions)"
)


# ---------------------------------------------------------------- helpers


def from_json(value):
    """tfckpt's JSON is strict: non-finite floats come as "NaN", "Infinity", "-Infinity"."""
    special = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}
    if isinstance(value, str):
        return special.get(value, value)
    if isinstance(value, dict):
        return {k: from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_json(v) for v in value]
    return value


def run_json(*args, **kw):
    proc = run_text(*args, **kw)
    assert proc.returncode in (0, 1), proc.stderr
    return from_json(json.loads(proc.stdout))


def stderr_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not _TF_NOISE.match(line)]


def copy_checkpoint(case, dst: Path) -> str:
    """Copy the directory holding a fixture's checkpoint; return the copy's prefix."""
    src_dir = Path(case.prefix).parent
    shutil.copytree(src_dir, dst)
    return str(dst / Path(case.prefix).name)


def flip_byte(path, offset: int, mask: int = 0x01) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ mask]))


def save_v2(prefix: str, arrays: dict[str, np.ndarray]) -> str:
    """Whole tensors written by TensorFlow's SaveV2 op."""
    W._save_v2(prefix, {k: W.to_tf_tensor(v) for k, v in arrays.items()})
    return prefix


def tf_reader_values(prefix: str) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(prefix)
    dtypes = reader.get_variable_to_dtype_map()
    return {k: W.tf_tensor(reader, k, dtype=dtypes[k]) for k in dtypes}


def as_f64(a: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.asarray(a).astype(np.float64)


# ---------------------------------------------------------------- dump --json vs TensorFlow

DUMP_CASES = [
    "tf1_saver",
    "tf1_sharded",
    "tf1_partitioned",
    "savev2_slices",
    "all_dtypes",
    "keras_manager",
    "max_shard_policy",
    "saved_model",
    "tf1_state_absolute",
]


def _cover_count(shape, slices) -> np.ndarray:
    count = np.zeros(shape, dtype=np.int64)
    for s in slices:
        count[
            tuple(
                slice(None) if length is None else slice(start, start + length)
                for start, length in s
            )
        ] += 1
    return count


@pytest.mark.parametrize("case_name", DUMP_CASES)
def test_dump_json_equals_tensorflow_reader(tf_checkpoints, case_name):
    case = tf_checkpoints(case_name)
    data = run_json("dump", case.path, "--json")
    reader = tf.train.load_checkpoint(case.prefix)
    tf_names = [name for name, _ in tf.train.list_variables(case.prefix)]
    tf_dtypes = reader.get_variable_to_dtype_map()
    tf_shapes = reader.get_variable_to_shape_map()

    assert data["prefix"] == case.prefix
    # TensorFlow's names, in the natural order dump lists them (vs/2 before vs/10).
    assert [t["name"] for t in data["tensors"]] == sorted(tf_names, key=natural_key)
    assert data["tensor_count"] == len(tf_names)
    for t in data["tensors"]:
        assert t["dtype"] == tf_dtypes[t["name"]].name, t["name"]
        assert t["shape"] == tf_shapes[t["name"]], t["name"]
        if t["dtype"] != "string":
            itemsize = tf.as_dtype(t["dtype"]).size
            assert t["bytes"] == int(np.prod(t["shape"], dtype=np.int64)) * itemsize, t["name"]

    # Bytes: per tensor they add up to the total, which is exactly what the data files hold.
    files = W.data_files(case.prefix)
    assert data["num_shards"] == len(files)
    assert sum(t["bytes"] for t in data["tensors"]) == data["total_bytes"]
    assert data["total_bytes"] == sum(f.stat().st_size for f in files)
    assert data["endianness"] == "little" and data["version"]["producer"] == 1

    # Scopes: recomputed from the tensors, largest first (ties by name).
    want: dict[str, list[int]] = {}
    for t in data["tensors"]:
        scope = t["name"].split("/", 1)[0]
        acc = want.setdefault(scope, [0, 0])
        acc[0] += t["bytes"]
        acc[1] += 1
    got = [(s["scope"], s["bytes"], s["tensors"]) for s in data["scopes"]]
    assert got == sorted(((s, b, n) for s, (b, n) in want.items()), key=lambda r: (-r[1], r[0]))
    assert [b for _, b, _ in got] == sorted((b for _, b, _ in got), reverse=True)

    # Partitioned tensors: slices that tile the full shape exactly once, no shard of their own.
    partitioned = set(case.extra.get("partitioned", []))
    for t in data["tensors"]:
        if t["name"] in partitioned:
            assert t["slices"], t["name"]
            assert t["shard"] is None and t["offset"] is None and t["crc32c"] is None, t
            assert all(len(s) == len(t["shape"]) for s in t["slices"])
            assert (_cover_count(t["shape"], t["slices"]) == 1).all(), t
        else:
            assert t["slices"] == [], t["name"]
            assert 0 <= t["shard"] < data["num_shards"] and t["offset"] >= 0, t


def test_dump_json_slices_are_the_ones_tensorflow_wrote(tf_checkpoints):
    data = run_json("dump", tf_checkpoints("savev2_slices").path, "--json")
    slices = {t["name"]: sorted(map(str, t["slices"])) for t in data["tensors"]}
    # tf.raw_ops.SaveV2 shape_and_slices of tf_checkpoints.write_savev2_slices.
    assert slices["emb"] == sorted(map(str, [[[0, 4], [0, None]], [[4, 6], [0, None]]]))
    assert slices["cols"] == sorted(map(str, [[[0, None], [0, 3]], [[0, None], [3, 5]]]))
    assert slices["grid"] == sorted(map(str, [[[r, 2], [c, 3]] for r in (0, 2) for c in (0, 3)]))
    assert slices[W.WEIRD_NAME] == sorted(map(str, [[[0, 3], [0, None]], [[3, 3], [0, None]]]))
    assert slices["plain_a"] == []
    # TF1 fixed_size_partitioner: 10 rows in 3 parts (4, 3, 3).
    data = run_json("dump", tf_checkpoints("tf1_partitioned").path, "--json")
    table = next(t for t in data["tensors"] if t["name"] == "emb/table")
    assert sorted(s[0][1] for s in table["slices"]) == [3, 3, 4]
    assert table["bytes"] == 10 * 4 * 4


def test_dump_json_filter(tf_checkpoints):
    case = tf_checkpoints("keras_manager")
    data = run_json("dump", case.path, "--json", "--filter", "^optimizer/_trainable")
    want = [
        n for n, _ in tf.train.list_variables(case.prefix) if n.startswith("optimizer/_trainable")
    ]
    assert [t["name"] for t in data["tensors"]] == want and len(want) == 6
    assert data["total_bytes"] == sum(t["bytes"] for t in data["tensors"])
    assert [s["scope"] for s in data["scopes"]] == ["optimizer"]


# ---------------------------------------------------------------- dump --object-graph


def _tf_object_graph(prefix: str):
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    raw = tf.train.load_checkpoint(prefix).get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH")
    return trackable_object_graph_pb2.TrackableObjectGraph.FromString(raw)


def _kernel_key(case) -> str:
    """The checkpoint key holding the model's conv kernel, found by value with TF's reader."""
    kernel = next(w for w in case.extra["weights"] if w.shape == (3, 3, 2, 3))
    values = tf_reader_values(case.prefix)
    keys = [k for k, v in values.items() if v.shape == kernel.shape and np.array_equal(v, kernel)]
    assert len(keys) == 1, keys
    return keys[0]


def test_object_graph_tree_shows_model_kernel_under_model_path(tf_checkpoints):
    case = tf_checkpoints("keras_manager")
    key = _kernel_key(case)
    assert key.startswith("optimizer/_trainable_variables/")  # Keras 3 tracks model.optimizer
    proc = run_text("dump", case.path, "--object-graph")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("object graph of ") and lines[1].startswith("(root)")
    # Rebuild each line's path from the indentation (two spaces per level).
    stack: list[str] = []
    found = []
    for line in lines[1:]:
        depth = (len(line) - len(line.lstrip(" "))) // 2
        text = line.strip()
        if text.startswith("["):  # attribute of the node one level up
            m = re.fullmatch(r"\[(\S+)\] (\S+)  (\S+) (\[[\d,]*\])", text)
            assert m, line
            found.append(("/".join(stack[1:depth]), m[1], m[2], m[3], m[4]))
            continue
        label = re.sub(r"\s+#\d+$", "", text).split(" -> ")[0]
        del stack[depth:]
        stack.append(label)
    hits = [f for f in found if f[2] == key]
    assert len(hits) == 1, hits
    path, attr, _, dtype, shape = hits[0]
    assert path.startswith("model/") and path.endswith("kernel"), path
    assert (attr, dtype, shape) == ("VARIABLE_VALUE", "float32", "[3,3,2,3]")


def test_object_graph_json_equals_tensorflow_proto(tf_checkpoints):
    case = tf_checkpoints("keras_manager")
    data = run_json("dump", case.path, "--object-graph", "--json")
    proto = _tf_object_graph(case.prefix)
    nodes = data["nodes"]
    assert [n["id"] for n in nodes] == list(range(len(proto.nodes)))
    dtypes = tf.train.load_checkpoint(case.prefix).get_variable_to_dtype_map()
    shapes = tf.train.load_checkpoint(case.prefix).get_variable_to_shape_map()
    for n, p in zip(nodes, proto.nodes):
        assert n["children"] == [{"name": c.local_name, "node_id": c.node_id} for c in p.children]
        assert [(a["name"], a["checkpoint_key"]) for a in n["attributes"]] == [
            (a.name, a.checkpoint_key) for a in p.attributes
        ]
        for a in n["attributes"]:
            assert a["dtype"] == dtypes[a["checkpoint_key"]].name
            assert a["shape"] == shapes[a["checkpoint_key"]]
        assert [
            (s["original_variable_node_id"], s["slot_name"], s["slot_variable_node_id"])
            for s in n["slot_variables"]
        ] == [
            (s.original_variable_node_id, s.slot_name, s.slot_variable_node_id)
            for s in p.slot_variables
        ]
    # Paths: the first breadth-first path, which is also how TensorFlow built the keys.
    assert nodes[0]["path"] == ""
    assert all(n["path"] is not None for n in nodes)
    for n in nodes:
        for a in n["attributes"]:
            assert a["checkpoint_key"] == f"{n['path']}/.ATTRIBUTES/{a['name']}", n
    kernel = next(
        n for n in nodes if any(a["checkpoint_key"] == _kernel_key(case) for a in n["attributes"])
    )
    parents = [
        (n["path"], c["name"]) for n in nodes for c in n["children"] if c["node_id"] == kernel["id"]
    ]
    assert any(path.startswith("model/") for path, _ in parents), parents


@pytest.mark.parametrize("case_name", ["tf1_saver", "tf1_partitioned"])
def test_object_graph_of_tf1_checkpoint_is_one_line_error(tf_checkpoints, case_name):
    case = tf_checkpoints(case_name)
    assert_cli_error(run_text("dump", case.path, "--object-graph"), case.prefix, "object graph")


# ---------------------------------------------------------------- dump --tensor values


def _numbers(text: str) -> list[str]:
    body = text.split("\n", 1)[1]
    return body.replace("[", " ").replace("]", " ").split()


def _same_floats(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    nan = np.isnan(as_f64(want))
    assert np.array_equal(np.isnan(as_f64(got)), nan)
    bits = np.dtype(f"u{want.dtype.itemsize}")
    assert np.array_equal(got[~nan].view(bits), want[~nan].view(bits))  # -0.0 keeps its sign


@pytest.mark.parametrize(
    "case_name,name,dtype",
    [
        ("tf1_saver", "encoder/layer_0/kernel", np.float32),
        ("tf1_saver", "embedding/table", np.float16),
        ("tf1_saver", "encoder/layer_1/attention/w", np.float64),
        ("all_dtypes", "float16", np.float16),
        ("all_dtypes", "float32", np.float32),
        ("all_dtypes", "float64", np.float64),
        ("all_dtypes", "bfloat16", ml_dtypes.bfloat16),
        ("all_dtypes", "float8_e4m3fn", ml_dtypes.float8_e4m3fn),
        ("savev2_slices", "grid", np.float64),
    ],
)
def test_dump_tensor_full_floats_parse_back_exactly(tf_checkpoints, case_name, name, dtype):
    case = tf_checkpoints(case_name)
    want = W.tf_tensor(tf.train.load_checkpoint(case.prefix), name)
    rc, out, err = in_process("dump", case.path, "--tensor", f"^{re.escape(name)}$", "--full")
    assert rc == 0, err
    assert (
        out.splitlines()[0] == f"{name} ({np.dtype(dtype).name} [{','.join(map(str, want.shape))}])"
    )
    tokens = _numbers(out)
    assert "..." not in tokens
    got = np.array([float(t) for t in tokens], dtype=np.float64).astype(dtype).reshape(want.shape)
    _same_floats(got, want.astype(dtype))


@pytest.mark.parametrize("name", ["int64", "uint64", "int8", "uint32", "bool"])
def test_dump_tensor_full_integers_parse_back_exactly(tf_checkpoints, name):
    case = tf_checkpoints("all_dtypes")
    want = W.tf_tensor(tf.train.load_checkpoint(case.prefix), name)
    rc, out, err = in_process("dump", case.path, "--tensor", f"^{name}$", "--full")
    assert rc == 0, err
    tokens = _numbers(out)
    if name == "bool":
        got = np.array([t == "True" for t in tokens])
    else:
        got = np.array([int(t) for t in tokens], dtype=want.dtype)
    np.testing.assert_array_equal(got.reshape(want.shape), want)


_BYTES_LITERAL = re.compile(r"""b'(?:[^'\\]|\\.)*'|b"(?:[^"\\]|\\.)*\"""", re.S)


def test_dump_tensor_strings_full_and_shortened(tf_checkpoints):
    case = tf_checkpoints("all_dtypes")
    want = W.tf_tensor(tf.train.load_checkpoint(case.prefix), "string")
    rc, out, _ = in_process("dump", case.path, "--tensor", "^string$", "--full")
    assert rc == 0
    got = [ast.literal_eval(m) for m in _BYTES_LITERAL.findall(out.split("\n", 1)[1])]
    assert got == want.tolist()  # every byte of every element, 70 000 x's included
    rc, short, _ = in_process("dump", case.path, "--tensor", "^string$")
    assert rc == 0
    assert "...(70000 bytes)" in short and "...(16384 bytes)" in short and "...(256 bytes)" in short
    assert "x" * 49 not in short and len(short) < 3000
    assert "b'" + "b" * 64 + "'" not in short  # 127 b's: shortened too
    # Short elements are shown whole.
    assert "b'a'" in short and r"b'\x00\x00\x00\x00\x00\x00\x00'" in short


def test_dump_tensor_scalars(tf_checkpoints):
    case = tf_checkpoints("all_dtypes")
    rc, out, _ = in_process(
        "dump", case.path, "--tensor", "^scalar_int64$", "--tensor", "^scalar_float32$"
    )
    assert rc == 0
    assert out.splitlines() == [
        "scalar_int64 (int64 [])",
        str(-(2**62) - 5),
        "scalar_float32 (float32 [])",
        "-0.0",
    ]
    # A long string scalar (the serialized object graph) is shortened too, unless --full.
    keras = tf_checkpoints("keras_manager")
    raw = tf.train.load_checkpoint(keras.prefix).get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH")
    rc, out, _ = in_process("dump", keras.path, "--tensor", "_CHECKPOINTABLE_OBJECT_GRAPH")
    assert rc == 0 and f"...({len(raw)} bytes)" in out and len(out) < 300
    rc, out, _ = in_process(
        "dump", keras.path, "--tensor", "_CHECKPOINTABLE_OBJECT_GRAPH", "--full"
    )
    assert rc == 0 and ast.literal_eval(out.splitlines()[1]) == raw


def test_dump_tensor_partitioned_value_equals_tensorflow(tf_checkpoints):
    case = tf_checkpoints("tf1_partitioned")
    want = W.tf_tensor(tf.train.load_checkpoint(case.prefix), "wide")
    rc, out, _ = in_process("dump", case.path, "--tensor", "^wide$", "--full")
    assert rc == 0
    np.testing.assert_array_equal(np.array(_numbers(out), dtype=np.int64).reshape(5, 7), want)


# ---------------------------------------------------------------- table width


@pytest.mark.parametrize(
    "case_name", ["keras_manager", "all_dtypes", "savev2_slices", "max_shard_policy", "tf1_saver"]
)
def test_dump_table_fits_80_columns_and_is_whole_when_piped(tf_checkpoints, case_name):
    case = tf_checkpoints(case_name)
    # Run from the checkpoint's directory so the printed prefix is short.
    cwd = Path(case.prefix).parent
    rel = os.path.relpath(case.path, cwd)
    narrow = run_text("dump", rel, cwd=cwd, env=user_env(COLUMNS="80"))
    assert narrow.returncode == 0, narrow.stderr
    too_long = [line for line in narrow.stdout.splitlines() if len(line) > 80]
    assert not too_long, too_long
    piped = run_text("dump", rel, cwd=cwd)
    assert piped.returncode == 0
    names = [n for n, _ in tf.train.list_variables(case.prefix)]
    table_names = [
        line.split("  ")[0]
        for line in piped.stdout.split("NAME", 1)[1].splitlines()[1:]
        if line and not line.startswith("SCOPE")
    ]
    printable = [n for n in names if n.isprintable()]
    for n in printable:
        assert n in table_names, n  # nothing shortened without a width
    assert "…" not in piped.stdout
    if max(map(len, names)) > 60:
        assert max(map(len, piped.stdout.splitlines())) > 80


# ---------------------------------------------------------------- diff


@pytest.fixture(scope="module")
def fp32_planted(tmp_path_factory):
    """A TF-written checkpoint of float32/float64 values (within float16 range), ints, strings."""
    rng = np.random.default_rng(11)
    w32 = (rng.standard_normal(3000) * 40).astype(np.float32)
    w32[:8] = [0.0, -0.0, 1.0, 0.5, np.nan, np.inf, -np.inf, 2048.0]  # exact in float16
    w64 = (rng.standard_normal((20, 30)) * 3).astype(np.float64)
    w64[0, 0] = np.nan
    tiny = (rng.standard_normal(64) * 1e-3).astype(np.float32)
    arrays = {
        "dense/kernel": w32.reshape(60, 50),
        "dense/bias": w64,
        "small": tiny,
        "exact": np.array([0.25, -8.0, 1024.0, 0.0], dtype=np.float32),
        "global_step": np.array(77, dtype=np.int64),
        "vocab": np.array([b"a", b"bb", b""], dtype=object),
        "ids": np.arange(12, dtype=np.int32).reshape(3, 4),
    }
    d = tmp_path_factory.mktemp("fp32")
    (d / "src").mkdir()
    src = save_v2(str(d / "src" / "model"), arrays)
    dst = str(d / "fp16" / "model")
    tfckpt.convert(src, dst, "float16")
    return src, dst, arrays


def _expected_float16_diff(a: np.ndarray) -> dict:
    """Differences between ``a`` and TensorFlow's own tf.cast(a, float16), in float64."""
    b = tf.cast(tf.constant(a), tf.float16).numpy()
    wa, wb = as_f64(a).ravel(), as_f64(b).ravel()
    both_nan = np.isnan(wa) & np.isnan(wb)
    same = (wa == wb) | both_nan
    with np.errstate(invalid="ignore"):
        d = np.where(same, 0.0, np.abs(wa - wb))
    rel = np.divide(d, np.abs(wb), out=np.zeros_like(d), where=np.abs(wb) > 0)
    return {
        "elements": a.size,
        "differing": int((~same).sum()),
        "max_abs": float(d.max()),
        "max_rel": float(rel.max()),
    }


def test_diff_float32_vs_float16_conversion(fp32_planted):
    src, dst, arrays = fp32_planted
    proc = run_text("diff", src, dst, "--json")
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data) >= {"a", "b", "only_in_a", "only_in_b", "changed", "values", "same"}
    assert data["a"] == src and data["b"] == dst and data["same"] is False
    assert data["only_in_a"] == [] and data["only_in_b"] == []
    floats = sorted(n for n, v in arrays.items() if v.dtype.kind == "f")
    assert [c["name"] for c in data["changed"]] == floats
    for c in data["changed"]:
        assert c["dtype_a"] == arrays[c["name"]].dtype.name and c["dtype_b"] == "float16"
        assert c["shape_a"] == c["shape_b"] == list(arrays[c["name"]].shape)
    values = {v["name"]: v for v in data["values"]}
    assert "exact" not in values  # every value representable in float16: no difference
    for name in ["dense/kernel", "dense/bias", "small"]:
        want = _expected_float16_diff(arrays[name])
        got = {k: values[name][k] for k in want}
        assert got["elements"] == want["elements"] and got["differing"] == want["differing"], name
        assert got["max_abs"] == pytest.approx(want["max_abs"], rel=1e-15, abs=0), name
        assert got["max_rel"] == pytest.approx(want["max_rel"], rel=1e-12), name
    # The same numbers without JSON: the text table and summary.
    text = run_text("diff", src, dst)
    assert text.returncode == 1
    assert "~ dense/kernel  float32 [60,50] -> float16 [60,50]" in text.stdout
    assert "~ dense/bias  float64 [20,30] -> float16 [20,30]" in text.stdout
    row = next(line for line in text.stdout.splitlines() if line.startswith("dense/kernel "))
    assert row.split()[1:3] == [str(values["dense/kernel"]["differing"]), "3000"]
    assert (
        text.stdout.strip().splitlines()[-1]
        == "different: 0 only in A, 0 only in B, 4 changed dtype/shape, 3 with different values"
    )


def test_diff_tolerances_leave_only_dtype_changes(fp32_planted):
    src, dst, arrays = fp32_planted
    worst = max(
        _expected_float16_diff(arrays[n])["max_abs"]
        for n in ["dense/kernel", "dense/bias", "small"]
    )
    data = run_json("diff", src, dst, "--json", "--atol", str(worst * 1.01))
    assert data["values"] == [] and len(data["changed"]) == 4 and data["same"] is False
    just_under = run_json("diff", src, dst, "--json", "--atol", str(worst * 0.99))
    assert len(just_under["values"]) == 1 and just_under["values"][0]["differing"] >= 1
    # float16 rounding is within 2**-11 relative for normal values.
    data = run_json("diff", src, dst, "--json", "--rtol", str(2.0**-11), "--filter", "dense/")
    assert data["values"] == [] and [c["name"] for c in data["changed"]] == [
        "dense/bias",
        "dense/kernel",
    ]
    proc = run_text("diff", src, dst, "--atol", "1")
    assert proc.returncode == 1
    assert (
        proc.stdout.strip()
        .splitlines()[-1]
        .endswith("4 changed dtype/shape, 0 with different values")
    )


def test_diff_chunked_equals_unchunked_with_partitioned_and_cast(
    fp32_planted, tf_checkpoints, tmp_path
):
    src, dst, _ = fp32_planted
    with tfckpt.open(src) as a, tfckpt.open(dst) as b:
        whole = tfi.diff(a, b)
        for chunk in (2, 6, 10, 4096):  # float32 and float16 chunks hold different counts
            assert tfi.diff(a, b, chunk_bytes=chunk) == whole, chunk
    # A partitioned TF tensor against the same values stored whole.
    case = tf_checkpoints("savev2_slices")
    full = case.extra["full"]
    other = tfckpt.save(
        {"emb": full["emb"], "grid": full["grid"] + 1.0, "cols": full["cols"]},
        str(tmp_path / "whole"),
    )
    with tfckpt.open(case.path) as a, tfckpt.open(other) as b:
        for chunk in (4, 24, 1 << 20):
            assert tfi.compare_values(a, b, "emb", chunk_bytes=chunk)["differing"] == 0
            assert tfi.compare_values(a, b, "cols", chunk_bytes=chunk)["differing"] == 0
            g = tfi.compare_values(a, b, "grid", chunk_bytes=chunk)
            assert g["differing"] == 24 and g["max_abs"] == pytest.approx(1.0)


def test_diff_identical_tf_checkpoints(tf_checkpoints, tmp_path):
    case = tf_checkpoints("keras_manager")
    copy = copy_checkpoint(case, tmp_path / "copy")
    proc = run_text("diff", case.path, copy)
    assert proc.returncode == 0 and proc.stdout.strip() == "same", proc
    # The previous save of the same run differs only in values.
    data = run_json("diff", case.extra["first"], case.prefix, "--json")
    assert data["only_in_a"] == data["only_in_b"] == data["changed"] == []
    assert data["values"] and not data["same"]
    assert (
        run_text("diff", case.extra["first"], case.prefix, "--names-only").stdout.strip() == "same"
    )


# ---------------------------------------------------------------- stats


@pytest.fixture(scope="module")
def stats_planted(tmp_path_factory):
    """Values with known statistics, written by TensorFlow's SaveV2."""
    rng = np.random.default_rng(12)
    f32 = rng.standard_normal(2000).astype(np.float32) * 10
    planted = [  # (value, count)
        (np.nan, 3),
        (np.inf, 2),
        (-np.inf, 1),
        (0.0, 40),
        (-0.0, 10),
        (1e5, 3),
        (-7e4, 1),  # overflow float16 (max 65504)
        (65519.0, 1),  # rounds down to 65504 in float16: no overflow
        (1e-9, 4),  # becomes zero in float16
        (1e-6, 5),
        (-3e-5, 2),  # subnormal in float16 (smallest normal 6.1e-5)
        (3.4e38, 1),  # overflows bfloat16 (max 3.39e38) but not float32
        (1e-39, 2),  # float32 subnormal: bfloat16 subnormal, float16 zero
    ]
    pos = 0
    for v, n in planted:
        f32[pos : pos + n] = v
        pos += n
    rng.shuffle(f32)
    f64 = rng.standard_normal((30, 40)) * 1e3
    f64.flat[:6] = [1e39, -1e6, 1e-300, 1e-320, np.nan, 2e-41]
    bf16 = (rng.standard_normal(500) * 100).astype(ml_dtypes.bfloat16)
    bf16[:4] = np.array([1e10, -1e9, 1e-10, 0.0]).astype(ml_dtypes.bfloat16)
    f16 = (rng.standard_normal(300) * 100).astype(np.float16)
    f16[:3] = [np.float16(6e-8), np.float16(65504), np.float16(np.nan)]
    arrays = {
        "f32": f32.reshape(40, 50),
        "f64": f64,
        "bf16": bf16,
        "f16": f16,
        "i64": np.array([2**62 + 1, -(2**62) - 3, 0, 5, 0], dtype=np.int64),
        "u8": np.array([[0, 255], [7, 0]], dtype=np.uint8),
        "flags": np.array([True, False, False, True, False]),
        "c64": np.array([1 + 2j, np.nan, 0, complex(np.inf, 0)], dtype=np.complex64),
        "nans": np.full(4, np.nan, dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "words": np.array([b"x", b"yy"], dtype=object),
    }
    d = tmp_path_factory.mktemp("stats")
    prefix = save_v2(str(d / "planted"), arrays)
    return prefix, arrays, planted


def _cast_counts(a: np.ndarray, target) -> dict:
    """What TensorFlow's tf.cast does to ``a``, counted by numpy."""
    out = as_f64(tf.cast(tf.constant(a), target).numpy())
    src = as_f64(a)
    tiny = float(ml_dtypes.finfo(target.as_numpy_dtype).smallest_normal)
    return {
        "overflow": int((np.isfinite(src) & ~np.isfinite(out)).sum()),
        "to_zero": int(((out == 0) & (src != 0) & ~np.isnan(src)).sum()),
        "subnormal": int(((np.abs(out) < tiny) & (np.abs(out) > 0)).sum()),
    }


def _check_stats_record(rec: dict, a: np.ndarray) -> None:
    x = as_f64(a.view(a.dtype)).ravel()
    finite = x[np.isfinite(x)]
    non_nan = x[~np.isnan(x)]
    assert rec["elements"] == a.size and rec["shape"] == list(a.shape)
    assert rec["nan"] == int(np.isnan(x).sum())
    assert rec["inf"] == int(np.isinf(x).sum())
    assert rec["zeros"] == pytest.approx((x == 0).sum() / max(x.size, 1), abs=0)
    if non_nan.size:  # documented: min/max over the non-NaN values
        assert rec["min"] == non_nan.min() and rec["max"] == non_nan.max()
    else:
        assert rec["min"] is None and rec["max"] is None
    if finite.size:
        assert rec["mean"] == pytest.approx(finite.mean(), rel=1e-12, abs=1e-300)
        assert rec["std"] == pytest.approx(finite.std(), rel=1e-9, abs=1e-300)
    else:
        assert rec["mean"] is None and rec["std"] is None


def test_stats_planted_values(stats_planted):
    prefix, arrays, planted = stats_planted
    data = run_json("stats", prefix, "--json")
    recs = {r["name"]: r for r in data["tensors"]}
    assert sorted(recs) == sorted(arrays)
    for name in ["f32", "f64", "bf16", "f16", "nans", "empty", "u8"]:
        _check_stats_record(recs[name], arrays[name])
    f32 = recs["f32"]
    assert (f32["nan"], f32["inf"]) == (3, 3)
    assert f32["zeros"] == 50 / 2000
    assert f32["min"] == -np.inf and f32["max"] == np.inf
    # Cast counts: the planted ones exactly, and what tf.cast really does.
    # float16: 1e5 x3, -7e4 and 3.4e38 overflow (65519 rounds to 65504); 1e-9 x4 and 1e-39 x2
    # become zero; 1e-6 x5 and -3e-5 x2 become subnormal.
    assert f32["cast"]["float16"] == {"overflow": 3 + 1 + 1, "to_zero": 4 + 2, "subnormal": 5 + 2}
    assert f32["cast"]["bfloat16"] == {"overflow": 1, "to_zero": 0, "subnormal": 2}
    for name in ["f32", "f64", "bf16", "f16"]:
        casts = recs[name]["cast"]
        assert set(casts) == {"float16", "bfloat16"} - {arrays[name].dtype.name}, name
        for target in casts:
            assert casts[target] == _cast_counts(arrays[name], tf.as_dtype(target)), (name, target)
    assert recs["bf16"]["cast"]["float16"]["overflow"] == 2
    assert recs["f16"]["cast"]["bfloat16"] == {"overflow": 0, "to_zero": 0, "subnormal": 0}
    assert recs["f64"]["cast"]["float16"]["overflow"] == 2
    # Integers exactly, even beyond float64's 53 bits; no cast record.
    i64 = recs["i64"]
    assert (i64["min"], i64["max"]) == (-(2**62) - 3, 2**62 + 1) and "cast" not in i64
    assert i64["zeros"] == 2 / 5 and i64["nan"] == i64["inf"] == 0
    assert recs["flags"]["zeros"] == 3 / 5
    assert (recs["c64"]["nan"], recs["c64"]["inf"], recs["c64"]["zeros"]) == (1, 1, 1 / 4)
    assert set(recs["words"]) == {"name", "dtype", "shape", "elements"}
    assert recs["empty"]["elements"] == 0 and recs["empty"]["zeros"] == 0.0


_NEAR_OVERFLOW_BUG = (
    "BUG: stats' (and convert's) cast counting misses overflow for values that round to inf "
    "but lie below Caster._overflow_at = max*(1+2**-(nmant+1)) (the real threshold is about "
    "max*(1+2**-(nmant+2)): 65520 for float16, 3.3961e38 for bfloat16) when the chunk holds no "
    "NaN/inf; e.g. float32 [65520, 65530, 1] -> float16 overflow 0 (2 expected), and 1-element "
    "chunks of the planted 3.4e38 give bfloat16 overflow 0 instead of 1"
)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # see test_stats_prints_no_numpy_warnings
@pytest.mark.parametrize(
    "which",
    [
        "planted",
        "savev2_slices",
        "tf1_partitioned",
        "max_shard_policy",
        "all_dtypes",
        "tf1_sharded",
    ],
)
def test_stats_chunked_equals_one_chunk(stats_planted, tf_checkpoints, which):
    path = stats_planted[0] if which == "planted" else tf_checkpoints(which).path
    with tfckpt.open(path) as ckpt:
        whole = tfi.stats(ckpt, chunk_bytes=1 << 30)["tensors"]
        for chunk in (1, 3, 8, 100):
            small = tfi.stats(ckpt, chunk_bytes=chunk)["tensors"]
            assert [r["name"] for r in small] == [r["name"] for r in whole]
            for s, w in zip(small, whole):
                for k in w:
                    if k in ("mean", "std") and w[k] is not None:
                        if not np.isfinite(w[k]):  # overflowed sums: no defined answer
                            continue
                        # Summation order differs: exact to rounding at the values' scale.
                        x = as_f64(ckpt[w["name"]])
                        scale = float(np.abs(x[np.isfinite(x)]).max())
                        if scale > 1e150:  # squares overflow: test_stats_moments_of_huge_float64
                            continue
                        assert s[k] == pytest.approx(w[k], rel=1e-9, abs=1e-12 * scale), (
                            w["name"],
                            k,
                            chunk,
                        )
                    else:
                        assert s[k] == w[k], (w["name"], k, chunk)


@pytest.mark.parametrize(
    "values,target,want",
    [
        ([65520.0, 65530.0, 1.0], "float16", 2),
        ([3.4e38, 1.0], "bfloat16", 1),
    ],
)
def test_stats_counts_overflow_just_past_the_rounding_edge(tmp_path, values, target, want):
    a = np.array(values, dtype=np.float32)
    assert _cast_counts(a, tf.as_dtype(target))["overflow"] == want  # what tf.cast does
    prefix = save_v2(str(tmp_path / "edge"), {"x": a})
    with tfckpt.open(prefix) as ckpt:
        assert tfi.stats(ckpt)["tensors"][0]["cast"][target]["overflow"] == want


@pytest.mark.parametrize("chunk", [1 << 20, 8])
def test_stats_moments_of_huge_float64(tmp_path, chunk):
    a = np.array([1e200, 1e200, 1e200])
    prefix = save_v2(str(tmp_path / "huge"), {"x": a})
    with tfckpt.open(prefix) as ckpt:
        rec = tfi.stats(ckpt, chunk_bytes=chunk)["tensors"][0]
    assert rec["mean"] == pytest.approx(1e200) and rec["std"] == a.std() == 0.0


def test_stats_partitioned_equals_numpy_of_full_tensor(tf_checkpoints):
    case = tf_checkpoints("savev2_slices")
    rc, out, _ = in_process("stats", case.path, "--json", "--filter", "^(emb|grid|cube|cols)$")
    assert rc == 0
    recs = {r["name"]: r for r in json.loads(out)["tensors"]}
    for name in ["emb", "grid", "cube", "cols"]:
        _check_stats_record(recs[name], case.extra["full"][name])


def test_stats_text_lists_risky_casts(stats_planted, tf_checkpoints):
    prefix, _, _ = stats_planted
    proc = run_text("stats", prefix)
    assert proc.returncode == 0, proc.stderr
    assert "if cast:" in proc.stdout
    risky = proc.stdout.split("if cast:")[1]
    row = next(r for r in map(str.split, risky.splitlines()) if r[:2] == ["f32", "float16"])
    assert row[:5] == ["f32", "float16", "5", "6", "7"]
    table = proc.stdout.split("if cast:")[0]
    i64 = next(line.split() for line in table.splitlines() if line.startswith("i64 "))
    assert i64[2:4] == [str(-(2**62) - 3), str(2**62 + 1)]
    # A checkpoint whose floats all cast cleanly says so.
    clean = run_text("stats", tf_checkpoints("tf1_sharded").path)
    assert (
        clean.returncode == 0 and "casts to float16 and bfloat16 without overflow" in clean.stdout
    )


# ---------------------------------------------------------------- verify


def _one_line_problems(proc) -> list[str]:
    assert "Traceback" not in proc.stderr, proc.stderr
    return stderr_lines(proc.stderr)


@pytest.mark.parametrize(
    "case_name",
    [
        "corruptible",
        "tf1_sharded",
        "savev2_slices",
        "keras_manager",
        "all_dtypes",
        "max_shard_policy",
        "saved_model",
    ],
)
def test_verify_clean_tf_checkpoint(tf_checkpoints, case_name):
    case = tf_checkpoints(case_name)
    rc, out, err = in_process("verify", case.path)
    assert (rc, err) == (0, ""), err
    assert out.startswith(f"ok: {case.prefix}: ")
    n = len(tf.train.list_variables(case.prefix))
    assert f": {n} tensors, " in out
    data = json.loads(in_process("verify", case.path, "--json")[1])
    assert data["problems"] == [] and data["tensors"] == n
    assert data["bytes"] == sum(f.stat().st_size for f in W.data_files(case.prefix))


def test_verify_flipped_bit_in_data_shard(tf_checkpoints, tmp_path):
    case = tf_checkpoints("corruptible")
    prefix = copy_checkpoint(case, tmp_path / "c")
    with tfckpt.open(prefix) as ckpt:
        b, c = ckpt.info("b"), ckpt.info("c")
    shard = prefix + ".data-00000-of-00001"
    flip_byte(shard, b.offset + 17, 0x10)
    proc = run_text("verify", prefix)
    assert proc.returncode == 1 and proc.stdout == ""
    lines = _one_line_problems(proc)
    assert len(lines) == 1, lines
    assert lines[0].startswith(shard + ": ") and "'b'" in lines[0] and "checksum" in lines[0]
    # Two damaged tensors: two lines, each naming its tensor; the intact one is not named.
    flip_byte(shard, c.offset + c.nbytes - 1, 0x80)
    proc = run_text("verify", prefix, "--json")
    assert proc.returncode == 1
    problems = json.loads(proc.stdout)["problems"]
    assert len(problems) == 2 and all(p.startswith(shard) for p in problems)
    assert "'b'" in problems[0] and "'c'" in problems[1]
    assert not any("'a'" in p for p in problems)


def test_verify_flipped_bit_in_index(tf_checkpoints, tmp_path):
    case = tf_checkpoints("corruptible")
    prefix = copy_checkpoint(case, tmp_path / "c")
    flip_byte(prefix + ".index", 12, 0x04)
    proc = run_text("verify", prefix)
    assert proc.returncode == 1
    lines = _one_line_problems(proc)
    assert len(lines) == 1, lines
    assert (prefix + ".index") in lines[0] and "checksum" in lines[0]


@pytest.mark.parametrize("keep", [0.5, 30, 0])
def test_verify_truncated_index(tf_checkpoints, tmp_path, keep):
    case = tf_checkpoints("tf1_saver")
    prefix = copy_checkpoint(case, tmp_path / "c")
    index = Path(prefix + ".index")
    size = index.stat().st_size
    with open(index, "r+b") as f:
        f.truncate(int(size * keep) if keep < 1 else keep)
    proc = run_text("verify", prefix)
    assert proc.returncode == 1
    lines = _one_line_problems(proc)
    assert len(lines) == 1 and str(index) in lines[0], lines


def test_verify_missing_shard(tf_checkpoints, tmp_path):
    case = tf_checkpoints("tf1_sharded")
    prefix = copy_checkpoint(case, tmp_path / "c")
    missing = prefix + ".data-00001-of-00002"
    os.remove(missing)
    proc = run_text("verify", prefix)
    assert proc.returncode == 1
    lines = _one_line_problems(proc)
    assert lines and all(line.startswith(missing + ":") for line in lines), lines
    assert any("missing" in line for line in lines)
    with tfckpt.open(prefix) as ckpt:
        in_shard_1 = [n for n in ckpt.keys() if ckpt.info(n).shard == 1]
    for name in in_shard_1:  # every tensor that lived there is named
        assert any(f"'{name}'" in line for line in lines), (name, lines)


def test_verify_extra_data_file_with_other_shard_count(tf_checkpoints, tmp_path):
    case = tf_checkpoints("corruptible")
    prefix = copy_checkpoint(case, tmp_path / "c")
    stray = prefix + ".data-00001-of-00003"
    shutil.copy(prefix + ".data-00000-of-00001", stray)
    proc = run_text("verify", prefix)
    # Nothing reads a data file of another shard count: a warning, not a problem.
    assert proc.returncode == 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(stray + ":") and "3" in lines[0], lines
    assert "not part of this one" in lines[0]


@pytest.fixture(scope="module")
def string_ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("strings")
    prefix = save_v2(
        str(d / "s"),
        {
            "words": np.array([b"abc", b"hello", b"x" * 300], dtype=object),
            "n": np.arange(4, dtype=np.int32),
        },
    )
    with tfckpt.open(prefix) as ckpt:
        info = ckpt.info("words")
    return prefix, info


def _string_copy(string_ckpt, tmp_path, edits: dict[int, int]) -> tuple[str, str]:
    prefix, info = string_ckpt
    dst = tmp_path / "s"
    shutil.copytree(Path(prefix).parent, dst)
    new = str(dst / Path(prefix).name)
    shard = new + ".data-00000-of-00001"
    with open(shard, "r+b") as f:
        for rel, value in edits.items():
            f.seek(info.offset + rel)
            f.write(bytes([value]))
    return new, shard


@pytest.mark.parametrize(
    "edits,what",
    [
        ({0: 0x7F}, "malformed"),  # first length 3 -> 127: lengths overrun the bytes
        (
            {0: 5, 1: 3},
            "length checksum",
        ),  # lengths swapped: framing parses, the lengths' CRC fails
        ({10: ord("A")}, "checksum"),  # an element byte
    ],
)
def test_verify_string_framing_names_the_tensor(string_ckpt, tmp_path, edits, what):
    prefix, _ = _string_copy(string_ckpt, tmp_path, edits)
    proc = run_text("verify", prefix)
    assert proc.returncode == 1
    lines = _one_line_problems(proc)
    assert len(lines) == 1 and "'words'" in lines[0] and what in lines[0], lines


@pytest.mark.parametrize("edits", [{0: 0x7F}, {0: 5, 1: 3}])
def test_verify_string_framing_names_the_data_shard(string_ckpt, tmp_path, edits):
    prefix, shard = _string_copy(string_ckpt, tmp_path, edits)
    proc = run_text("verify", prefix)
    lines = _one_line_problems(proc)
    assert len(lines) == 1 and lines[0].startswith(shard + ": "), lines


# ---------------------------------------------------------------- verify --tf


def test_verify_tf_on_tf_written_checkpoint_subprocess(tf_checkpoints):
    case = tf_checkpoints("keras_manager")
    proc = run_text("verify", case.path, "--tf", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout.startswith(f"ok: {case.prefix}: 24 tensors")
    assert "TensorFlow's reader agrees bit-for-bit" in proc.stdout


# savev2_slices holds sliced float16 and string tensors TensorFlow's reader cannot reassemble.
@pytest.mark.parametrize(
    "case_name",
    [
        "corruptible",
        "tf1_sharded",
        "tf1_partitioned",
        "max_shard_policy",
        "saved_model",
        "tf1_saver",
        "savev2_slices",
    ],
)
def test_verify_tf_agrees(tf_checkpoints, case_name):
    case = tf_checkpoints(case_name)
    rc, out, err = in_process("verify", case.path, "--tf")
    assert rc == 0 and err == "", err
    assert "TensorFlow's reader agrees bit-for-bit" in out


def test_verify_tf_all_dtypes_no_false_mismatch(tf_checkpoints):
    """Every dtype TF can save, quantized ones included, reads back bit-for-bit."""
    from tfckpt.tf import verify_with_tf

    case = tf_checkpoints("all_dtypes")
    report = verify_with_tf(case.path)
    assert report["mismatches"] == []
    assert report["tensors"] == len(case.extra["values"]) and report["cast_checked"] == 0


def test_verify_tf_with_reference_on_converted(fp32_planted):
    src, dst, arrays = fp32_planted
    proc = run_text("verify", dst, "--tf", "--reference", src, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "TensorFlow's reader agrees bit-for-bit, 4 casts equal tf.cast" in proc.stdout
    from tfckpt.tf import verify_with_tf

    report = verify_with_tf(dst, reference=src)
    assert report["mismatches"] == [] and report["cast_checked"] == 4
    assert report["tensors"] == len(arrays)


def test_verify_tf_with_reference_catches_tampered_value(fp32_planted, tmp_path):
    """Only a value differs (checksums are right): TensorFlow's tf.cast gives the verdict."""
    src, dst, _ = fp32_planted
    with tfckpt.open(dst) as ckpt:
        values = {k: ckpt[k] for k in ckpt}
    kernel = values["dense/kernel"].copy()
    i = np.flatnonzero(np.isfinite(kernel.ravel()) & (kernel.ravel() != 0))[100]
    kernel.flat[i] = np.nextafter(kernel.flat[i], np.float16(np.inf))  # one ulp
    values["dense/kernel"] = kernel
    tampered = tfckpt.save(values, str(tmp_path / "t" / "model"))
    assert run_text("verify", tampered).returncode == 0  # intact as a file
    from tfckpt.tf import verify_with_tf

    report = verify_with_tf(tampered, reference=src)
    assert report["cast_checked"] == 4
    assert len(report["mismatches"]) == 1, report
    assert "dense/kernel" in report["mismatches"][0] and "tf.cast" in report["mismatches"][0]
    assert "float32 -> float16" in report["mismatches"][0]
    rc, out, err = in_process("verify", tampered, "--tf", "--reference", src)
    assert rc == 1 and out == ""
    assert stderr_lines(err) == report["mismatches"]


def test_verify_with_tf_catches_reader_disagreement(tf_checkpoints, monkeypatch):
    """If tfckpt read a value wrong, TensorFlow's reader is the judge."""
    case = tf_checkpoints("corruptible")
    real = tfckpt.Checkpoint.__getitem__

    def wrong(self, name):
        value = real(self, name)
        if name == "c":
            value = value.copy()
            value.flat[3] += 1
        return value

    monkeypatch.setattr(tfckpt.Checkpoint, "__getitem__", wrong)
    from tfckpt.tf import verify_with_tf

    report = verify_with_tf(case.path)
    assert report["mismatches"] == [f"{case.prefix}: c: values differ from TensorFlow's reader"]
