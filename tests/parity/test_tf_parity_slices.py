"""Partitioned and pre-sliced tensors against real TensorFlow.

TensorFlow may store only part of a tensor on purpose (``SaveV2`` with a slice
spec such as ``"2 5 0,1:-"``, its PreSlicedTensor case) and restores just that
part. Such tensors are legal: reported in dump and verify, copied through by
every rewrite as slices, an error only when the whole tensor is asked for.
Overlapping slices stay corrupt. And whatever a conversion writes, TensorFlow
restores into the partitioned variables that wrote the source.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from cli_helpers import in_process  # noqa: E402

import tfckpt  # noqa: E402
from tfckpt import inspection as tfinspect  # noqa: E402
from tfckpt._proto.tensor_bundle_pb2 import BundleEntryProto  # noqa: E402
from tfckpt.format import orderedcode  # noqa: E402
from tfckpt.format.table import TableBuilder, TableReader  # noqa: E402
from tfckpt.tf import verify_with_tf  # noqa: E402

# name -> (full shape, stored slice specs as SaveV2 takes them, dtype)
PRESLICED = {
    "t": ((2, 5), ["0,1:-"], tf.float32),  # TensorFlow's PreSlicedTensor case
    "emb": ((10, 4), ["0,4:-", "7,3:-"], tf.float32),  # rows 4..7 left out
    "grid": ((4, 6), ["0,2:0,3", "2,2:3,3"], tf.float64),  # two of four blocks
    "ids": ((6,), ["1,2"], tf.int32),
    "strs": ((4,), ["0,2"], tf.string),
}
MISSING = {"t": "[1:2,-]", "emb": "[4:7,-]", "grid": "[0:2,3:6], [2:4,0:3]"}


def _spec(name: str, part: str) -> str:
    shape = PRESLICED[name.lower()][0]
    return " ".join(map(str, shape)) + " " + part


def _extents(part: str) -> tuple:
    return tuple(
        (0, None) if e == "-" else tuple(int(x) for x in e.split(",")) for e in part.split(":")
    )


def _value(name: str, part: str):
    shape, _, dtype = PRESLICED[name]
    index = tuple(slice(None) if n is None else slice(s, s + n) for s, n in _extents(part))
    full = np.arange(np.prod(shape)).reshape(shape)[index]
    if dtype == tf.string:
        return tf.constant(np.vectorize(lambda v: b"s%d" % v, otypes=[object])(full))
    return tf.cast(tf.constant(full * 0.5 + 1), dtype)


def _restore(prefix: str, name: str, part: str, dtype) -> np.ndarray:
    return tf.raw_ops.RestoreV2(
        prefix=prefix, tensor_names=[name], shape_and_slices=[_spec(name, part)], dtypes=[dtype]
    )[0].numpy()


@pytest.fixture(scope="module")
def presliced(tmp_path_factory):
    """TensorFlow's SaveV2 storing only some slices of each tensor, plus a whole one."""
    prefix = str(tmp_path_factory.mktemp("presliced") / "model.ckpt")
    names, specs, values = ["plain"], [""], [tf.constant([1.5, 2.5], tf.float32)]
    for name, (_, parts, _) in PRESLICED.items():
        for part in parts:
            names.append(name)
            specs.append(_spec(name, part))
            values.append(_value(name, part))
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=specs, tensors=values)
    return prefix


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype == object or b.dtype == object:
        return a.shape == b.shape and a.tolist() == b.tolist()
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# ---------------------------------------------------------------- reading


def test_presliced_reads_like_tensorflow(presliced):
    reader = tf.train.load_checkpoint(presliced)
    with tfckpt.open(presliced) as ckpt:
        assert ckpt.keys() == sorted(reader.get_variable_to_shape_map())
        for name, (shape, parts, dtype) in PRESLICED.items():
            info = ckpt.info(name)
            stored = sum(int(np.prod(ckpt.read_slice(name, _extents(p)).shape)) for p in parts)
            assert (info.shape, info.partial, info.stored_elements) == (shape, True, stored)
            for part in parts:  # each stored slice as TensorFlow restores it
                assert _same(
                    ckpt.read_slice(name, _extents(part)), _restore(presliced, name, part, dtype)
                ), (name, part)
                chunks = list(ckpt.iter_chunks(name, 8, _extents(part)))
                assert _same(
                    np.concatenate(chunks), ckpt.read_slice(name, _extents(part)).reshape(-1)
                )
            # TensorFlow's reader cannot give the whole tensor either ...
            with pytest.raises(Exception, match="Does not have sufficient slices"):
                reader.get_tensor(name)
            # ... and tfckpt says which part is missing, in its one error family.
            for whole in (lambda: ckpt[name], lambda: list(ckpt.iter_chunks(name, 8))):
                with pytest.raises(tfckpt.CheckpointError) as err:
                    whole()
                assert not isinstance(err.value, tfckpt.CorruptCheckpointError)
                msg = str(err.value)
                assert repr(name) in msg and presliced in msg
                assert f"only {stored} of its {int(np.prod(shape))} elements" in msg
                assert MISSING.get(name, "missing") in msg
        assert ckpt.info("plain").stored_elements == 2 and not ckpt.info("plain").partial


