"""Structured fuzzing of V1 (tensor-slice) files: metas and slices that lie.

A generator builds V1 tables that are well-formed as tables (right checksums) so that
every case reaches the V1 logic: tensors of every V1 dtype and some no V1 file holds,
shapes with huge or negative dimensions, slices that overlap, fall outside their tensor,
have the wrong rank or are listed twice, entries missing, orphaned, holding another
slice, too few or too many values, values in the wrong field, or garbage. Each case runs
everything a user can do under the fuzz harness's time limit and allocation bound, plus a
rewrite, and must end in a correct read or a ``CheckpointError``. Random byte damage
to TensorFlow-written V1 files gets the same treatment.
"""

from __future__ import annotations

import os
import random
import shutil

import numpy as np
import pytest
from fuzz_helpers import check_case  # the harness: time limit and allocation bound

import tfckpt
from tfckpt._proto.saved_tensor_slice_pb2 import SavedTensorSlices
from tfckpt.format import orderedcode
from tfckpt.format.table import TableBuilder

STRUCTURED_CASES = 180
DAMAGE_CASES = 120
DTYPES = {  # name: (enum, numpy dtype, TensorProto field)
    "float32": (1, np.float32, "float_val"),
    "float64": (2, np.float64, "double_val"),
    "int32": (3, np.int32, "int_val"),
    "uint8": (4, np.uint8, "int_val"),
    "int16": (5, np.int16, "int_val"),
    "int8": (6, np.int8, "int_val"),
    "string": (7, object, "string_val"),
    "complex64": (8, np.complex64, "scomplex_val"),
    "int64": (9, np.int64, "int64_val"),
    "bool": (10, np.bool_, "bool_val"),
    "float16": (19, np.float16, "half_val"),
}
LIES = [
    "huge-dim",
    "huge-slices",
    "negative-dim",
    "overlap",
    "outside",
    "rank",
    "listed-twice",
    "missing-entry",
    "orphan",
    "other-slice",
    "too-few",
    "too-many",
    "wrong-field",
    "content-size",
    "garbage",
    "dtype-variant",
    "dtype-unknown",
    "meta-garbage",
    "no-meta",
]
MUST_FAIL = set(LIES) - {"orphan", "wrong-field"}  # these two may happen to read fine


def _values(rng: random.Random, dtype: str, n: int) -> np.ndarray:
    if dtype == "string":
        out = np.empty(n, dtype=object)
        out[:] = [bytes(rng.randrange(256) for _ in range(rng.randrange(4))) for _ in range(n)]
        return out
    if dtype == "bool":
        return np.array([rng.random() < 0.5 for _ in range(n)], dtype=np.bool_)
    np_dtype = np.dtype(DTYPES[dtype][1])
    if np_dtype.kind in "fc" and np_dtype != np.float16:
        # Through the proto's Python floats a signalling NaN would come back quiet.
        return np.array([rng.uniform(-1e6, 1e6) for _ in range(n)]).astype(np_dtype)
    raw = bytes(rng.randrange(256) for _ in range(n * np_dtype.itemsize))
    return np.frombuffer(raw, dtype=np_dtype).copy()


def _fill(proto, dtype: str, values: np.ndarray) -> None:
    field = DTYPES[dtype][2]
    flat = values.reshape(-1)
    if dtype == "float16":
        items = flat.view(np.uint16).astype(np.int32).tolist()
    elif dtype == "complex64":
        items = flat.view(np.float32).tolist()
    elif dtype == "string":
        items = list(flat)
    else:
        items = flat.tolist()
    getattr(proto, field).extend(items)


def _set_slice(proto, extents) -> None:
    for start, length in extents:
        e = proto.extent.add()
        e.start = start
        if length is not None:
            e.length = length


