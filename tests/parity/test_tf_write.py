"""What tfckpt writes, real TensorFlow reads (and restores) bit-exactly."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import tf_checkpoints as tfc  # noqa: E402  (conftest put tests/ on sys.path)

import tfckpt  # noqa: E402

ALL = list(tfc.WRITERS)


def files_under(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def assert_tf_reads(prefix: str, expected: dict[str, np.ndarray]) -> None:
    """TensorFlow lists exactly ``expected`` and returns every tensor bit-exactly."""
    reader = tf.train.load_checkpoint(prefix)
    dtypes = reader.get_variable_to_dtype_map()
    shapes = reader.get_variable_to_shape_map()
    assert sorted(shapes) == sorted(expected)
    failures = {}
    for key, want in expected.items():
        want_tf = tf.string if want.dtype == object else tf.as_dtype(want.dtype)
        if dtypes[key] != want_tf:
            failures[key] = f"TF dtype {dtypes[key].name}, expected {want_tf.name}"
        elif tuple(shapes[key]) != want.shape:
            failures[key] = f"TF shape {shapes[key]}, expected {want.shape}"
        else:
            got = tfc.tf_tensor(reader, key, dtype=dtypes[key])
            why = tfc.mismatch(got, want, tfc.numpy_dtype(dtypes[key]))
            if why:
                failures[key] = "TF read " + why
    assert not failures, tfc.report(failures, f"tensors TensorFlow reads wrong from {prefix}")


def random_tensors(rng):
    return {
        "layer/kernel": rng.standard_normal((13, 7)).astype(np.float32),
        "layer/bias": rng.standard_normal(7).astype(np.float64),
        "step": np.array(99, dtype=np.int64),
        "vocab": np.array([b"the", b"", b"\xff\x00", b"q" * 1000], dtype=object),
        "bf": tfc.random_floats(ml_dtypes.bfloat16, (9, 2), rng),
        "mask": rng.integers(0, 2, 30).astype(bool),
    }


# ---------------------------------------------------------------- re-saving what TF wrote


@pytest.mark.parametrize("name", ALL)
def test_resave_tf_checkpoint(name, tf_checkpoints, tmp_path):
    case = tf_checkpoints(name)
    new = str(tmp_path / "resaved")
    with tfckpt.open(case.path) as ckpt:
        out = tfckpt.save({k: ckpt[k] for k in ckpt.keys()}, new)
    assert out == new

    assert tf.train.list_variables(new) == tf.train.list_variables(case.prefix)
    old_r, new_r = tf.train.load_checkpoint(case.prefix), tf.train.load_checkpoint(new)
    old_dtypes = old_r.get_variable_to_dtype_map()
    assert new_r.get_variable_to_dtype_map() == old_dtypes
    failures = {}
    for key in old_dtypes:
        want = tfc.tf_tensor(old_r, key, case, old_dtypes[key])
        why = tfc.mismatch(tfc.tf_tensor(new_r, key, None, old_dtypes[key]), want, want.dtype)
        if why:
            failures[key] = why
    assert not failures, tfc.report(failures, f"tensors of {name} changed by tfckpt's re-save")


# ---------------------------------------------------------------- dtypes from numpy


@pytest.mark.parametrize("key", list(tfc.numpy_values()))
def test_numpy_dtype_written(key, tmp_path):
    value = tfc.numpy_values()[key]
    prefix = str(tmp_path / key)
    assert tfckpt.save({key: value}, prefix) == prefix
    assert_tf_reads(prefix, {key: value})
    reader = tf.train.load_checkpoint(prefix)
    assert reader.get_variable_to_dtype_map()[key].name == tfc.tf_dtype_for(value).name
    with tfckpt.open(prefix) as ckpt:
        assert tfc.mismatch(ckpt[key], value, value.dtype) is None


def test_all_dtypes_in_one_checkpoint(tmp_path):
    values = tfc.numpy_values()
    prefix = str(tmp_path / "all")
    tfckpt.save(values, prefix)
    assert_tf_reads(prefix, values)


def test_array_layouts(tmp_path):
    """Non-contiguous, Fortran-ordered and byte-swapped inputs are written in row-major native form."""
    base = np.arange(60, dtype=np.float64).reshape(3, 4, 5) * 1.5 - 7
    values = {
        "transposed": base.transpose(2, 0, 1),
        "strided": base[::2, ::-1, 1::2],
        "fortran": np.asfortranarray(base),
        "big_endian_in": base.astype(">f4"),
        "big_endian_int": np.arange(10, dtype=">i8") - 5,
        "strings_strided": np.array([[b"a", b"bb"], [b"ccc", b""]], dtype=object).T,
    }
    prefix = str(tmp_path / "layouts")
    tfckpt.save(values, prefix)
    expected = {k: np.ascontiguousarray(v) for k, v in values.items()}
    expected["big_endian_in"] = expected["big_endian_in"].astype(np.float32)
    expected["big_endian_int"] = expected["big_endian_int"].astype(np.int64)
    assert_tf_reads(prefix, expected)

    with tfckpt.BundleWriter(str(tmp_path / "streamed")) as w:
        with w.stream("transposed", np.float64, (5, 3, 4)) as s:
            s.write(base.transpose(2, 0, 1)[:2])
            s.write(base.transpose(2, 0, 1)[2:])
    assert_tf_reads(str(tmp_path / "streamed"), {"transposed": expected["transposed"]})


def test_names_sort_bytewise(tmp_path):
    rng = np.random.default_rng(0)
    names = [
        "z",
        "a",
        "a/b",
        "a.b",
        "a0",
        "B",
        "a\x7f",
        "\u00e4",
        "\u65e5\u672c/\u8a9e",
        "a/b/c" * 40,
        "~",
        " ",
    ]
    values = {n: np.full((i % 3 + 1,), i, np.int32) for i, n in enumerate(rng.permutation(names))}
    prefix = str(tmp_path / "names")
    tfckpt.save(values, prefix)
    assert [n for n, _ in tf.train.list_variables(prefix)] == sorted(
        names, key=lambda n: n.encode()
    )
    assert_tf_reads(prefix, values)


# ---------------------------------------------------------------- shards


def test_max_shard_bytes(tmp_path):
    rng = np.random.default_rng(1)
    values = {
        f"t{i:02d}": rng.standard_normal(100).astype(np.float32) for i in range(10)
    }  # 400 B each
    values["s"] = np.array([b"abc" * 20], dtype=object)
    prefix = str(tmp_path / "sharded")
    tfckpt.save(values, prefix, max_shard_bytes=1000)
    files = tfc.data_files(prefix)
    assert len(files) >= 4, files
    assert all(f.name.endswith(f"-of-{len(files):05d}") for f in files), files
    assert [f.stat().st_size <= 1000 for f in files] == [True] * len(files), [
        f.stat().st_size for f in files
    ]
    assert_tf_reads(prefix, values)
    with tfckpt.open(prefix) as ckpt:
        assert ckpt.header.num_shards == len(files)
        assert {ckpt.info(k).shard for k in ckpt.keys()} == set(range(len(files)))


def test_tensor_larger_than_max_shard_bytes(tmp_path):
    rng = np.random.default_rng(2)
    values = {"big": rng.standard_normal((50, 40)).astype(np.float32), "small": np.arange(5)}
    prefix = str(tmp_path / "big")
    tfckpt.save(values, prefix, max_shard_bytes=1000)
    assert_tf_reads(prefix, values)


# ---------------------------------------------------------------- slices

EMB = np.random.default_rng(3).standard_normal((10, 4)).astype(np.float32)
ROWS_LIKE_TF1 = [(0, 4), (4, 3), (7, 3)]  # fixed_size_partitioner(3) of 10 rows


def write_emb(prefix: str, row_layout, whole_dim=None) -> None:
    """'emb' as slices of rows (or, with row_layout None, one plain tensor), plus 'other'."""
    with tfckpt.BundleWriter(prefix) as w:
        if row_layout is None:
            w.add("emb", EMB)
        else:
            for start, n in row_layout:
                w.add_slice("emb", (10, 4), [(start, n), (0, whole_dim)], EMB[start : start + n])
        w.add("other", np.arange(3, dtype=np.int64))


@pytest.mark.parametrize("whole_dim", [None, 4], ids=["dash", "explicit"])
def test_add_slice_rows(whole_dim, tmp_path):
    prefix = str(tmp_path / "rows")
    write_emb(prefix, ROWS_LIKE_TF1, whole_dim)
    assert_tf_reads(prefix, {"emb": EMB, "other": np.arange(3, dtype=np.int64)})
    with tfckpt.open(prefix) as ckpt:
        assert ckpt.info("emb").slices
        assert tfc.mismatch(ckpt["emb"], EMB, EMB.dtype) is None


def test_add_slice_columns_and_grid(tmp_path):
    rng = np.random.default_rng(4)
    cols = rng.integers(-100, 100, (6, 8)).astype(np.int64)
    grid = tfc.random_floats(ml_dtypes.bfloat16, (4, 6), rng)
    cube = rng.standard_normal((3, 4, 5)).astype(np.complex64)
    prefix = str(tmp_path / "grid")
    with tfckpt.BundleWriter(prefix) as w:
        w.add_slice("cols", cols.shape, [(0, None), (0, 3)], cols[:, 0:3])
        w.add_slice("cols", cols.shape, [(0, None), (3, 5)], cols[:, 3:8])
        for r0, c0 in [(2, 3), (0, 0), (2, 0), (0, 3)]:  # any order
            w.add_slice("grid", grid.shape, [(r0, 2), (c0, 3)], grid[r0 : r0 + 2, c0 : c0 + 3])
        w.add_slice("cube", cube.shape, [(0, None), (1, 3), (0, None)], cube[:, 1:4])
        w.add_slice("cube", cube.shape, [(0, None), (0, 1), (0, None)], cube[:, 0:1])
        w.add("plain", cols)
        w.add_slice(tfc.WEIRD_NAME, (6, 2), [(3, 3), (0, None)], cols[3:6, 0:2])
        w.add_slice(tfc.WEIRD_NAME, (6, 2), [(0, 3), (0, None)], cols[0:3, 0:2])
    assert_tf_reads(
        prefix,
        {
            "cols": cols,
            "grid": grid,
            "cube": cube,
            "plain": cols,
            tfc.WEIRD_NAME: cols[:, 0:2].copy(),
        },
    )


def restore_tf1_partitioned(prefix: str) -> np.ndarray:
    """Restore 'emb' into a TF1 variable partitioned by fixed_size_partitioner(3)."""
    with tf.Graph().as_default():
        emb = tf.compat.v1.get_variable(
            "emb",
            shape=[10, 4],
            initializer=tf.compat.v1.zeros_initializer(),
            partitioner=tf.compat.v1.fixed_size_partitioner(3),
        )
        other = tf.compat.v1.get_variable("other", initializer=np.zeros(3, np.int64))
        assert len(list(emb)) == 3
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, prefix)
            value, other_value = sess.run([tf.concat(list(emb), axis=0), other])
    assert other_value.tolist() == [0, 1, 2]
    return value


@pytest.mark.parametrize(
    "layout", [ROWS_LIKE_TF1, [(5, 5), (0, 5)], None], ids=["same", "other", "plain"]
)
def test_tf1_saver_restores_partitioned(layout, tmp_path):
    prefix = str(tmp_path / "part")
    write_emb(prefix, layout)
    assert restore_tf1_partitioned(prefix).tobytes() == EMB.tobytes()


@pytest.mark.parametrize("name", ["tf1_partitioned", "savev2_slices", "max_shard_policy"])
def test_resave_slice_by_slice(name, tf_checkpoints, tmp_path):
    """TF's partitioned checkpoints rewritten with add_slice, keeping every slice as it was."""
    case = tf_checkpoints(name)
    prefix = str(tmp_path / "resliced")
    with tfckpt.open(case.path) as ckpt, tfckpt.BundleWriter(prefix) as w:
        for key in ckpt.keys():
            info, value = ckpt.info(key), ckpt[key]
            if not info.slices:
                w.add(key, value)
            for s in info.slices:
                index = tuple(slice(a, None if n is None else a + n) for a, n in s)
                w.add_slice(key, info.shape, s, value[index])
    with tfckpt.open(prefix) as ckpt, tfckpt.open(case.path) as orig:
        assert ckpt.keys() == orig.keys()
        for key in orig.keys():
            assert sorted(ckpt.info(key).slices) == sorted(orig.info(key).slices), key
    old_r, new_r = tf.train.load_checkpoint(case.prefix), tf.train.load_checkpoint(prefix)
    assert tf.train.list_variables(prefix) == tf.train.list_variables(case.prefix)
    tf_cannot_read = case.extra.get("tf_cannot_read", {})
    for key, dtype in old_r.get_variable_to_dtype_map().items():
        if key in tf_cannot_read:
            with tfckpt.open(prefix) as ckpt:
                got = ckpt[key]
        else:
            got = tfc.tf_tensor(new_r, key, dtype=dtype)
        want = tfc.tf_tensor(old_r, key, case, dtype)
        assert tfc.mismatch(got, want, want.dtype) is None, (
            key,
            tfc.mismatch(got, want, want.dtype),
        )