def test_presliced_dump_reports_coverage(presliced):
    rc, out, err = in_process("dump", presliced, "--json")
    assert rc == 0, err
    tensors = {t["name"]: t for t in json.loads(out)["tensors"]}
    assert (tensors["t"]["elements"], tensors["t"]["stored_elements"]) == (10, 5)
    assert (tensors["emb"]["elements"], tensors["emb"]["stored_elements"]) == (40, 28)
    assert (tensors["plain"]["elements"], tensors["plain"]["stored_elements"]) == (2, 2)
    rc, out, err = in_process("dump", presliced)
    assert rc == 0, err
    rows = {}
    for line in out.splitlines():  # the tensor table comes before the scope table
        if line.strip():
            rows.setdefault(line.split()[0], line)
    assert "50% stored" in rows["t"] and "70% stored" in rows["emb"]
    assert "stored" not in rows["plain"]


def test_presliced_verify_is_information_not_a_problem(presliced, tmp_path):
    report = tfinspect.verify(presliced)
    assert report["problems"] == [] and report["tensors"] == len(PRESLICED) + 1, report
    assert sorted(n.split("'")[1] for n in report["partial"]) == sorted(PRESLICED)
    assert verify_with_tf(presliced)["mismatches"] == []
    rc, out, err = in_process("verify", presliced)
    assert rc == 0, err
    assert "note:" in out and "'t': pre-sliced, 5 of 10 elements" in out and "ok: " in out
    # A damaged slice of a pre-sliced tensor is still found.
    with tfckpt.open(presliced) as ckpt:
        part = ckpt.slice_info("emb")[0]
    damaged = str(tmp_path)
    for suffix in (".index", ".data-00000-of-00001"):
        with open(presliced + suffix, "rb") as f, open(f"{damaged}/model.ckpt{suffix}", "wb") as g:
            g.write(f.read())
    with open(f"{damaged}/model.ckpt.data-00000-of-00001", "r+b") as f:
        f.seek(part.offset)
        byte = f.read(1)
        f.seek(part.offset)
        f.write(bytes([byte[0] ^ 1]))
    rc, out, err = in_process("verify", f"{damaged}/model.ckpt")
    assert rc == 1 and "checksum mismatch" in err and "emb" in err


# ---------------------------------------------------------------- rewriting


@pytest.mark.parametrize(
    "args",
    [["select", "--exclude", "^plain$"], ["rename", "--map", "e=E", "--max-shard-bytes", "64"]],
)
def test_presliced_copied_through_unchanged(presliced, tmp_path, args):
    command, options = args[0], args[1:]
    out = tmp_path / "out" / "model.ckpt"
    rc, _, err = in_process(command, presliced, out, *options)
    assert rc == 0 and "Traceback" not in err, err
    rename = {"emb": "Emb"} if command == "rename" else {}
    with tfckpt.open(presliced) as src, tfckpt.open(out) as dst:
        for name, (_, parts, dtype) in PRESLICED.items():
            new = rename.get(name, name)
            assert dst.info(new).slices == src.info(name).slices
            for part in parts:  # TensorFlow restores the same slice, bit for bit
                assert _same(
                    _restore(str(out), new, part, dtype), _restore(presliced, name, part, dtype)
                ), (name, part)
                assert dst.read_bytes(new, _extents(part)) == src.read_bytes(name, _extents(part))
    assert tfinspect.verify(out)["problems"] == [] and verify_with_tf(out)["mismatches"] == []