def build_case(rng: random.Random, lie: str | None):
    """(table entries, expected values or None when lying)."""
    entries: dict[bytes, bytes] = {}
    meta = SavedTensorSlices()
    meta.meta.versions.producer = 1
    truth = {}
    for i in range(rng.randint(1, 3)):
        name = f"t{i}/" + rng.choice(["w", "b", "\u00e9", "x\x00y"])
        dtype = rng.choice(sorted(DTYPES))
        shape = [rng.randint(1, 5) for _ in range(rng.randint(0, 3))]
        value = _values(rng, dtype, int(np.prod(shape, dtype=np.int64)))
        value = value.reshape(shape)
        truth[name] = value
        if shape and rng.random() < 0.5:  # two slices along axis 0 (or one if it has one row)
            cut = rng.randint(0, shape[0])
            slices = [((0, cut),), ((cut, shape[0] - cut),)] if 0 < cut < shape[0] else []
            slices = [s + tuple((0, None) for _ in shape[1:]) for s in slices] or [
                tuple((0, None) for _ in shape)
            ]
        else:
            slices = [tuple((0, None) for _ in shape)]
        m = meta.meta.tensor.add()
        m.name = name
        m.type = DTYPES[dtype][0]
        for d in shape:
            m.shape.dim.add().size = d
        for ext in slices:
            _set_slice(m.slice.add(), ext)
            part = value[(*(slice(s, None if n is None else s + n) for s, n in ext), ...)]
            saved = SavedTensorSlices()
            saved.data.name = name
            _set_slice(saved.data.slice, ext)
            saved.data.data.dtype = DTYPES[dtype][0]
            _fill(saved.data.data, dtype, part)
            entries[orderedcode.encode_slice_key(name, ext)] = saved.SerializeToString()
    if lie is not None:
        _lie(rng, lie, meta, entries)
        truth = None
    entries[b""] = meta.SerializeToString()
    if lie == "meta-garbage":
        entries[b""] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 40)))
    elif lie == "no-meta":
        del entries[b""]
    return entries, truth


def _lie(rng: random.Random, lie: str, meta, entries: dict[bytes, bytes]) -> None:
    m = rng.choice(list(meta.meta.tensor))
    keys = [k for k in entries if orderedcode.decode_slice_key(k)[0] == m.name]
    key = rng.choice(keys)
    saved = SavedTensorSlices.FromString(entries[key])
    if lie in ("huge-dim", "negative-dim"):
        if not m.shape.dim:
            m.shape.dim.add()
            m.slice[0].extent.add()
        m.shape.dim[0].size = 1 << 40 if lie == "huge-dim" else -1
    elif lie == "huge-slices":  # slices that cover a huge tensor, entries far too small
        del m.shape.dim[:]
        m.shape.dim.add().size = 1 << 40
        del m.slice[:]
        for half in [(0, 1 << 39), (1 << 39, 1 << 39)]:
            _set_slice(m.slice.add(), [half])
            entries[orderedcode.encode_slice_key(m.name, [half])] = entries[key]
    elif lie == "overlap":
        _set_slice(m.slice.add(), [(0, 1) for _ in m.shape.dim] or [])
        if not m.shape.dim:
            m.slice.add()
    elif lie == "outside":
        _set_slice(m.slice.add(), [(d.size, 1) for d in m.shape.dim] or [(0, 1)])
    elif lie == "rank":
        _set_slice(m.slice[0], [(0, None)])
    elif lie == "listed-twice":
        m.slice.add().CopyFrom(m.slice[0])
    elif lie == "missing-entry":
        del entries[key]
    elif lie == "orphan":
        entries[orderedcode.encode_slice_key(m.name + "~", [])] = entries[key]
    elif lie == "other-slice":
        saved.data.name = m.name + "!"
    elif lie == "too-few":
        for field in ("float_val", "double_val", "int_val", "int64_val", "bool_val"):
            del getattr(saved.data.data, field)[:1]
        del saved.data.data.string_val[:1]
        del saved.data.data.half_val[:1]
        del saved.data.data.scomplex_val[:2]
        saved.data.data.dtype = saved.data.data.dtype  # keep it
        if not len(saved.data.data.SerializeToString()):
            saved.data.data.int_val.append(1)
    elif lie == "too-many":
        saved.data.data.int_val.extend([1, 2])
        saved.data.data.float_val.extend([1.0])
        saved.data.data.string_val.append(b"x")
        saved.data.data.half_val.append(1)
        saved.data.data.scomplex_val.extend([1.0, 2.0])
        saved.data.data.double_val.append(1.0)
        saved.data.data.int64_val.append(1)
        saved.data.data.bool_val.append(True)
    elif lie == "wrong-field":
        saved.data.data.uint64_val.extend([1, 2, 3])
    elif lie == "content-size":
        saved.data.data.tensor_content = b"\x01" * rng.randint(1, 7)
    elif lie == "garbage":
        entries[key] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 40)))
        return
    elif lie == "dtype-variant":
        m.type = 21
    elif lie == "dtype-unknown":
        m.type = 999
    if lie in ("other-slice", "too-few", "too-many", "wrong-field", "content-size"):
        entries[key] = saved.SerializeToString()