# ---------------------------------------------------------------- TF1 and TF2 restore


def test_tf1_saver_restore(tmp_path):
    rng = np.random.default_rng(5)
    values = {
        "scope/inner/w": rng.standard_normal((3, 4)).astype(np.float32),
        "scope/b": rng.standard_normal(4).astype(np.float64),
        "global_step": np.array(17, dtype=np.int64),
        "flags": np.array([True, False, True]),
        "label": np.array(b"caf\xc3\xa9 \xff", dtype=object),
        "low": tfc.random_floats(ml_dtypes.bfloat16, (2, 2), rng),
    }
    prefix = str(tmp_path / "tf1")
    tfckpt.save(values, prefix)
    with tf.Graph().as_default():
        variables = {
            name: tf.compat.v1.get_variable(
                name, initializer=tf.zeros_like(tf.constant(v, dtype=tfc.tf_dtype_for(v)))
            )
            for name, v in values.items()
        }
        saver = tf.compat.v1.train.Saver(variables)
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, prefix)
            got = sess.run(variables)
    for name, v in values.items():
        g = (
            np.array(got[name], dtype=object)
            if isinstance(got[name], bytes)
            else np.asarray(got[name])
        )
        assert tfc.mismatch(g, v, v.dtype) is None, (name, g, v)