def test_presliced_cast_slice_by_slice(presliced, tmp_path):
    out = tmp_path / "fp16" / "model.ckpt"
    rc, stdout, err = in_process("convert", presliced, out, "--dtype", "float16", "--json")
    assert rc == 0 and "Traceback" not in err, err
    with tfckpt.open(presliced) as src:  # what is stored, not the full shapes, is cast
        infos = [src.info(n) for n in src.keys()]
    assert json.loads(stdout)["bytes_out"] == sum(
        i.stored_elements * 2 if i.dtype.startswith("float") else i.nbytes for i in infos
    )
    with tfckpt.open(out) as dst:
        for name, (_, parts, dtype) in PRESLICED.items():
            new_dtype = tf.float16 if dtype.is_floating else dtype
            assert dst.info(name).dtype == new_dtype.name and dst.info(name).partial
            for part in parts:
                want = _restore(presliced, name, part, dtype)
                if dtype.is_floating:
                    want = tf.cast(want, tf.float16).numpy()
                assert _same(_restore(str(out), name, part, new_dtype), want), (name, part)
    report = verify_with_tf(out, reference=presliced)
    assert report["mismatches"] == [] and report["cast_checked"] == 4


def _rewrite_index(prefix: str, edit) -> None:
    """Damage a TF-written index: ``edit(key, BundleEntryProto)`` on every tensor entry
    (an entry is dropped when it returns False)."""
    with open(prefix + ".index", "rb") as f:
        entries = list(TableReader(f.read()).entries)
    with open(prefix + ".index", "wb") as f:
        table = TableBuilder(f)
        for key, value in entries:
            if key:
                entry = BundleEntryProto.FromString(value)
                if edit(key, entry) is False:
                    continue
                value = entry.SerializeToString()
            table.add(key, value)
        table.finish()


def _copy_checkpoint(src: str, prefix: str) -> None:
    os.makedirs(os.path.dirname(prefix))
    base = os.path.basename(src)
    for name in os.listdir(os.path.dirname(src)):
        if name.startswith(base + "."):
            with (
                open(os.path.join(os.path.dirname(src), name), "rb") as f,
                open(prefix + name[len(base) :], "wb") as g,
            ):
                g.write(f.read())


def test_tf2_partitioned_with_holes_is_copied_not_a_crash(tf_checkpoints, tmp_path):
    """A TF2 sharded checkpoint whose partitioned tensors lost slices (index and entries):
    every rewrite carries the remaining slices through, cast slice by slice."""
    src = tf_checkpoints("max_shard_policy").path
    prefix = str(tmp_path / "holes" / "ckpt")
    _copy_checkpoint(src, prefix)
    big, matrix = "big/.ATTRIBUTES/VARIABLE_VALUE", "matrix/.ATTRIBUTES/VARIABLE_VALUE"
    gone = {big: ((150, 75),), matrix: ((5, 8), (1, 29))}
    gone_keys = {orderedcode.encode_slice_key(n, e) for n, e in gone.items()}

    def drop(key, entry):
        if key in gone_keys:
            return False
        name = key.decode("latin-1")
        if name in gone:
            kept = [
                s
                for s in entry.slices
                if tuple((e.start, e.length if e.HasField("length") else None) for e in s.extent)
                != gone[name]
            ]
            del entry.slices[:]
            entry.slices.extend(kept)

    _rewrite_index(prefix, drop)
    for command in (
        ["select"],
        ["convert", "--dtype", "float16"],
        ["convert", "--dtype", "bfloat16", "--max-shard-bytes", "500"],
    ):
        out = tmp_path / "-".join(command).replace("--", "")
        rc, _, err = in_process(command[0], prefix, f"{out}/", *command[1:])
        assert rc == 0 and "Traceback" not in err, err
        target = tf.as_dtype(command[2]) if len(command) > 1 else tf.float32
        with tfckpt.open(prefix) as before, tfckpt.open(out / "ckpt") as after:
            for name in gone:
                info = after.info(name)
                assert info.partial and info.dtype == target.name
                assert info.slices == before.info(name).slices and gone[name] not in info.slices
                full = " ".join(map(str, info.shape))
                for extents in info.slices:
                    spec = (
                        full + " " + ":".join("-" if n is None else f"{s},{n}" for s, n in extents)
                    )

                    def restore(p, dtype):
                        return tf.raw_ops.RestoreV2(
                            prefix=p, tensor_names=[name], shape_and_slices=[spec], dtypes=[dtype]
                        )[0]

                    want = tf.cast(restore(prefix, tf.float32), target).numpy()
                    assert _same(restore(str(out / "ckpt"), target).numpy(), want), name
        assert tfinspect.verify(str(out / "ckpt"))["problems"] == []


