"""TensorFlow's own checkpoint test cases, replayed against tfckpt.

Each test names the TensorFlow case it mirrors (``tensor_bundle_test.cc``,
``checkpoint_utils_test.py``). Where TensorFlow's test drives its C++ writer
directly, TensorFlow writes the same content here through ``SaveV2`` or a
``Saver``; where it edits files (endianness bit, version, padding), the edit is
made to files TensorFlow wrote during the test.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import tfckpt  # noqa: E402
from tfckpt._proto.tensor_bundle_pb2 import BundleEntryProto, BundleHeaderProto  # noqa: E402
from tfckpt.format.table import TableBuilder, TableReader, crc32c, mask_crc  # noqa: E402
from tfckpt.inspection import verify  # noqa: E402

# The dtypes tensor_bundle_test.cc instantiates its typed cases with.
BUNDLE_TEST_DTYPES = [
    "float32",
    "float64",
    "int32",
    "uint8",
    "int16",
    "int8",
    "complex64",
    "complex128",
    "int64",
    "bool",
    "qint32",
    "quint8",
    "qint8",
    "bfloat16",
]


def _save(prefix: str, tensors: dict, specs: dict | None = None) -> str:
    """One SaveV2, tensors in name order (the order tfckpt.save writes them in)."""
    names = sorted(tensors, key=str.encode)
    specs = specs or {}
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=names,
        shape_and_slices=[specs.get(n, "") for n in names],
        tensors=[tensors[n] for n in names],
    )
    return prefix


def _constant(value, shape, dtype: str) -> tf.Tensor:
    dt = tf.as_dtype(dtype)
    if dt.is_quantized:  # tf.fill has no quantized kernels: build the base type, then bitcast
        base = {"qint8": tf.int8, "quint8": tf.uint8, "qint32": tf.int32}[dtype]
        return tf.bitcast(tf.fill(shape, tf.constant(value, base)), dt)
    return tf.fill(shape, tf.constant(bool(value) if dt == tf.bool else value, dt))


def _numpy(t: tf.Tensor) -> np.ndarray:
    dt = t.dtype
    if dt.is_quantized:
        return (
            tf.bitcast(t, {"qint8": tf.int8, "quint8": tf.uint8, "qint32": tf.int32}[dt.name])
            .numpy()
            .view(dt.as_numpy_dtype)
        )
    return t.numpy()


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    return got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()


def _entries(prefix: str) -> list[tuple[bytes, bytes]]:
    return TableReader(Path(prefix + ".index").read_bytes(), prefix).entries


def _rewrite_index(
    prefix: str, header: BundleHeaderProto, entries: dict[bytes, BundleEntryProto]
) -> None:
    """Write the index again with an edited header and entries (TF's FlipEndiannessBit way)."""
    with open(prefix + ".index", "wb") as f:
        builder = TableBuilder(f)
        builder.add(b"", header.SerializeToString())
        for key in sorted(entries):
            builder.add(key, entries[key].SerializeToString())
        builder.finish()


def _parsed(prefix: str) -> tuple[BundleHeaderProto, dict[bytes, BundleEntryProto]]:
    rows = _entries(prefix)
    header = BundleHeaderProto.FromString(rows[0][1])
    return header, {k: BundleEntryProto.FromString(v) for k, v in rows[1:]}


def _copy(prefix: str, dest: Path) -> str:
    dest.mkdir(parents=True, exist_ok=True)
    for f in Path(prefix).parent.glob(Path(prefix).name + ".*"):
        shutil.copy(f, dest / f.name)
    return str(dest / Path(prefix).name)


# ---------------------------------------------------------------- tensor_bundle_test.cc


@pytest.mark.parametrize("dtype", BUNDLE_TEST_DTYPES)
def test_non_standard_shapes(dtype, tmp_path):
    # TensorBundleTest.NonStandardShapes: a scalar, [0, 1618] and [16, 0, 18], per dtype.
    shapes = {"scalar": [], "non_standard0": [0, 1618], "non_standard1": [16, 0, 18]}
    tensors = {n: _constant(0, s, dtype) for n, s in shapes.items()}
    theirs = _save(str(tmp_path / "tf" / "nonstandard"), tensors)
    with tfckpt.open(theirs) as ckpt:
        assert ckpt.keys() == sorted(shapes)
        for name, shape in shapes.items():
            assert ckpt.info(name).shape == tuple(shape)
            assert ckpt.info(name).dtype == dtype
            assert _same(ckpt[name], _numpy(tensors[name])), name
        values = {n: ckpt[n] for n in shapes}
    ours = tfckpt.save(values, str(tmp_path / "ours" / "nonstandard"))
    for suffix in (".index", ".data-00000-of-00001"):
        assert Path(ours + suffix).read_bytes() == Path(theirs + suffix).read_bytes()


def test_string_tensors(tmp_path):
    # TensorBundleTest.StringTensors: a default [1] string, a [1] "hello", a 32 MiB element
    # beside short ones, floats mixed in (the >4 GiB element of that case is left out).
    big = b"c" * (1 << 25)
    tensors = {
        "string_tensor": tf.constant([b""]),
        "scalar": tf.constant([b"hello"]),
        "strs": tf.constant([b"hello", b"", b"x01", big]),
        "floats": tf.fill([2, 3], tf.constant(16.18, tf.float32)),
    }
    theirs = _save(str(tmp_path / "tf" / "foo"), tensors)
    with tfckpt.open(theirs) as ckpt:
        assert ckpt.keys() == ["floats", "scalar", "string_tensor", "strs"]
        assert ckpt["string_tensor"].tolist() == [b""]
        assert ckpt["scalar"].tolist() == [b"hello"]
        strs = ckpt["strs"]
        assert strs.shape == (4,) and strs[:3].tolist() == [b"hello", b"", b"x01"]
        assert strs[3] == big
        assert _same(ckpt["floats"], np.full((2, 3), 16.18, np.float32))
        values = {n: ckpt[n] for n in ckpt.keys()}
    ours = tfckpt.save(values, str(tmp_path / "ours" / "foo"))
    for suffix in (".index", ".data-00000-of-00001"):
        assert Path(ours + suffix).read_bytes() == Path(theirs + suffix).read_bytes()


@pytest.mark.parametrize("dtype", BUNDLE_TEST_DTYPES)
def test_endianness_bit_flipped(dtype, tmp_path):
    # TensorBundleTest.Endianness: every tensor's bytes swapped, the header's endianness
    # flipped; both readers swap back. Rewritten by tfckpt, the bundle is TF's original again.
    tensors = {f"foo_00{i}": _constant(i, [2, 3], dtype) for i in (3, 0, 2, 1)}
    src = _save(str(tmp_path / "tf" / "foo"), tensors)
    big = _copy(src, tmp_path / "big")
    header, entries = _parsed(big)
    data = bytearray(Path(big + ".data-00000-of-00001").read_bytes())
    itemsize = np.dtype(tf.as_dtype(dtype).as_numpy_dtype).itemsize
    unit = itemsize // 2 if dtype.startswith("complex") else itemsize
    for e in entries.values():
        part = np.frombuffer(bytes(data[e.offset : e.offset + e.size]), dtype=f"<u{unit}")
        data[e.offset : e.offset + e.size] = part.byteswap().tobytes()
        e.crc32c = mask_crc(crc32c(bytes(data[e.offset : e.offset + e.size])))
    Path(big + ".data-00000-of-00001").write_bytes(bytes(data))
    header.endianness = BundleHeaderProto.BIG
    _rewrite_index(big, header, entries)
    reader = tf.train.load_checkpoint(big)
    with tfckpt.open(big) as ckpt:
        assert ckpt.header.endianness == "big"
        assert ckpt.keys() == ["foo_000", "foo_001", "foo_002", "foo_003"]
        for name, t in tensors.items():
            want = _numpy(t)
            assert _same(ckpt[name], want), name
            got_tf = reader.get_tensor(name)
            assert np.asarray(got_tf).tobytes() == want.tobytes(), name
    assert verify(big)["problems"] == []
    little = str(tmp_path / "little" / "foo")
    tfckpt.select(big, little)
    assert (
        Path(little + ".data-00000-of-00001").read_bytes()
        == Path(src + ".data-00000-of-00001").read_bytes()
    )


def test_partitioned_columns(tmp_path):
    # TensorBundleTest.PartitionedVariables: [5, 10] as column 0 (zeros) and columns 1-9 (ones);
    # read whole, and the stored slices listed in the order written.
    prefix = str(tmp_path / "foo")
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=["foo", "foo"],
        shape_and_slices=["5 10 -:0,1", "5 10 -:1,9"],
        tensors=[tf.zeros([5, 1]), tf.ones([5, 9])],
    )
    want = np.ones((5, 10), np.float32)
    want[:, 0] = 0
    with tfckpt.open(prefix) as ckpt:
        assert ckpt.keys() == ["foo"]
        assert _same(ckpt["foo"], want)
        assert ckpt.info("foo").slices == (((0, None), (0, 1)), ((0, None), (1, 9)))
        assert _same(ckpt.read_slice("foo", ((0, None), (1, 9))), np.ones((5, 9), np.float32))
    assert _same(tf.train.load_checkpoint(prefix).get_tensor("foo"), want)


