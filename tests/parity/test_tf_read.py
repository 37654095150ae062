"""tfckpt reads what real TensorFlow wrote exactly as TensorFlow's own reader does."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
crc32c = pytest.importorskip("crc32c")

import tf_checkpoints as tfc  # noqa: E402  (conftest put tests/ on sys.path)

import tfckpt  # noqa: E402

ALL = list(tfc.WRITERS)
MANY = "many_tensors"


def sample_keys(case, keys):
    # The 20 000-tensor checkpoint: every key for the cheap checks, a sample for the slow ones.
    return keys[::97] if case.name == MANY else keys


@pytest.fixture(params=ALL)
def case(request, tf_checkpoints):
    return tf_checkpoints(request.param)


@pytest.fixture
def ckpt(case):
    with tfckpt.open(case.path) as c:
        yield c


def same_path(a, b) -> bool:
    return os.path.normpath(os.path.abspath(a)) == os.path.normpath(os.path.abspath(b))


def masked_crc(data: bytes) -> int:
    c = crc32c.crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def full_extents(shape, slice_spec):
    """A slice with every (start, None) made explicit as (start, dim - start)."""
    return tuple((s, d - s if n is None else n) for d, (s, n) in zip(shape, slice_spec))


def copy_checkpoint(prefix: str, dest_dir: Path) -> str:
    src = Path(prefix)
    for f in src.parent.glob(src.name + ".*"):
        shutil.copy(f, dest_dir / f.name)
    return str(dest_dir / src.name)


# ---------------------------------------------------------------- names, header, resolution


def test_open_resolves_to_tensorflows_prefix(case, ckpt):
    assert isinstance(ckpt.prefix, str)
    assert same_path(ckpt.prefix, case.prefix)


def test_keys_are_list_variables(case, ckpt):
    tf_names = [n for n, _ in tf.train.list_variables(case.prefix)]
    keys = ckpt.keys()
    assert keys == sorted(tf_names)
    assert keys == tf_names  # TF lists them sorted too
    assert list(iter(ckpt)) == keys
    assert len(ckpt) == len(keys)
    assert all(k in ckpt for k in keys)
    assert "no/such/tensor" not in ckpt and "" not in ckpt


def test_header(case, ckpt):
    files = tfc.data_files(case.prefix)
    assert ckpt.header.num_shards == len(files)
    assert ckpt.header.endianness == "little"
    assert ckpt.header.version.producer == 1
    assert ckpt.header.version.min_consumer == 0
    assert tuple(ckpt.header.version.bad_consumers) == ()


# ---------------------------------------------------------------- values


def test_every_tensor_bit_exact(case, ckpt):
    reader = tf.train.load_checkpoint(case.prefix)
    dtypes = reader.get_variable_to_dtype_map()
    failures = {}
    for key in ckpt.keys():
        try:
            got = ckpt[key]
        except Exception as e:  # report every tensor, not just the first
            failures[key] = f"raised {e!r}"
            continue
        why = tfc.mismatch(
            got, tfc.tf_tensor(reader, key, case, dtypes[key]), tfc.numpy_dtype(dtypes[key])
        )
        if why:
            failures[key] = why
    assert not failures, tfc.report(failures, f"tensors of {case.name} differ from TensorFlow's")


def test_info_matches_tensorflow(case, ckpt):
    reader = tf.train.load_checkpoint(case.prefix)
    dtypes = reader.get_variable_to_dtype_map()
    shapes = reader.get_variable_to_shape_map()
    failures = {}
    for key in ckpt.keys():
        info = ckpt.info(key)
        want = (key, dtypes[key].name, tuple(shapes[key]))
        got = (info.name, info.dtype, tuple(info.shape))
        if got != want:
            failures[key] = f"(name, dtype, shape) {got}, expected {want}"
    assert not failures, tfc.report(failures, f"infos of {case.name} differ from TensorFlow's")


def test_info_locations(case, ckpt):
    """shard/offset/nbytes/slices are consistent with the files and with the values."""
    n = ckpt.header.num_shards
    failures = {}
    for key in sample_keys(case, ckpt.keys()):
        info, value = ckpt.info(key), ckpt[key]
        fixed = value.dtype != object
        if info.slices:
            if info.shard is not None:
                failures[key] = f"partitioned but shard={info.shard}"
            elif fixed and info.nbytes != value.nbytes:
                failures[key] = f"partitioned nbytes {info.nbytes}, expected {value.nbytes}"
            continue
        if info.shard not in range(n):
            failures[key] = f"shard {info.shard!r} not in range({n})"
            continue
        if fixed and info.nbytes != value.nbytes:
            failures[key] = f"nbytes {info.nbytes}, expected {value.nbytes}"
            continue
        with open(f"{case.prefix}.data-{info.shard:05d}-of-{n:05d}", "rb") as f:
            f.seek(info.offset)
            raw = f.read(info.nbytes)
        if len(raw) != info.nbytes:
            failures[key] = (
                f"offset {info.offset} + nbytes {info.nbytes} runs past the end of the shard"
            )
        elif fixed and raw != value.tobytes():
            failures[key] = f"bytes at shard {info.shard} offset {info.offset} are not the value's"
    assert not failures, tfc.report(failures, f"bad locations in {case.name}")


def test_read_bytes_and_crc(case, ckpt):
    failures = {}
    for key in sample_keys(case, ckpt.keys()):
        info = ckpt.info(key)
        if info.slices:
            with pytest.raises(tfckpt.CheckpointError):
                ckpt.read_bytes(key)
            continue
        raw, value = ckpt.read_bytes(key), ckpt[key]
        if value.dtype != object:
            want, crc_input = value.tobytes(), value.tobytes()
        else:  # FORMAT.md: varint lengths, masked CRC of the lengths (uint32 LE), the bytes
            elems = value.ravel().tolist()
            lengths = b"".join(len(e).to_bytes(4 if len(e) < 2**32 else 8, "little") for e in elems)
            lengths_crc = masked_crc(lengths).to_bytes(4, "little")
            body = b"".join(elems)
            want = b"".join(varint(len(e)) for e in elems) + lengths_crc + body
            crc_input = lengths + lengths_crc + body
        if raw != want:
            failures[key] = (
                f"read_bytes gave {len(raw)} bytes {raw[:24]!r}..., expected {len(want)} {want[:24]!r}..."
            )
        elif len(raw) != info.nbytes:
            failures[key] = f"nbytes {info.nbytes} but {len(raw)} bytes on disk"
        elif info.crc32c != crc32c.crc32c(crc_input):  # TensorInfo documents the unmasked CRC
            failures[key] = f"crc32c {info.crc32c:#x}, expected {crc32c.crc32c(crc_input):#x}"
    assert not failures, tfc.report(failures, f"raw bytes of {case.name} wrong")


def row_partitioned(info) -> bool:
    """Every slice spans whole rows (other dims whole, written as '-' or as '0,dim')."""
    return all(
        full_extents(info.shape, s)[1:] == tuple((0, d) for d in info.shape[1:])
        for s in info.slices
    )


@pytest.mark.parametrize("chunk_bytes", [3, 48])
def test_iter_chunks_reassemble(case, ckpt, chunk_bytes):
    """Chunks reassemble to the tensor; fixed-size tensors stored contiguously in row-major
    order (plain, or partitioned by rows) come in chunks of at most chunk_bytes."""
    failures = {}
    for key in sample_keys(case, ckpt.keys()):
        full = ckpt[key]
        chunks = list(ckpt.iter_chunks(key, chunk_bytes=chunk_bytes))
        if any(
            not isinstance(c, np.ndarray) or c.ndim != 1 or c.dtype != full.dtype for c in chunks
        ):
            failures[key] = (
                f"chunks must be 1-D {full.dtype}: {[(c.dtype, c.shape) for c in chunks][:5]}"
            )
            continue
        flat = np.concatenate(chunks) if chunks else np.empty(0, full.dtype)
        why = tfc.mismatch(flat, full.ravel(), full.dtype)
        if why:
            failures[key] = why
        elif full.dtype != object and row_partitioned(ckpt.info(key)):
            most = max(1, chunk_bytes // full.itemsize)  # elements; so the chunks can't be fewer
            if any(c.size > most for c in chunks):
                failures[key] = (
                    f"a chunk exceeds chunk_bytes={chunk_bytes}: {[c.nbytes for c in chunks][:10]}"
                )
    assert not failures, tfc.report(failures, f"iter_chunks wrong in {case.name}")


@pytest.mark.parametrize("key", list(tfc.numpy_values()))
def test_dtype_bit_exact(key, tf_checkpoints):
    """Each dtype on its own, against both TensorFlow's reading and the values written."""
    case = tf_checkpoints("all_dtypes")
    source = case.extra["values"][key]
    reader = tf.train.load_checkpoint(case.prefix)
    tf_dtype = reader.get_variable_to_dtype_map()[key]
    tf_value = tfc.tf_tensor(reader, key, dtype=tf_dtype)
    want_dtype = tfc.numpy_dtype(tf_dtype)
    assert tfc.mismatch(source, tf_value, want_dtype) is None  # TensorFlow kept what it was given
    with tfckpt.open(case.path) as ckpt:
        info = ckpt.info(key)
        assert info.dtype == tfc.tf_dtype_for(source).name
        assert info.shape == source.shape
        got = ckpt[key]
    assert tfc.mismatch(got, tf_value, want_dtype) is None, tfc.mismatch(got, tf_value, want_dtype)
    assert tfc.mismatch(got, source, source.dtype) is None