def test_overlapping_slices_stay_corrupt(tf_checkpoints, tmp_path):
    src = tf_checkpoints("savev2_slices").path
    prefix = str(tmp_path / "bad" / "model.ckpt")
    _copy_checkpoint(src, prefix)
    with tfckpt.open(src) as ckpt:
        assert ckpt.info("emb").slices == (((0, 4), (0, None)), ((4, 6), (0, None)))

    def overlap_existing(key, entry):  # rows 0..4 listed twice: the slices overlap
        if key == b"emb":
            del entry.slices[:]
            for start, length in ((0, 4), (0, 4), (4, 6)):
                s = entry.slices.add()
                s.extent.add().start, s.extent[0].length = start, length
                s.extent.add()

    _rewrite_index(prefix, overlap_existing)
    for command in (["select", "--include", "emb"], ["convert", "--dtype", "float16"]):
        out = tmp_path / command[0]
        rc, _, err = in_process(command[0], prefix, f"{out}/", *command[1:])
        assert rc == 2 and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1 and "'emb'" in err and "overlap" in err
        assert not os.path.exists(out / "model.ckpt.index")
    rc, out, err = in_process("verify", prefix, "--json")
    assert rc == 1 and any("overlap" in p for p in json.loads(out)["problems"])
    with tfckpt.open(prefix) as ckpt, pytest.raises(tfckpt.CorruptCheckpointError, match="overlap"):
        ckpt.slice_info("emb")


def test_writer_accepts_presliced_and_rejects_overlap(tmp_path):
    prefix = str(tmp_path / "w" / "model")
    rows = np.arange(12, dtype=np.float32).reshape(3, 4)
    with tfckpt.BundleWriter(prefix) as w:
        w.add_slice("emb", (10, 4), [(0, 3), (0, None)], rows)
        w.add_slice("emb", (10, 4), [(8, 2), (0, None)], rows[:2] + 100)
    got = tf.raw_ops.RestoreV2(
        prefix=prefix,
        tensor_names=["emb", "emb"],
        shape_and_slices=["10 4 0,3:-", "10 4 8,2:-"],
        dtypes=[tf.float32, tf.float32],
    )
    assert _same(got[0].numpy(), rows) and _same(got[1].numpy(), rows[:2] + 100)
    w = tfckpt.BundleWriter(str(tmp_path / "w" / "bad"))
    w.add_slice("emb", (10, 4), [(0, 3), (0, None)], rows)
    w.add_slice("emb", (10, 4), [(2, 3), (0, None)], rows)
    with pytest.raises(ValueError, match="overlap"):
        w.finish()
    assert not [f for f in os.listdir(tmp_path / "w") if f.startswith("bad")]


# ---------------------------------------------------------------- TF1 partitions cast


def _tf1_graph(dtype, parts=3):
    """Partitioned variables as TF1 code makes them: rows (uneven), columns, a vector."""
    init = tf.compat.v1.random_normal_initializer(seed=7)
    fixed = tf.compat.v1.fixed_size_partitioner
    return {
        "emb/table": tf.compat.v1.get_variable(
            "emb/table", shape=[10, 4], dtype=dtype, initializer=init, partitioner=fixed(parts)
        ),
        "wide": tf.compat.v1.get_variable(
            "wide", shape=[3, 7], dtype=dtype, initializer=init, partitioner=fixed(2, axis=1)
        ),
        "vec": tf.compat.v1.get_variable(
            "vec", shape=[11], dtype=dtype, initializer=init, partitioner=fixed(parts)
        ),
    }


def _tf1_restore(prefix: str, dtype, parts=3) -> dict:
    with tf.Graph().as_default():
        variables = _tf1_graph(dtype, parts)
        with tf.compat.v1.Session() as sess:
            tf.compat.v1.train.Saver().restore(sess, prefix)
            return sess.run({n: tf.convert_to_tensor(v) for n, v in variables.items()})