def test_tf2_keras_restore(tf_checkpoints, tmp_path):
    case = tf_checkpoints("keras_manager")
    new = str(tmp_path / "keras")
    with tfckpt.open(case.path) as ckpt:
        assert "_CHECKPOINTABLE_OBJECT_GRAPH" in ckpt
        tfckpt.save({k: ckpt[k] for k in ckpt.keys()}, new)

    model, optimizer = tfc.make_keras_model()
    optimizer.build(model.trainable_variables)
    before = [v.numpy() for v in model.weights]
    assert any(
        b.tobytes() != w.tobytes() for b, w in zip(before, case.extra["weights"])
    )  # training changed them

    status = tf.train.Checkpoint(model=model, optimizer=optimizer).restore(new)
    status.assert_consumed()
    for v, want in zip(model.weights, case.extra["weights"]):
        assert v.numpy().tobytes() == want.tobytes(), v.path
    opt_vars = [v.numpy() for v in optimizer.variables]
    assert len(opt_vars) == len(case.extra["optimizer_variables"])
    for got, want in zip(opt_vars, case.extra["optimizer_variables"]):
        assert got.tobytes() == want.tobytes()


# ---------------------------------------------------------------- byte order

# TF byte-swaps these on read (tensor_bundle's IsByteSwappable); it refuses big-endian bundles
# holding any other fixed-size dtype ("Byte-swapping not supported for tensors with dtype 25").
TF_SWAPPABLE = {
    "bool",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "qint8",
    "quint8",
    "qint16",
    "quint16",
    "qint32",
    "string",
}


