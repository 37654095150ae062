"""export / import: checkpoints TensorFlow writes, out to safetensors and npz and back.

Outputs are read with the ``safetensors`` package and ``numpy.load``; the values
they hold are compared bit for bit with what TensorFlow's reader returns (after
the requested casts, with ``tf.cast``, and permutes, with ``np.transpose``).
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import assert_cli_error, in_process, user_env
from transform_helpers import float_mismatches

import tfckpt

tf = pytest.importorskip("tensorflow")
safetensors_numpy = pytest.importorskip("safetensors.numpy")
from safetensors import safe_open  # noqa: E402

# What each format holds of the dtypes TensorFlow can save (tfckpt names).
SAFETENSORS_NUMPY = {  # and safetensors' numpy API can load
    "bool",
    "uint8",
    "int8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
}
SAFETENSORS_EXTRA = {"bfloat16", "float8_e4m3fn", "float8_e5m2"}
NPZ = SAFETENSORS_NUMPY | {"complex64", "complex128"}


def same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    got, want = np.asarray(got), np.asarray(want)
    return (
        got.shape == want.shape
        and got.dtype.itemsize == want.dtype.itemsize
        and np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()
    )


def tf_values(prefix: str) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(prefix)
    return {k: np.asarray(reader.get_tensor(k)) for k in reader.get_variable_to_dtype_map()}


def tf_dtypes(prefix: str) -> dict[str, str]:
    reader = tf.train.load_checkpoint(prefix)
    return {k: v.name for k, v in reader.get_variable_to_dtype_map().items()}


def raw_safetensors(path) -> dict[str, tuple[str, list, bytes]]:
    """Each tensor's dtype code, shape and bytes, straight from the file's layout."""
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    header.pop("__metadata__", None)
    body = data[8 + n :]
    return {
        k: (v["dtype"], v["shape"], body[v["data_offsets"][0] : v["data_offsets"][1]])
        for k, v in header.items()
    }


def test_every_dtype_to_safetensors(tf_checkpoints, tmp_path):
    case = tf_checkpoints("all_dtypes")
    want, dtypes = tf_values(case.prefix), tf_dtypes(case.prefix)
    with pytest.raises(tfckpt.CheckpointError, match="cannot be stored in safetensors") as e:
        tfckpt.export(case.prefix, tmp_path / "x.safetensors")
    assert "string_2d" in str(e.value) and "complex64" in str(e.value)
    assert not list(tmp_path.iterdir())

    out = tmp_path / "all.safetensors"
    sm = tfckpt.export(case.prefix, out, skip_unsupported=True)
    kept = {n for n, d in dtypes.items() if d in SAFETENSORS_NUMPY | SAFETENSORS_EXTRA}
    assert {t["new_name"] for t in sm.tensors} == kept
    assert {n for n, _ in sm.skipped} == set(dtypes) - kept
    raw = raw_safetensors(out)
    assert set(raw) == kept
    codes = {"bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}
    with safe_open(str(out), framework="numpy") as f:
        meta = f.metadata()
        for name in kept:
            if dtypes[name] in SAFETENSORS_EXTRA:
                assert f.get_slice(name).get_dtype() == codes[dtypes[name]]
                code, shape, data = raw[name]
                assert shape == list(want[name].shape)
                assert data == np.ascontiguousarray(want[name]).tobytes(), name
    assert meta["source"] == "dtypes" and meta["producer"].startswith("tfckpt ")
    assert "tensorflow" in meta["source_format"]
    plain = [f"^{n}$" for n in kept if dtypes[n] in SAFETENSORS_NUMPY]
    tfckpt.export(case.prefix, tmp_path / "n.safetensors", include=plain)
    loaded = safetensors_numpy.load_file(str(tmp_path / "n.safetensors"))
    assert set(loaded) == {n for n in kept if dtypes[n] in SAFETENSORS_NUMPY}
    for name, value in loaded.items():
        assert value.dtype == want[name].dtype and same_bits(value, want[name]), name


def test_every_dtype_to_npz(tf_checkpoints, tmp_path):
    case = tf_checkpoints("all_dtypes")
    want, dtypes = tf_values(case.prefix), tf_dtypes(case.prefix)
    out = tmp_path / "all.npz"
    tfckpt.export(case.prefix, out, skip_unsupported=True, chunk_bytes=64)
    with np.load(out) as z:
        got = {k: z[k] for k in z.files}
    assert set(got) == {n for n, d in dtypes.items() if d in NPZ}
    for name, value in got.items():
        assert value.dtype == want[name].dtype and same_bits(value, want[name]), name


def test_npz_members_in_zip64_form(tf_checkpoints, tmp_path, monkeypatch):
    """Members too big for plain zip get ZIP64 records: forced here for every member (a
    real one needs more than 2 GiB), the archive still loads and its members import."""
    import zipfile

    from tfckpt.format import tensorfiles

    monkeypatch.setattr(tensorfiles, "_ZIP64_LIMIT", 0)
    case = tf_checkpoints("tf1_saver")
    want = tf_values(case.prefix)
    out = tmp_path / "big.npz"
    tfckpt.export(case.prefix, out, chunk_bytes=256, with_bookkeeping=True)
    raw = out.read_bytes()
    with zipfile.ZipFile(out) as zf:
        for info in zf.infolist():  # each local header carries the ZIP64 extra field (id 1)
            n, m = struct.unpack("<HH", raw[info.header_offset + 26 : info.header_offset + 30])
            extra = raw[info.header_offset + 30 + n : info.header_offset + 30 + n + m]
            assert extra[:2] == b"\x01\x00", info.filename
    with np.load(out) as z:
        assert {k: same_bits(z[k], want[k]) for k in z.files} == {k: True for k in want}
    tfckpt.import_(out, tmp_path / "back" / "m")
    back = tf_values(str(tmp_path / "back" / "m"))
    assert all(same_bits(back[k], want[k]) for k in want)


def test_tf1_renamed_cast_permuted(tf_checkpoints, tmp_path):
    case = tf_checkpoints("tf1_saver")
    want = tf_values(case.prefix)
    mapping = tmp_path / "map.json"
    mapping.write_text(json.dumps({"embedding/table": "embeddings.weight"}))
    out = tmp_path / "m.safetensors"
    rc, _, err = in_process(
        "export",
        case.prefix,
        out,
        "--map",
        r"encoder/layer_(\d+)/=layers.\1.",
        "--map-file",
        mapping,
        "--dtype",
        "float16",
        "--overflow",
        "inf",
        "--permute",
        r"kernel$=1,0",
        "--exclude",
        "global_step",
    )
    assert rc == 0, err
    got = safetensors_numpy.load_file(str(out))
    assert set(got) == {
        "layers.0.kernel",
        "layers.0.bias",
        "layers.1.attention/w",
        "embeddings.weight",
        "vocab_flags",
    }

    def check_cast(got, source):  # tf.cast's bits; NaN payloads aside (see the helper)
        assert got.dtype == np.float16
        assert not float_mismatches(got, tf.cast(source, tf.float16).numpy(), source)

    check_cast(got["layers.0.kernel"], want["encoder/layer_0/kernel"].T)
    check_cast(got["layers.0.bias"], want["encoder/layer_0/bias"])
    check_cast(got["layers.1.attention/w"], want["encoder/layer_1/attention/w"])
    assert same_bits(got["embeddings.weight"], want["embedding/table"])
    assert same_bits(got["vocab_flags"], want["vocab_flags"])

    # The same again is refused, --overwrite replaces; --dry-run writes nothing.
    assert_cli_error(in_process("export", case.prefix, out), "already exists")
    assert in_process("export", case.prefix, out, "--overwrite")[0] == 0
    assert set(safetensors_numpy.load_file(str(out))) == set(want) - {"global_step"}
    rc, _, err = in_process("export", case.prefix, tmp_path / "dry.npz", "--dry-run")
    assert rc == 0 and "would write" in err and not (tmp_path / "dry.npz").exists()


def test_tf2_keras_names_and_optimizer(tf_checkpoints, tmp_path):
    case = tf_checkpoints("keras_manager")
    want = tf_values(case.prefix)
    tfckpt.export(case.prefix, tmp_path / "m.safetensors")
    got = safetensors_numpy.load_file(str(tmp_path / "m.safetensors"))
    # The model's variables, named by their paths through the model (not the
    # optimizer's references to them, which the checkpoint's keys follow).
    weights = case.extra["weights"]
    assert set(got) == {
        "model/_functional/_operations/1/_kernel",
        "model/_functional/_operations/1/bias",
        "model/_functional/_operations/2/gamma",
        "model/_functional/_operations/2/beta",
        "model/_functional/_operations/2/moving_mean",
        "model/_functional/_operations/2/moving_variance",
        "model/_functional/_operations/4/_kernel",
        "model/_functional/_operations/4/bias",
    }
    assert len(weights) == len(got)
    for w in weights:
        assert sum(same_bits(v, w) for v in got.values()) >= 1
    assert same_bits(got["model/_functional/_operations/4/_kernel"], weights[6])
    # The save counter is bookkeeping, kept only when asked for (or with the optimizer).
    tfckpt.export(case.prefix, tmp_path / "b.safetensors", with_bookkeeping=True)
    kept = safetensors_numpy.load_file(str(tmp_path / "b.safetensors"))
    assert same_bits(kept["save_counter"], want["save_counter/.ATTRIBUTES/VARIABLE_VALUE"])

    tfckpt.export(case.prefix, tmp_path / "full.npz", with_optimizer=True, keep_keys=True)
    with np.load(tmp_path / "full.npz") as z:
        full = {k: z[k] for k in z.files}
    assert set(full) == set(want) - {"_CHECKPOINTABLE_OBJECT_GRAPH"}
    for k, v in full.items():
        assert same_bits(v, want[k]), k
    # --map applies to the readable names.
    rc, _, err = in_process(
        "export",
        case.prefix,
        tmp_path / "mapped.safetensors",
        "--map",
        r"model/_functional/_operations/(\d+)/_?=layer\1.",
        "--permute",
        r"4.kernel$=1,0",
    )
    assert rc == 0, err
    mapped = safetensors_numpy.load_file(str(tmp_path / "mapped.safetensors"))
    assert same_bits(mapped["layer4.kernel"], weights[6].T)
    assert "layer2.moving_mean" in mapped


@pytest.mark.parametrize("name", ["tf1_partitioned", "tf1_sharded", "max_shard_policy"])
def test_sharded_export_and_round_trip(tf_checkpoints, tmp_path, name):
    case = tf_checkpoints(name)
    strings = {k for k, d in tf_dtypes(case.prefix).items() if d == "string"}
    want = {
        k.removesuffix("/.ATTRIBUTES/VARIABLE_VALUE"): v
        for k, v in tf_values(case.prefix).items()
        if k not in strings  # the object graph, a string variable: not for safetensors
    }
    out = tmp_path / "hf" / "model.safetensors"
    sm = tfckpt.export(case.prefix, out, max_shard_bytes=200, skip_unsupported=True)
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in (tmp_path / "hf").glob("model-*.safetensors"))
    assert len(files) > 1 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert set(index["weight_map"]) == set(want)
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in want.values())
    for file in files:
        with safe_open(str(tmp_path / "hf" / file), framework="numpy") as f:
            listed = {k for k, v in index["weight_map"].items() if v == file}
            assert set(f.keys()) == listed, file
            for k in listed:
                assert same_bits(f.get_tensor(k), want[k]), k
    assert sm.bytes_out == index["metadata"]["total_size"]

    # ... and back: TensorFlow reads what import writes.
    back = tmp_path / "back" / "model"
    tfckpt.import_(tmp_path / "hf" / "model.safetensors.index.json", back, chunk_bytes=64)
    got = tf_values(str(back))
    assert set(got) == set(want)
    for k, v in got.items():
        assert v.dtype == want[k].dtype and same_bits(v, want[k]), k


def test_round_trip_every_dtype_through_npz_and_safetensors(tf_checkpoints, tmp_path):
    case = tf_checkpoints("all_dtypes")
    want, dtypes = tf_values(case.prefix), tf_dtypes(case.prefix)
    for fmt, kept in (("npz", NPZ), ("safetensors", SAFETENSORS_NUMPY | SAFETENSORS_EXTRA)):
        out = tmp_path / f"all.{fmt}"
        tfckpt.export(case.prefix, out, skip_unsupported=True)
        rc, _, err = in_process("import", out, tmp_path / fmt / "ckpt", "--chunk-bytes", "64")
        assert rc == 0, err
        got = tf_values(str(tmp_path / fmt / "ckpt"))
        assert set(got) == {n for n, d in dtypes.items() if d in kept}, fmt
        assert tf_dtypes(str(tmp_path / fmt / "ckpt")) == {n: dtypes[n] for n in got}
        for k, v in got.items():
            assert same_bits(v, want[k]), (fmt, k)


def _write_big(d: Path, shape, name="big/kernel") -> tuple[str, np.ndarray]:
    value = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) * np.float32(0.5)
    prefix = str(d / "big")
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=[name, "small"],
        shape_and_slices=["", ""],
        tensors=[tf.constant(value), tf.constant(np.arange(3, dtype=np.int32))],
    )
    return prefix, value


@pytest.mark.parametrize("axes", [(1, 0, 2), (2, 0, 1), (0, 2, 1), (2, 1, 0)])
def test_permute_in_tiles(tmp_path, axes):
    prefix, value = _write_big(tmp_path, (24, 20, 16))  # 30 KiB, chunk budget 4 KiB
    spec = ",".join(map(str, axes))
    out = tmp_path / "p.safetensors"
    tfckpt.export(prefix, out, permute=[("kernel$", axes)], chunk_bytes=4096)
    got = safetensors_numpy.load_file(str(out))
    assert same_bits(got["big/kernel"], np.transpose(value, axes))
    # The way back undoes it, in tiles as well.
    inverse = tuple(int(i) for i in np.argsort(axes))
    rc, _, err = in_process(
        "import",
        out,
        tmp_path / "back" / "m",
        "--chunk-bytes",
        "4K",
        "--permute",
        "kernel$=" + ",".join(map(str, inverse)),
    )
    assert rc == 0, err
    back = tf_values(str(tmp_path / "back" / "m"))
    assert same_bits(back["big/kernel"], value) and spec
    with pytest.raises(tfckpt.CheckpointError, match="does not fit"):
        tfckpt.export(prefix, tmp_path / "bad.npz", permute=[("kernel$", (1, 0))])


def test_bounded_memory(tmp_path):
    shape = (4096, 8192)  # 128 MiB of float32
    prefix, value = _write_big(tmp_path, shape)
    nbytes = value.nbytes
    del value
    out, t = tmp_path / "big.safetensors", tmp_path / "t.safetensors"
    # The peak of the process's own memory (VmHWM: ru_maxrss would count the
    # parent's, inherited over the fork).
    code = (
        "import re, sys, tfckpt\n"
        "tfckpt.export(sys.argv[1], sys.argv[2], chunk_bytes=1 << 20)\n"
        "tfckpt.import_(sys.argv[2], sys.argv[3], chunk_bytes=1 << 20)\n"
        "tfckpt.export(sys.argv[1], sys.argv[4], chunk_bytes=4 << 20, permute=[('kernel', (1, 0))])\n"
        "status = open('/proc/self/status').read()\n"
        "print(re.search(r'VmHWM:\\s*(\\d+) kB', status)[1])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, prefix, str(out), str(tmp_path / "back" / "m"), str(t)],
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    peak = int(proc.stdout.split()[-1]) * 1024
    assert peak < nbytes / 2, (peak, nbytes)
    assert out.stat().st_size > nbytes
    with safe_open(str(out), framework="numpy") as f:
        row = f.get_slice("big/kernel")[shape[0] - 1 :].reshape(-1)
    with safe_open(str(t), framework="numpy") as f:
        column = f.get_slice("big/kernel")[shape[1] - 1 :].reshape(-1)
    values = np.arange(shape[0] * shape[1], dtype=np.float32)  # as _write_big made them
    assert same_bits(row, values[-shape[1] :] * np.float32(0.5))
    assert same_bits(column, values[shape[1] - 1 :: shape[1]] * np.float32(0.5))
    with tfckpt.Checkpoint(str(tmp_path / "back" / "m")) as ckpt:
        assert ckpt.info("big/kernel").shape == shape and ckpt["small"].tolist() == [0, 1, 2]


def test_cli_errors(tf_checkpoints, tmp_path):
    case = tf_checkpoints("all_dtypes")
    assert_cli_error(
        in_process("export", case.prefix, tmp_path / "x.safetensors"),
        "cannot be stored in safetensors",
        "string_scalar",
    )
    assert_cli_error(in_process("export", case.prefix, tmp_path / "x.bin"), "format")
    rc, _, err = in_process("export", case.prefix, tmp_path / "x.safetensors", "--skip-unsupported")
    assert rc == 0 and "left out string_scalar" in err
    assert_cli_error(
        in_process("export", case.prefix, tmp_path / "y.npz", "--executor", "threads:2"),
        "--executor",
    )
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", 1000) + b"{}")
    assert_cli_error(in_process("import", bad, tmp_path / "o" / "m"), "bad.safetensors")
    assert not (tmp_path / "o").exists()


def test_failed_export_leaves_nothing(tf_checkpoints, tmp_path):
    case = tf_checkpoints("tf1_saver")  # its kernel holds values beyond float16's range
    out = tmp_path / "out" / "model.safetensors"
    with pytest.raises(tfckpt.CastOverflowError, match="encoder/layer_0/kernel"):
        tfckpt.export(case.prefix, out, cast="float16", max_shard_bytes=100)
    assert not (tmp_path / "out").exists()
    rc, out_text, err = in_process(
        "export", case.prefix, out, "--dtype", "float16", "--dry-run", "--json"
    )
    assert rc == 0 and not (tmp_path / "out").exists()
    plan = json.loads(out_text)
    assert {t["new_dtype"] for t in plan["tensors"] if t["dtype"] == "float32"} == {"float16"}


def test_memory_filesystem_round_trip(tf_checkpoints, tmp_path):
    pytest.importorskip("fsspec")
    from fsspec.implementations.memory import MemoryFileSystem

    case = tf_checkpoints("tf1_sharded")
    want = tf_values(case.prefix)
    root = "memory://export-test"
    try:
        tfckpt.export(case.prefix, f"{root}/hf/model.safetensors", max_shard_bytes=500)
        fs = MemoryFileSystem()
        names = sorted(p.rsplit("/", 1)[1] for p in fs.ls("/export-test/hf", detail=False))
        index = json.loads(fs.cat_file("/export-test/hf/model.safetensors.index.json"))
        assert set(index["weight_map"]) == set(want)
        shards = sorted(set(index["weight_map"].values()))
        assert len(shards) > 1 and names == shards + ["model.safetensors.index.json"]
        tfckpt.import_(f"{root}/hf/model.safetensors.index.json", f"{root}/back/m")
        local = tmp_path / "m"
        for p in fs.ls("/export-test/back", detail=False):
            (tmp_path / p.rsplit("/", 1)[1]).write_bytes(fs.cat_file(p))
        got = tf_values(str(local))
        assert set(got) == set(want)
        for k, v in got.items():
            assert same_bits(v, want[k]), k
    finally:
        MemoryFileSystem().rm("/export-test", recursive=True)


def test_overwrite_replaces_single_and_sharded(tf_checkpoints, tmp_path):
    case = tf_checkpoints("tf1_sharded")
    out = tmp_path / "model.safetensors"
    tfckpt.export(case.prefix, out)
    with pytest.raises(tfckpt.CheckpointError, match="already exists"):
        tfckpt.export(case.prefix, out, max_shard_bytes=500)
    tfckpt.export(case.prefix, out, max_shard_bytes=300, overwrite=True)
    sharded = sorted(p.name for p in tmp_path.iterdir())
    assert "model.safetensors" not in sharded and "model.safetensors.index.json" in sharded
    tfckpt.export(case.prefix, out, max_shard_bytes=1000, overwrite=True)
    fewer = sorted(p.name for p in tmp_path.iterdir())
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert fewer == sorted(set(index["weight_map"].values())) + ["model.safetensors.index.json"]
    assert len(fewer) < len(sharded)
    tfckpt.export(case.prefix, out, overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]


def _write_partitioned(d: Path) -> str:
    """TF1 partitioned variables bigger than a 1 KiB chunk budget, split on axes 1 and 0."""
    prefix = str(d / "part.ckpt")
    with tf.Graph().as_default():
        normal = tf.compat.v1.random_normal_initializer(seed=5)
        tf.compat.v1.get_variable(  # axis 1: 10 in 3 parts (4, 3, 3)
            "cube/kernel",
            shape=[12, 10, 8],
            initializer=normal,
            partitioner=tf.compat.v1.fixed_size_partitioner(3, axis=1),
        )
        tf.compat.v1.get_variable(  # axis 0: 30 rows in 4 parts
            "rows/kernel",
            shape=[30, 20],
            initializer=normal,
            partitioner=tf.compat.v1.fixed_size_partitioner(4),
        )
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.save(sess, prefix, write_meta_graph=False)
    return prefix


@pytest.mark.parametrize("axes", [(1, 0, 2), (2, 0, 1), (0, 2, 1), (2, 1, 0)])
def test_permute_partitioned_in_tiles(tmp_path, axes):
    prefix = _write_partitioned(tmp_path)
    want = tf_values(prefix)
    out = tmp_path / "p.safetensors"
    tfckpt.export(
        prefix, out, permute=[("cube/kernel$", axes), ("rows/kernel$", (1, 0))], chunk_bytes=1024
    )
    got = safetensors_numpy.load_file(str(out))
    assert same_bits(got["cube/kernel"], np.transpose(want["cube/kernel"], axes))
    assert same_bits(got["rows/kernel"], np.transpose(want["rows/kernel"]))


@pytest.mark.parametrize("axes", [(1, 0, 2), (2, 1, 0)])
def test_import_permutes_big_npz_member_in_tiles(tmp_path, axes):
    value = np.arange(24 * 20 * 16, dtype=np.float32).reshape(24, 20, 16)  # 30 KiB
    np.savez(tmp_path / "w.npz", kernel=value, small=np.arange(3, dtype=np.int32))
    spec = "kernel$=" + ",".join(map(str, axes))
    rc, _, err = in_process(
        "import", tmp_path / "w.npz", tmp_path / "m", "--chunk-bytes", "4K", "--permute", spec
    )
    assert rc == 0, err
    back = tf_values(str(tmp_path / "m"))
    assert same_bits(back["kernel"], np.transpose(value, axes))
    assert same_bits(back["small"], np.arange(3, dtype=np.int32))


def test_import_npz_from_url(tmp_path):
    import fsspec

    value = np.arange(12 * 10, dtype=np.float64).reshape(12, 10)
    local = tmp_path / "w.npz"
    np.savez(local, kernel=value, flags=np.array([True, False]))
    fs = fsspec.filesystem("memory")
    url = "memory://tfckpt-npz-import/w.npz"
    fs.pipe(url, local.read_bytes())
    packed = tmp_path / "c.npz"
    np.savez_compressed(packed, kernel=value)
    fs.pipe("memory://tfckpt-npz-import/c.npz", packed.read_bytes())
    try:
        tfckpt.import_(url, tmp_path / "m", permute=[("kernel$", (1, 0))], chunk_bytes=256)
        back = tf_values(str(tmp_path / "m"))
        assert same_bits(back["kernel"], value.T)
        assert same_bits(back["flags"], np.array([True, False]))
        tfckpt.import_("memory://tfckpt-npz-import/c.npz", tmp_path / "c", chunk_bytes=256)
        assert same_bits(tf_values(str(tmp_path / "c"))["kernel"], value)
    finally:
        fs.rm("memory://tfckpt-npz-import", recursive=True)


def test_import_big_endian_npz_member_is_a_clean_error(tmp_path):
    """Members are read as little-endian elements: a big-endian one is refused, never
    imported with its bytes misread."""
    value = np.arange(6, dtype=">f4")
    np.savez(tmp_path / "be.npz", w=value)
    with pytest.raises(tfckpt.UnsupportedCheckpointError, match="big-endian"):
        tfckpt.import_(tmp_path / "be.npz", tmp_path / "m")
    assert not list(tmp_path.glob("m*"))


def _stderr_on_terminal(*args) -> tuple[int, str]:
    """Run the CLI with stderr a pseudo-terminal: its exit code and what it printed there."""
    import fcntl
    import os
    import pty
    import termios

    primary, secondary = pty.openpty()
    # A terminal 100 columns wide (a new pseudo-terminal has none, and no room for a bar).
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tfckpt", *map(str, args)],
            stdout=subprocess.DEVNULL,
            stderr=secondary,
            env=user_env(),
        )
        os.close(secondary)
        got = b""
        while True:
            try:
                data = os.read(primary, 1 << 16)
            except OSError:  # the terminal closed: the process is done
                break
            if not data:
                break
            got += data
        return proc.wait(timeout=120), got.decode("utf-8", "replace")
    finally:
        os.close(primary)


def test_progress_bar_on_a_terminal(tmp_path):
    prefix, _ = _write_big(tmp_path, (64, 64))  # 16 KiB
    rc, err = _stderr_on_terminal("export", prefix, tmp_path / "w.npz", "--chunk-bytes", "1K")
    assert rc == 0, err
    # The bar is drawn, its total the bytes to write, and cleared when done.
    assert "0%|" in err and "/16.0k" in err
    rc, err = _stderr_on_terminal("import", tmp_path / "w.npz", tmp_path / "back" / "m")
    assert rc == 0, err
    assert "0%|" in err and "/16.0k" in err


@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
def test_many_small_tensors_start_no_thread_each(tmp_path, monkeypatch, fmt):
    """A tensor read in one piece is read on the writing thread: exporting 2 000 small
    tensors starts a handful of threads, not one per tensor (which made 200 000 tensors
    take ten times a convert's time)."""
    import threading

    values = {f"layer_{i:04d}/kernel": np.full(64, i, np.float32) for i in range(2000)}
    src = tmp_path / "src" / "model"
    tfckpt.save(values, src)
    started = []
    start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda t: (started.append(t), start(t))[1])
    out = tmp_path / f"model.{fmt}"
    tfckpt.export(src, out)
    assert len(started) < 10
    got = safetensors_numpy.load_file(str(out)) if fmt == "safetensors" else np.load(out)
    assert all(same_bits(got[k], v) for k, v in values.items())


def test_overflow_message_names_a_few_tensors(tmp_path):
    """An overflow in many tensors is one line naming the first fifty by name and how
    many more; ``counts`` holds every one."""
    values = {f"t{i:02d}": np.full(4, 1e6, np.float32) for i in range(60)}
    src = tmp_path / "src" / "model"
    tfckpt.save(values, src)
    with pytest.raises(tfckpt.CastOverflowError) as e:
        tfckpt.convert(src, tmp_path / "out" / "model", "float16")
    assert len(e.value.counts) == 60
    message = str(e.value)
    assert "t49 (4 values)" in message and "t50" not in message
    assert message.endswith("and 10 more") and "\n" not in message
    assert not (tmp_path / "out").exists()