@pytest.fixture(scope="module")
def tf1_float32(tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("tf1_parts") / "model.ckpt")
    with tf.Graph().as_default():
        variables = _tf1_graph(tf.float32)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            values = sess.run({n: tf.convert_to_tensor(v) for n, v in variables.items()})
            tf.compat.v1.train.Saver().save(sess, prefix)
    return prefix, values


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_tf1_partitioned_cast_restores_in_tensorflow(tf1_float32, tmp_path, dtype):
    prefix, values = tf1_float32
    out = tmp_path / dtype / "model.ckpt"
    rc, stdout, err = in_process("convert", prefix, out, "--dtype", dtype, "--json")
    assert rc == 0, err
    warnings = json.loads(stdout)["warnings"]
    target = tf.as_dtype(dtype)
    want = {n: tf.cast(v, target).numpy() for n, v in values.items()}
    with tfckpt.open(prefix) as src, tfckpt.open(out) as dst:
        for name in values:  # the partitions stay as the source's variables wrote them
            assert dst.info(name).slices == src.info(name).slices and dst.info(name).slices
    # A plain Saver restores the variables, partitioned as when they were saved.
    got = _tf1_restore(str(out), target)
    for name in values:
        assert _same(got[name], want[name]), name
    reader = tf.train.load_checkpoint(str(out))
    if dtype == "float16":
        # TensorFlow copies float16 only between equal slices: it cannot read the tensor
        # whole, nor into other partitions. Written whole, not one partition would restore:
        whole = str(tmp_path / "whole" / "model.ckpt")
        tfckpt.save({n: v for n, v in want.items()}, whole)
        with pytest.raises(tf.errors.InvalidArgumentError, match="Dtype half not supported"):
            _tf1_restore(whole, target)
        with pytest.raises(Exception, match="Dtype half not supported"):
            reader.get_tensor("emb/table")
        # So the slices are kept, and the summary says what TensorFlow cannot do with them.
        assert len(warnings) == 1
        assert "emb/table, vec, wide" in warnings[0] and "partitioned exactly" in warnings[0]
        _, _, err = in_process(
            "convert", prefix, tmp_path / "again" / "model.ckpt", "--dtype", dtype
        )
        assert "warning: 3 partitioned tensor(s) stay partitioned in float16" in err
    else:
        # Slice-copyable dtypes restore every way: whole, and into other partitions.
        assert warnings == []
        for name in values:
            assert _same(reader.get_tensor(name), want[name]), name
        got = _tf1_restore(str(out), target, parts=2)
        for name in values:
            assert _same(got[name], want[name]), name


def test_presliced_stats_and_diff_use_the_stored_slices(presliced, tmp_path):
    rc, out, err = in_process("stats", presliced, "--json")
    assert rc == 0, err
    recs = {r["name"]: r for r in json.loads(out)["tensors"]}
    for name in ("t", "emb", "grid", "ids"):
        shape, parts, dtype = PRESLICED[name]
        stored = np.concatenate([_restore(presliced, name, p, dtype).reshape(-1) for p in parts])
        rec = recs[name]
        assert (rec["elements"], rec["stored_elements"]) == (int(np.prod(shape)), stored.size)
        assert (rec["min"], rec["max"]) == (stored.min(), stored.max()), name
        assert rec["mean"] == pytest.approx(float(stored.astype(np.float64).mean()))
    assert "stored_elements" not in recs["plain"]
    # Against its float16 conversion: compared over the stored slices.
    fp16 = tmp_path / "fp16" / "model.ckpt"
    assert in_process("convert", presliced, fp16, "--dtype", "float16")[0] == 0
    rc, out, err = in_process("diff", presliced, fp16, "--json")
    assert rc == 1, err
    report = json.loads(out)
    assert {c["name"] for c in report["changed"]} == {"t", "emb", "grid", "plain"}  # dtype only
    assert report["values"] == []  # every stored value is exact in float16
    # Against the same tensors stored whole: other slices, so not compared but named.
    whole = str(tmp_path / "whole" / "model.ckpt")
    with tfckpt.open(presliced) as src:
        tfckpt.save({"t": np.zeros((2, 5), np.float32), "plain": src["plain"]}, whole)
    rc, out, err = in_process("diff", presliced, whole, "--json", "--filter", "^(t|plain)$")
    assert rc == 1, err
    report = json.loads(out)
    assert report["changed"] == [
        {
            "name": "t",
            "dtype_a": "float32",
            "dtype_b": "float32",
            "shape_a": [2, 5],
            "shape_b": [2, 5],
            "stored_a": 5,
            "stored_b": 10,
        }
    ]
    assert report["values"] == []
    rc, out, err = in_process("diff", presliced, whole, "--filter", "^(t|plain)$")
    assert rc == 1 and "(stored elements 5 -> 10)" in out, err