def big_endian_bytes(value: np.ndarray) -> bytes:
    unit = value.dtype.itemsize // 2 if value.dtype.kind == "c" else value.dtype.itemsize
    return np.frombuffer(value.tobytes(), dtype=f"<u{unit}").byteswap().tobytes()


def test_big_endian(tmp_path):
    values = tfc.numpy_values()
    prefix = str(tmp_path / "big_endian")
    with tfckpt.BundleWriter(prefix, endianness="big") as w:
        for k, v in values.items():
            w.add(k, v)
    with tfckpt.open(prefix) as ckpt:
        assert ckpt.header.endianness == "big"
        for k, v in values.items():
            assert tfc.mismatch(ckpt[k], v, v.dtype) is None, k
            chunks = list(ckpt.iter_chunks(k, chunk_bytes=16))
            assert (
                tfc.mismatch(np.concatenate(chunks) if chunks else v.ravel(), v.ravel(), v.dtype)
                is None
            ), k
            if v.dtype != object:
                assert ckpt.read_bytes(k) == big_endian_bytes(v), k
    reader = tf.train.load_checkpoint(prefix)
    dtypes = reader.get_variable_to_dtype_map()
    tf_ok = {k: v for k, v in values.items() if dtypes[k].name in TF_SWAPPABLE}
    assert len(tf_ok) >= 30
    failures = {}
    for k, v in tf_ok.items():
        why = tfc.mismatch(tfc.tf_tensor(reader, k, dtype=dtypes[k]), v, v.dtype)
        if why:
            failures[k] = why
    assert not failures, tfc.report(failures, "tensors TF reads wrong from a big-endian bundle")