# ---------------------------------------------------------------- partitioned tensors

EXPECTED_SLICES = {  # (start, length) per dim, whole dims made explicit
    ("savev2_slices", "emb"): {((0, 4), (0, 4)), ((4, 6), (0, 4))},
    ("savev2_slices", "cols"): {((0, 6), (0, 3)), ((0, 6), (3, 5))},
    ("savev2_slices", "grid"): {
        ((0, 2), (0, 3)),
        ((0, 2), (3, 3)),
        ((2, 2), (0, 3)),
        ((2, 2), (3, 3)),
    },
    ("savev2_slices", "cube"): {((0, 3), (0, 1), (0, 5)), ((0, 3), (1, 3), (0, 5))},
    ("savev2_slices", "half"): {((0, 2), (0, 3)), ((2, 3), (0, 3))},
    ("savev2_slices", "strs"): {((0, 3), (0, 1)), ((0, 3), (1, 1))},
    ("tf1_partitioned", "vec"): {((0, 4),), ((4, 4),), ((8, 4),)},
    ("tf1_partitioned", "emb/table"): {((0, 4), (0, 4)), ((4, 3), (0, 4)), ((7, 3), (0, 4))},
    ("tf1_partitioned", "wide"): {((0, 5), (0, 4)), ((0, 5), (4, 3))},
}