def write_table(path: str, entries: dict[bytes, bytes]) -> None:
    with open(path, "wb") as f:
        builder = TableBuilder(f, block_size=rng_block_size(len(entries)))
        for key in sorted(entries):
            builder.add(key, entries[key])
        builder.finish()


def rng_block_size(n: int) -> int:
    return 64 if n % 2 else 4096  # small blocks too: several per file


def _rewrite(path: str, out: str) -> str:
    try:
        tfckpt.select(path, out)
    except tfckpt.CheckpointError:
        return "error"
    return "ok"


def test_structured_v1(tmp_path):
    rng = random.Random(4242)
    seen = {"ok": 0, "error": 0}
    for case in range(STRUCTURED_CASES):
        lie = None if case % 4 == 0 else LIES[case % len(LIES)]
        entries, truth = build_case(rng, lie)
        d = tmp_path / f"c{case % 3}"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        path = str(d / "model.ckpt")
        write_table(path, entries)
        what = f"case {case}: {lie or 'truthful'}"
        outcome = check_case(path, what)
        rewritten = _rewrite(path, str(d / "out" / "m"))
        seen[outcome] += 1
        if truth is not None:
            assert outcome == "ok" and rewritten == "ok", what
            with tfckpt.open(path) as ckpt, tfckpt.open(str(d / "out" / "m")) as out:
                assert sorted(ckpt.keys()) == sorted(truth), what
                for name, want in truth.items():
                    for got in (ckpt[name], out[name]):
                        assert got.shape == want.shape, what
                        if want.dtype == object:
                            assert got.tolist() == want.tolist(), what
                        else:
                            assert got.tobytes() == want.tobytes(), what
        elif lie in MUST_FAIL:
            assert outcome == "error" or rewritten == "error", what
    assert seen["ok"] and seen["error"], seen


@pytest.fixture(scope="module")
def tf_v1_file(tmp_path_factory):
    tf = pytest.importorskip("tensorflow")
    path = str(tmp_path_factory.mktemp("v1fuzz") / "model.ckpt")
    with tf.Graph().as_default():
        tf.compat.v1.get_variable("w", initializer=np.arange(12, dtype=np.float32).reshape(3, 4))
        tf.compat.v1.get_variable("s", initializer=np.array([b"", b"ab"]))
        tf.compat.v1.get_variable(
            "p",
            shape=[6, 2],
            partitioner=tf.compat.v1.fixed_size_partitioner(2),
            initializer=tf.compat.v1.ones_initializer(),
        )
        saver = tf.compat.v1.train.Saver(write_version=tf.compat.v1.train.SaverDef.V1)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.save(sess, path, write_meta_graph=False, write_state=False)
    return path


def test_damaged_tf_v1_files(tf_v1_file, tmp_path):
    rng = random.Random(99)
    original = open(tf_v1_file, "rb").read()
    assert check_case(tf_v1_file, "undamaged") == "ok"
    with tfckpt.open(tf_v1_file) as ckpt:
        assert ckpt["p"].tolist() == [[1.0, 1.0]] * 6 and ckpt["s"].tolist() == [b"", b"ab"]
    seen = {"ok": 0, "error": 0}
    for case in range(DAMAGE_CASES):
        data = bytearray(original)
        kind = rng.choice(["flip", "bytes", "truncate"])
        pos = rng.randrange(len(data))
        if kind == "flip":
            data[pos] ^= 1 << rng.randrange(8)
        elif kind == "bytes":
            data[pos : pos + 8] = bytes(rng.randrange(256) for _ in range(8))
        else:
            del data[pos:]
        d = tmp_path / f"d{case % 3}"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        path = str(d / "model.ckpt")
        with open(path, "wb") as f:
            f.write(bytes(data))
        outcome = check_case(path, f"damage {case}: {kind} at {pos}")
        _rewrite(path, os.path.join(d, "out", "m"))
        seen[outcome] += 1
    assert seen["error"], seen