def test_equivalent_full_slices(tmp_path):
    # TensorBundleTest.EquivalentSliceTest: slices "-:-" and "0,5:0,10" of a [5, 10] tensor
    # are the whole tensor; stored whole, read whole, and re-sliceable by TF after a rewrite.
    prefix = str(tmp_path / "foo")
    ones = tf.ones([5, 10])
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=["no_extents", "both_extents"],
        shape_and_slices=["5 10 -:-", "5 10 0,5:0,10"],
        tensors=[ones, ones],
    )
    with tfckpt.open(prefix) as ckpt:
        assert ckpt.keys() == ["both_extents", "no_extents"]
        for name in ckpt.keys():
            assert ckpt.info(name).slices == ()
            assert ckpt.info(name).shard == 0
            assert _same(ckpt[name], np.ones((5, 10), np.float32))
    out = str(tmp_path / "out" / "foo")
    tfckpt.rename(prefix, out, {"no_": "none_"})
    for name, spec in [("none_extents", "0,5:0,10"), ("both_extents", "-:-")]:
        got = tf.raw_ops.RestoreV2(
            prefix=out, tensor_names=[name], shape_and_slices=[f"5 10 {spec}"], dtypes=[tf.float32]
        )[0]
        assert _same(got.numpy(), np.ones((5, 10), np.float32))