@pytest.mark.parametrize("name", ["savev2_slices", "tf1_partitioned", "max_shard_policy"])
def test_partitioned_slices(name, tf_checkpoints):
    case = tf_checkpoints(name)
    with tfckpt.open(case.path) as ckpt:
        partitioned = sorted(k for k in ckpt.keys() if ckpt.info(k).slices)
        assert partitioned == sorted(case.extra["partitioned"])
        for key in partitioned:
            info = ckpt.info(key)
            assert info.shard is None
            slices = [full_extents(info.shape, s) for s in info.slices]
            assert all(len(s) == len(info.shape) for s in slices), slices
            cover = np.zeros(info.shape, dtype=np.int32)  # the slices tile the tensor exactly once
            for s in slices:
                cover[tuple(slice(a, a + n) for a, n in s)] += 1
            assert (cover == 1).all(), f"{key}: slices {info.slices} do not tile {info.shape}"
            if (name, key) in EXPECTED_SLICES:
                assert set(slices) == EXPECTED_SLICES[(name, key)], key
        for key, full in case.extra.get("full", {}).items():
            assert tfc.mismatch(ckpt[key], full, full.dtype) is None, key


def test_sharded_checkpoint_uses_both_shards(tf_checkpoints):
    case = tf_checkpoints("tf1_sharded")
    with tfckpt.open(case.path) as ckpt:
        assert ckpt.header.num_shards == 2
        assert {ckpt.info(k).shard for k in ckpt.keys()} == {0, 1}


def test_many_tensors_index(tf_checkpoints):
    case = tf_checkpoints(MANY)
    with tfckpt.open(case.path) as ckpt:
        assert ckpt.keys() == sorted(tfc.many_tensor_names())
        i = 12345
        name = tfc.many_tensor_names()[i]
        assert ckpt[name].tolist() == [[i % 101] * 2] * (i % 3)


# ---------------------------------------------------------------- paths