# ---------------------------------------------------------------- streaming, determinism


def test_stream_equals_add(tmp_path):
    rng = np.random.default_rng(6)
    x = tfc.random_floats(np.float32, (50, 7), rng)
    y = tfc.random_floats(ml_dtypes.bfloat16, (4, 5, 6), rng)
    z = rng.integers(0, 2**63, (33,), dtype=np.int64)
    (tmp_path / "add").mkdir()
    (tmp_path / "stream").mkdir()
    with tfckpt.BundleWriter(str(tmp_path / "add" / "ck")) as w:
        w.add("x", x)
        w.add("y", y)
        w.add("z", z)
        w.add("s", np.array([b"s"], dtype=object))
    with tfckpt.BundleWriter(str(tmp_path / "stream" / "ck")) as w:
        with w.stream("x", "float32", (50, 7)) as s:
            flat = x.ravel()
            s.write(x[:3])  # 2-D chunk
            s.write(flat[21:100])  # 1-D chunk
            s.write(flat[100:100])  # empty chunk
            s.write(flat[100:].reshape(50, 5))  # another shape altogether
        with w.stream("y", ml_dtypes.bfloat16, (4, 5, 6)) as s:
            for i in range(0, y.size, 7):
                s.write(y.ravel()[i : i + 7])
        with w.stream("z", np.dtype(np.int64), [33]) as s:
            s.write(z)
        w.add("s", np.array([b"s"], dtype=object))
    assert files_under(tmp_path / "stream") == files_under(tmp_path / "add")
    assert_tf_reads(
        str(tmp_path / "stream" / "ck"),
        {"x": x, "y": y, "z": z, "s": np.array([b"s"], dtype=object)},
    )


@pytest.mark.parametrize("n", [5, 11], ids=["short", "long"])
def test_stream_wrong_size_commits_nothing(n, tmp_path):
    # A caller's mistake rather than a bad checkpoint: ValueError is as good as CheckpointError.
    with pytest.raises((tfckpt.CheckpointError, ValueError)):
        with tfckpt.BundleWriter(str(tmp_path / "ck")) as w:
            w.add("a", np.arange(3))
            with w.stream("x", "float32", (10,)) as s:
                s.write(np.zeros(n, np.float32))
    assert list(tmp_path.iterdir()) == []