def test_directory_structure(tmp_path):
    # TensorBundleTest.DirectoryStructure: one bundle merged alone keeps one shard; two
    # one-shard bundles merge into NAME.data-0000{0,1}-of-00002 with MergeV2Checkpoints (the
    # per-device parts of one sharded save), into one data file with tfckpt's merge of two
    # checkpoints (the sources' shards laid over one another, issue 28): TensorFlow reads both.
    workers = []
    for i in range(2):
        workers.append(_save(str(tmp_path / f"worker{i}"), {f"tensor{i}": tf.zeros([2, 3])}))
    for i, _ in enumerate(workers):
        assert sorted(p.name for p in tmp_path.glob(f"worker{i}.*")) == [
            f"worker{i}.data-00000-of-00001",
            f"worker{i}.index",
        ]
    another = str(tmp_path / "ours" / "another")
    tfckpt.merge([workers[0]], another)
    assert sorted(p.name for p in (tmp_path / "ours").glob("another.*")) == [
        "another.data-00000-of-00001",
        "another.index",
    ]
    merged = str(tmp_path / "ours" / "merged")
    tfckpt.merge([another, workers[1]], merged)
    ours = sorted(p.name for p in (tmp_path / "ours").glob("merged.*"))
    tf_dir = tmp_path / "tf"
    tf_dir.mkdir()
    copies = [_copy(w, tf_dir / f"w{i}") for i, w in enumerate(workers)]
    tf.raw_ops.MergeV2Checkpoints(
        checkpoint_prefixes=copies, destination_prefix=str(tf_dir / "merged")
    )
    assert sorted(p.name for p in tf_dir.glob("merged.*")) == [
        "merged.data-00000-of-00002",
        "merged.data-00001-of-00002",
        "merged.index",
    ]
    assert ours == ["merged.data-00000-of-00001", "merged.index"]
    reader = tf.train.load_checkpoint(merged)
    assert sorted(reader.get_variable_to_shape_map()) == ["tensor0", "tensor1"]
    theirs = tf.train.load_checkpoint(str(tf_dir / "merged"))
    for name in ("tensor0", "tensor1"):
        assert _same(reader.get_tensor(name), theirs.get_tensor(name))
    with tfckpt.open(str(tf_dir / "merged")) as ckpt:
        assert ckpt.keys() == ["tensor0", "tensor1"]