def test_state_file_relative_latest(tf_checkpoints, tmp_path, monkeypatch):
    case = tf_checkpoints("keras_manager")
    assert same_path(tf.train.latest_checkpoint(case.path), case.prefix)
    with tfckpt.open(case.path) as latest, tfckpt.open(case.extra["first"]) as first:
        assert same_path(latest.prefix, case.prefix)
        assert same_path(first.prefix, case.extra["first"])
        assert latest.keys() == first.keys()
        differ = [k for k in latest.keys() if latest[k].tobytes() != first[k].tobytes()]
        assert differ, "the two saves should differ (trained in between)"
    # Relative paths are relative to the directory, not to the working directory.
    moved = tmp_path / "moved"
    shutil.copytree(case.path, moved)
    monkeypatch.chdir(tmp_path)
    with tfckpt.open(str(moved)) as ckpt:
        assert same_path(ckpt.prefix, moved / Path(case.prefix).name)
    with tfckpt.open("moved") as ckpt:
        assert same_path(ckpt.prefix, moved / Path(case.prefix).name)


def test_state_file_absolute_latest(tf_checkpoints):
    case = tf_checkpoints("tf1_state_absolute")
    with tfckpt.open(case.path) as ckpt:
        assert same_path(ckpt.prefix, case.prefix)
        assert ckpt["v"].tolist() == [2.0] * 4  # ckpt-1 holds 1.0s


def test_saved_model_directory(tf_checkpoints):
    case = tf_checkpoints("saved_model")
    with tfckpt.open(case.path) as ckpt:
        assert ckpt.prefix.endswith(os.path.join("variables", "variables"))
        assert "w/.ATTRIBUTES/VARIABLE_VALUE" in ckpt


@pytest.mark.parametrize("form", ["index_file", "data_file", "pathlib"])
def test_other_path_forms(form, tf_checkpoints):
    case = tf_checkpoints("tf1_saver")
    path = {
        "index_file": case.prefix + ".index",
        "data_file": str(tfc.data_files(case.prefix)[0]),
        "pathlib": Path(case.prefix),
    }[form]
    with tfckpt.open(path) as ckpt:
        assert same_path(ckpt.prefix, case.prefix)
        assert ckpt.keys() == [n for n, _ in tf.train.list_variables(case.prefix)]


def test_missing_paths(tmp_path):
    with pytest.raises(tfckpt.CheckpointNotFoundError):
        tfckpt.open(str(tmp_path / "no" / "such" / "prefix"))
    with pytest.raises(tfckpt.CheckpointNotFoundError):
        tfckpt.open(str(tmp_path))  # empty directory
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "gone-3"\n')
    with pytest.raises(tfckpt.CheckpointNotFoundError) as e:
        tfckpt.open(str(tmp_path))
    assert isinstance(e.value, tfckpt.CheckpointError)


def test_missing_tensor(tf_checkpoints):
    with tfckpt.open(tf_checkpoints("tf1_saver").path) as ckpt:
        with pytest.raises(KeyError):
            ckpt["no/such/tensor"]
        with pytest.raises(tfckpt.CheckpointError):
            ckpt["no/such/tensor"]
        with pytest.raises(KeyError):
            ckpt.info("no/such/tensor")


def test_missing_data_shard(tf_checkpoints, tmp_path):
    prefix = copy_checkpoint(tf_checkpoints("tf1_sharded").prefix, tmp_path)
    os.remove(prefix + ".data-00001-of-00002")
    with pytest.raises(tfckpt.CheckpointError):
        with tfckpt.open(prefix) as ckpt:
            for k in ckpt.keys():
                ckpt[k]


# ---------------------------------------------------------------- corruption


def tf_unreadable_keys(prefix: str) -> set[str]:
    reader = tf.train.load_checkpoint(prefix)
    bad = set()
    for k in reader.get_variable_to_shape_map():
        try:
            reader.get_tensor(k)
        except Exception:
            bad.add(k)
    return bad


@pytest.mark.parametrize("where", [0.1, 0.5, 0.97])
def test_flipped_data_byte(where, tf_checkpoints, tmp_path):
    case = tf_checkpoints("corruptible")
    prefix = copy_checkpoint(case.prefix, tmp_path)
    data = Path(prefix + ".data-00000-of-00001")
    raw = bytearray(data.read_bytes())
    pos = int(len(raw) * where)
    raw[pos] ^= 0x10
    data.write_bytes(bytes(raw))

    tf_bad = tf_unreadable_keys(prefix)
    assert len(tf_bad) == 1  # TensorFlow notices, on exactly the tensor holding that byte

    with tfckpt.open(prefix) as ckpt:
        bad = set()
        for k in ckpt.keys():
            try:
                ckpt[k]
            except tfckpt.CorruptCheckpointError:
                bad.add(k)
        assert bad == tf_bad
        (key,) = tf_bad
        with pytest.raises(tfckpt.CorruptCheckpointError):
            list(ckpt.iter_chunks(key, chunk_bytes=64))

    original = tf.train.load_checkpoint(case.prefix)
    with tfckpt.open(prefix, verify=False) as ckpt:
        changed = {k for k in ckpt.keys() if ckpt[k].tobytes() != original.get_tensor(k).tobytes()}
        assert changed == tf_bad
        got, want = ckpt[key].tobytes(), original.get_tensor(key).tobytes()
        assert sum(a != b for a, b in zip(got, want)) == 1