def test_stream_rejects_strings(tmp_path):
    with pytest.raises((tfckpt.CheckpointError, TypeError, ValueError)):
        with tfckpt.BundleWriter(str(tmp_path / "ck")) as w:
            with w.stream("s", "string", (2,)) as s:
                s.write(np.array([b"a", b"b"], dtype=object))
    assert list(tmp_path.iterdir()) == []


def test_deterministic(tmp_path):
    rng = np.random.default_rng(7)
    values = dict(
        random_tensors(rng), **{f"many/{i}": np.full(i % 5, i, np.int16) for i in range(300)}
    )

    def write(d: Path):
        d.mkdir()
        with tfckpt.BundleWriter(str(d / "ck"), max_shard_bytes=600) as w:
            for k, v in values.items():
                w.add(k, v)
            w.add_slice("sliced", (4, 2), [(2, 2), (0, None)], np.ones((2, 2), np.float32))
            w.add_slice("sliced", (4, 2), [(0, 2), (0, None)], np.zeros((2, 2), np.float32))
        return files_under(d)

    first, second = write(tmp_path / "one"), write(tmp_path / "two")
    assert len([f for f in first if ".data-" in f]) > 1
    assert first == second
    for d in ("three", "four"):
        (tmp_path / d).mkdir()
        tfckpt.save(values, str(tmp_path / d / "ck"))
    assert files_under(tmp_path / "three") == files_under(tmp_path / "four")


# ---------------------------------------------------------------- failure leaves nothing


def test_exception_in_writer_leaves_nothing(tmp_path):
    rng = np.random.default_rng(8)
    with pytest.raises(RuntimeError, match="boom"):
        with tfckpt.BundleWriter(str(tmp_path / "ck"), max_shard_bytes=200) as w:
            for i in range(10):
                w.add(f"t{i}", rng.standard_normal(30))
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_no_overwrite_without_asking(tmp_path):
    prefix = str(tmp_path / "ck")
    old = {"a": np.arange(4, dtype=np.int32), "b": np.ones(3)}
    new = {"a": np.arange(4, 8, dtype=np.int32)}
    tfckpt.save(old, prefix)
    before = files_under(tmp_path)
    with pytest.raises(tfckpt.CheckpointError):
        tfckpt.save(new, prefix)
    with pytest.raises(tfckpt.CheckpointError):
        with tfckpt.BundleWriter(prefix) as w:
            w.add("a", new["a"])
    assert files_under(tmp_path) == before
    assert_tf_reads(prefix, old)
    tfckpt.save(new, prefix, overwrite=True)
    assert_tf_reads(prefix, new)


def test_index_of_several_blocks_added_out_of_order(tmp_path):
    """An index of several table blocks, its entries added out of key order over three
    shards, a partitioned tensor among them (entries kept as columns, encoded in bulk):
    TensorFlow lists and reads every tensor."""
    from tfckpt.format.table import TableReader

    rng = np.random.default_rng(3)
    names = [f"model/block_{i % 97:02d}/layer_{i:05d}/" + "w" * (i % 40) for i in range(12_000)]
    expected = {name: rng.standard_normal(2).astype(np.float16) for name in names}
    part = rng.standard_normal((4, 2)).astype(np.float32)
    prefix = str(tmp_path / "many")
    with tfckpt.BundleWriter(prefix) as w:
        for k, i in enumerate(rng.permutation(len(names))):
            w.add(names[i], expected[names[i]], shard=int(k % 3))
        w.add_slice("model/part", (4, 2), [(2, 2), (0, None)], part[2:], shard=2)
        w.add_slice("model/part", (4, 2), [(0, 2), (0, None)], part[:2], shard=0)
    table = TableReader(Path(prefix + ".index").read_bytes(), prefix, lazy=True)
    assert len(list(table.iter_blocks())) >= 2
    assert_tf_reads(prefix, {**expected, "model/part": part})