def test_errors(tmp_path):
    # TensorBundleTest.Error: a duplicate key, finishing twice, a bundle that does not exist.
    with pytest.raises(ValueError, match="duplicate"):
        with tfckpt.BundleWriter(str(tmp_path / "dup")) as w:
            w.add("foo", np.ones((2, 3), np.float32))
            w.add("foo", np.full((2, 3), 2, np.float32))
    assert list(tmp_path.glob("dup*")) == []
    w = tfckpt.BundleWriter(str(tmp_path / "bad"))
    w.finish()
    with pytest.raises(ValueError):
        w.finish()
    assert (
        tfckpt.open(str(tmp_path / "bad")).keys()
        == list(tf.train.load_checkpoint(str(tmp_path / "bad")).get_variable_to_shape_map())
        == []
    )
    with pytest.raises(tf.errors.NotFoundError):
        tf.train.load_checkpoint(str(tmp_path / "nonexist"))
    with pytest.raises(tfckpt.CheckpointNotFoundError):
        tfckpt.open(str(tmp_path / "nonexist"))


@pytest.mark.parametrize("position", [0, 1, "body"])
def test_checksum_string_flips(position, tmp_path):
    # TensorBundleTest.Checksum: flipping either 1-byte length of ["hello", "world"], or a
    # string byte, makes the tensor unreadable to both readers.
    prefix = _save(str(tmp_path / "strings"), {"foo": tf.constant([b"hello", b"world"])})
    data = Path(prefix + ".data-00000-of-00001")
    raw = bytearray(data.read_bytes())
    raw[len(raw) - 3 if position == "body" else position] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(tf.errors.OpError, match="hecksum"):
        tf.train.load_checkpoint(prefix).get_tensor("foo")
    with tfckpt.open(prefix) as ckpt, pytest.raises(tfckpt.CorruptCheckpointError) as e:
        ckpt["foo"]
    assert "foo" in str(e.value)
    assert len(verify(prefix)["problems"]) == 1


@pytest.mark.parametrize("edit", ["min_consumer", "producer", "bad_consumer"])
def test_version_refused(edit, tmp_path):
    # TensorBundleTest.VersionTest: min_consumer above 1, producer below 0, 1 among the bad
    # consumers: TensorFlow refuses to open the bundle, and so does tfckpt.
    prefix = _save(str(tmp_path / "version_test"), {"key": tf.ones([2, 3])})
    header, entries = _parsed(prefix)
    if edit == "min_consumer":
        header.version.producer, header.version.min_consumer = 2, 2
    elif edit == "producer":
        header.version.producer = -1
    else:
        header.version.producer = 2
        header.version.bad_consumers.append(1)
    _rewrite_index(prefix, header, entries)
    with pytest.raises((ValueError, tf.errors.OpError), match="version"):
        tf.train.load_checkpoint(prefix)
    with pytest.raises(tfckpt.UnsupportedCheckpointError, match="version"):
        tfckpt.open(prefix)