@pytest.mark.parametrize("where", ["body", "lengths_crc"])
def test_flipped_string_byte(where, tmp_path):
    prefix = str(tmp_path / "strings")
    elems = [b"hello", b"", b"world" * 10]
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=["s"],
        shape_and_slices=[""],
        tensors=[tf.constant(np.array(elems, dtype=object))],
    )
    data = Path(prefix + ".data-00000-of-00001")
    raw = bytearray(data.read_bytes())
    assert len(raw) == 3 + 4 + 55  # three 1-byte varints, the lengths' CRC, the bytes
    pos = len(raw) - 1 if where == "body" else 4
    raw[pos] ^= 0x01
    data.write_bytes(bytes(raw))
    assert tf_unreadable_keys(prefix) == {"s"}
    with tfckpt.open(prefix) as ckpt:
        with pytest.raises(tfckpt.CorruptCheckpointError):
            ckpt["s"]
    if where == "body":
        with tfckpt.open(prefix, verify=False) as ckpt:
            assert ckpt["s"].tolist() == elems[:2] + [b"world" * 9 + b"worle"]


def test_truncated_data_shard(tf_checkpoints, tmp_path):
    prefix = copy_checkpoint(tf_checkpoints("corruptible").prefix, tmp_path)
    data = Path(prefix + ".data-00000-of-00001")
    data.write_bytes(data.read_bytes()[:-10])
    for verify in (True, False):
        with tfckpt.open(prefix, verify=verify) as ckpt:
            errors = 0
            for k in ckpt.keys():
                try:
                    ckpt[k]
                except tfckpt.CorruptCheckpointError:
                    errors += 1
            assert errors == 1, f"verify={verify}: the last tensor is cut short"


def test_truncated_index(tf_checkpoints, tmp_path):
    prefix = copy_checkpoint(tf_checkpoints("corruptible").prefix, tmp_path)
    index = Path(prefix + ".index")
    index.write_bytes(index.read_bytes()[:-7])
    with pytest.raises(tfckpt.CorruptCheckpointError):
        with tfckpt.open(prefix) as ckpt:
            ckpt.keys()


def test_flipped_index_byte(tf_checkpoints, tmp_path):
    prefix = copy_checkpoint(tf_checkpoints("tf1_saver").prefix, tmp_path)
    index = Path(prefix + ".index")
    raw = bytearray(index.read_bytes())
    raw[20] ^= 0x01  # inside the first data block (its entries), covered by the block CRC
    index.write_bytes(bytes(raw))
    with pytest.raises((tf.errors.OpError, ValueError)):
        tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
    with pytest.raises(tfckpt.CorruptCheckpointError):
        with tfckpt.open(prefix) as ckpt:
            for k in ckpt.keys():
                ckpt[k]


# ---------------------------------------------------------------- object lifetime, imports


def test_returned_arrays_are_independent(tf_checkpoints):
    """Changing an array tfckpt returned does not change what it returns next."""
    case = tf_checkpoints("savev2_slices")
    with tfckpt.open(case.path) as ckpt:
        for key in ["emb", "plain_a", "plain_b"]:
            first = ckpt[key]
            want = first.copy()
            if first.flags.writeable:
                first[...] = first.flat[-1]
            assert tfc.mismatch(ckpt[key], want, want.dtype) is None, key


def test_close_and_context_manager(tf_checkpoints):
    case = tf_checkpoints("tf1_saver")
    ckpt = tfckpt.open(case.path)
    first = ckpt.keys()[0]
    ckpt[first]
    ckpt.close()
    ckpt.close()  # idempotent
    with tfckpt.open(case.path) as c:
        assert c.keys() == ckpt.keys()


def test_import_does_not_import_tensorflow():
    code = "import sys, tfckpt; sys.exit(3 if 'tensorflow' in sys.modules else 0)"
    root = Path(tfckpt.__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