def test_data_alignment(tmp_path):
    # TensorBundleAlignmentTest.AlignmentTest: every tensor at an offset that is a multiple of
    # 42, zeros between (BundleWriter's data_alignment; laid out here from TF-written bytes).
    tensors = {f"foo_00{i}": tf.fill([2, 3], float(i)) for i in (3, 0, 2, 1)}
    src = _save(str(tmp_path / "tf" / "foo"), tensors)
    prefix = _copy(src, tmp_path / "aligned")
    header, entries = _parsed(prefix)
    old = Path(prefix + ".data-00000-of-00001").read_bytes()
    new = bytearray()
    for e in sorted(entries.values(), key=lambda e: e.offset):
        new += b"\0" * (-len(new) % 42)
        chunk = old[e.offset : e.offset + e.size]
        e.offset = len(new)
        new += chunk
    Path(prefix + ".data-00000-of-00001").write_bytes(bytes(new))
    _rewrite_index(prefix, header, entries)
    reader = tf.train.load_checkpoint(prefix)
    with tfckpt.open(prefix) as ckpt:
        assert ckpt.keys() == ["foo_000", "foo_001", "foo_002", "foo_003"]
        for name, t in tensors.items():
            assert ckpt.info(name).offset % 42 == 0
            assert _same(ckpt[name], t.numpy())
            assert _same(reader.get_tensor(name), t.numpy())
    assert verify(prefix)["problems"] == []
    packed = str(tmp_path / "packed" / "foo")
    tfckpt.select(prefix, packed)
    with tfckpt.open(packed) as ckpt:
        assert all(_same(ckpt[n], t.numpy()) for n, t in tensors.items())


# ---------------------------------------------------------------- checkpoint_utils_test.py


def test_init_from_partition_var(tmp_path):
    # CheckpointsTest.testInitFromPartitionVar: a [100, 100] variable saved in min_max
    # partitions, restored under another scope into a different partitioning.
    src = str(tmp_path / "src" / "model")
    partitioner = tf.compat.v1.min_max_variable_partitioner
    with tf.Graph().as_default():
        with tf.compat.v1.variable_scope("scope"):
            var = tf.compat.v1.get_variable(
                "var1",
                shape=[100, 100],
                initializer=tf.compat.v1.truncated_normal_initializer(0.5, seed=5),
                partitioner=partitioner(max_partitions=5, axis=0, min_slice_size=8 << 10),
            )
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            parts = sess.run(var._get_variable_list())
            tf.compat.v1.train.Saver().save(sess, src, write_meta_graph=False)
    full = np.concatenate(parts, axis=0)
    with tfckpt.open(src) as ckpt:
        assert len(ckpt.info("scope/var1").slices) == len(parts) > 1
        assert _same(ckpt["scope/var1"], full)
    dst = str(tmp_path / "dst" / "model")
    tfckpt.rename(src, dst, {"scope/": "some_other_scope/"})
    with tf.Graph().as_default():
        with tf.compat.v1.variable_scope("some_other_scope"):
            other = tf.compat.v1.get_variable(
                "var1",
                shape=[100, 100],
                initializer=tf.compat.v1.zeros_initializer(),
                partitioner=partitioner(max_partitions=5, axis=0, min_slice_size=16 << 10),
            )
        with tf.compat.v1.Session() as sess:
            tf.compat.v1.train.Saver().restore(sess, dst)
            got = sess.run(other._get_variable_list())
    assert len(got) != len(parts)
    assert _same(np.concatenate(got, axis=0), full)
