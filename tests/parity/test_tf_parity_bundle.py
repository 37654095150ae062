"""Variant tensors and names that start with NUL, held to TensorFlow's word.

Every input is written by TensorFlow during the test: tf.data iterator state
(``tf.train.Checkpoint`` and ``SerializeIterator`` saved by name), TensorLists,
and names beginning with a NUL byte saved with ``SaveV2``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from cli_helpers import run_text  # noqa: E402

import tfckpt  # noqa: E402
from tfckpt._proto.tensor_bundle_pb2 import BundleEntryProto  # noqa: E402
from tfckpt.format.orderedcode import encode_slice_key  # noqa: E402
from tfckpt.format.table import TableReader  # noqa: E402
from tfckpt.inspection import diff, dump, verify  # noqa: E402
from tfckpt.io.commit import write_index  # noqa: E402
from tfckpt.io.storage import LOCAL  # noqa: E402


def _dataset():
    """A pipeline with shuffle buffer, map and batch state: 100 numbers, doubled, in threes."""
    return tf.data.Dataset.range(100).shuffle(10, seed=7).map(lambda x: x * 2).batch(3)


def _consumed(n: int):
    it = iter(_dataset())
    for _ in range(n):
        next(it)
    return it


def _take(it, n: int) -> list[list[int]]:
    return [next(it).numpy().tolist() for _ in range(n)]


def _restore_named_iterator(prefix: str, name: str):
    """A fresh iterator set to the state saved under ``name`` (a TF1-style, name-based save)."""
    it = iter(_dataset())
    state = tf.raw_ops.RestoreV2(
        prefix=prefix, tensor_names=[name], shape_and_slices=[""], dtypes=[tf.variant]
    )[0]
    tf.raw_ops.DeserializeIterator(resource_handle=it._iterator_resource, serialized=state)
    return it


def _restore_tensor_list(prefix: str, name: str) -> np.ndarray:
    handle = tf.raw_ops.RestoreV2(
        prefix=prefix, tensor_names=[name], shape_and_slices=[""], dtypes=[tf.variant]
    )[0]
    return tf.raw_ops.TensorListStack(
        input_handle=handle, element_dtype=tf.float32, element_shape=[2]
    ).numpy()


@pytest.fixture(scope="module")
def named_variants(tmp_path_factory):
    """SaveV2 by name: iterator state after 4 batches, a TensorList, a float32 and a scalar."""
    d = tmp_path_factory.mktemp("named_variants")
    prefix = str(d / "model.ckpt")
    it = _consumed(4)
    state = tf.raw_ops.SerializeIterator(
        resource_handle=it._iterator_resource, external_state_policy=0
    )
    rows = np.array([[1.5, -2.0], [3.25, 4.0], [0.1, 1e-3]], dtype=np.float32)
    tlist = tf.raw_ops.TensorListFromTensor(
        tensor=tf.constant(rows), element_shape=tf.constant([2])
    )
    weights = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    names = ["input/iterator", "state/list", "layer/w", "step"]
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=names,
        shape_and_slices=[""] * 4,
        tensors=[state, tlist, tf.constant(weights), tf.constant(7, tf.int64)],
    )
    return {"prefix": prefix, "next": _take(it, 3), "rows": rows, "weights": weights}


@pytest.fixture(scope="module")
def iterator_checkpoint(tmp_path_factory):
    """tf.train.Checkpoint of an iterator (5 batches consumed) and a variable."""
    d = tmp_path_factory.mktemp("iterator_ckpt")
    it = _consumed(5)
    v = tf.Variable([1.0, 2.0, 3.0])
    prefix = tf.train.Checkpoint(it=it, v=v).write(str(d / "ckpt"))
    return {"prefix": prefix, "next": _take(it, 3)}


def _variant_names(ckpt) -> list[str]:
    return [n for n in ckpt.keys() if ckpt.info(n).dtype == "variant"]


def _stored_bytes(ckpt, name: str) -> bytes:
    info = ckpt.info(name)
    data = Path(ckpt.data_files[info.shard]).read_bytes()
    return data[info.offset : info.offset + info.nbytes]


def _flip(prefix: str, dst: Path, name: str, at_fraction: float) -> str:
    """A copy of the checkpoint with one byte of ``name``'s stored bytes inverted."""
    dst.mkdir()
    for f in Path(prefix).parent.glob(Path(prefix).name + ".*"):
        shutil.copy(f, dst / f.name)
    copy = str(dst / Path(prefix).name)
    with tfckpt.open(copy) as c:
        info = c.info(name)
        shard = Path(c.data_files[info.shard])
    data = bytearray(shard.read_bytes())
    data[info.offset + int(info.nbytes * at_fraction)] ^= 0xFF
    shard.write_bytes(bytes(data))
    return copy


# ---------------------------------------------------------------- variants: reading, verify


def test_iterator_checkpoint_variants_read_and_verify(iterator_checkpoint):
    prefix = iterator_checkpoint["prefix"]
    with tfckpt.open(prefix) as ckpt:
        assert ckpt.keys() == [n for n, _ in tf.train.list_variables(prefix)]
        variants = _variant_names(ckpt)
        assert variants, "the iterator saved no variant tensor"
        for name in variants:
            assert ckpt.read_bytes(name) == _stored_bytes(ckpt, name)
    report = verify(prefix)
    # Only the variant checksums are at stake here; how the object graph names an
    # iterator's saveable is the object-graph layer's business.
    assert [p for p in report["problems"] if "object graph" not in p] == []
    assert report["tensors"] == 3


def test_named_variants_read_and_verify(named_variants):
    prefix = named_variants["prefix"]
    with tfckpt.open(prefix) as ckpt:
        assert _variant_names(ckpt) == ["input/iterator", "state/list"]
        for name in _variant_names(ckpt):
            assert ckpt.read_bytes(name) == _stored_bytes(ckpt, name)
    assert verify(prefix)["problems"] == []
    proc = run_text("verify", prefix)
    assert proc.returncode == 0, proc.stderr


def test_iterator_checkpoint_rewritten_by_bundle_writer_restores(iterator_checkpoint, tmp_path):
    """Every tensor carried through BundleWriter (variants by add_raw); TF restores the iterator."""
    src = iterator_checkpoint["prefix"]
    dst = str(tmp_path / "copy" / "ckpt")
    with tfckpt.open(src) as ckpt, tfckpt.BundleWriter(dst) as w:
        for name in ckpt.keys():
            info = ckpt.info(name)
            if info.dtype == "variant":
                w.add_raw(name, "variant", info.shape, ckpt.read_bytes(name))
            else:
                w.add(name, ckpt[name], info.dtype)
    with tfckpt.open(src) as a, tfckpt.open(dst) as b:
        for name in _variant_names(a):
            assert b.read_bytes(name) == a.read_bytes(name)
            assert b.info(name).crc32c == a.info(name).crc32c
    it = iter(_dataset())
    v = tf.Variable([0.0, 0.0, 0.0])
    tf.train.Checkpoint(it=it, v=v).read(dst).assert_consumed()
    assert _take(it, 3) == iterator_checkpoint["next"]
    assert v.numpy().tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("command", ["select", "rename", "convert"])
def test_named_variants_rewritten_restore_in_tf(named_variants, tmp_path, command):
    src = named_variants["prefix"]
    dst = str(tmp_path / "out" / "model.ckpt")
    renamed = {"input/iterator": "input/iterator", "state/list": "state/list"}
    if command == "select":
        tfckpt.select(src, dst, include=["^input/", "^state/", "^layer/"])
    elif command == "rename":
        tfckpt.rename(src, dst, {"input/": "pipeline/", "state/": "kept/"})
        renamed = {"input/iterator": "pipeline/iterator", "state/list": "kept/list"}
    else:
        tfckpt.convert(src, dst, "float16")
    with tfckpt.open(src) as a, tfckpt.open(dst) as b:
        for old, new in renamed.items():
            assert b.read_bytes(new) == a.read_bytes(old)  # carried byte for byte
    assert verify(dst)["problems"] == []
    it = _restore_named_iterator(dst, renamed["input/iterator"])
    assert _take(it, 3) == named_variants["next"]
    assert (_restore_tensor_list(dst, renamed["state/list"]) == named_variants["rows"]).all()
    want_w = named_variants["weights"].astype(np.float16 if command == "convert" else np.float32)
    assert (tf.train.load_checkpoint(dst).get_tensor("layer/w") == want_w).all()


def test_named_variants_merged_restore_in_tf(named_variants, tmp_path):
    src = named_variants["prefix"]
    other = str(tmp_path / "other" / "o.ckpt")
    tfckpt.save({"extra": np.arange(3, dtype=np.int32)}, other)
    dst = str(tmp_path / "merged" / "m.ckpt")
    tfckpt.merge([src, other], dst)
    it = _restore_named_iterator(dst, "input/iterator")
    assert _take(it, 3) == named_variants["next"]
    assert (_restore_tensor_list(dst, "state/list") == named_variants["rows"]).all()


def test_variant_written_by_add_raw_read_by_tf(named_variants, tmp_path):
    """add_raw alone (no transform): TensorFlow's reader takes the checksum, no DataLossError."""
    src = named_variants["prefix"]
    dst = str(tmp_path / "raw" / "r.ckpt")
    with tfckpt.open(src) as ckpt, tfckpt.BundleWriter(dst) as w:
        data = ckpt.read_bytes("state/list")
        w.add_raw("again/list", "variant", (), data)
        w.add_raw(
            "iterator",
            "variant",
            ckpt.info("input/iterator").shape,
            ckpt.read_bytes("input/iterator"),
        )
    assert (_restore_tensor_list(dst, "again/list") == named_variants["rows"]).all()
    assert _take(_restore_named_iterator(dst, "iterator"), 3) == named_variants["next"]


def test_variant_shapes_and_slices(tmp_path):
    """Zero elements, a [1, 2] matrix and a [2] vector saved as two slices, through select."""
    rows = [np.array([[1.0, 2.0]], np.float32), np.array([[3.0, 4.0], [5.0, 6.0]], np.float32)]
    lists = [
        tf.raw_ops.TensorListFromTensor(tensor=tf.constant(r), element_shape=tf.constant([2]))
        for r in rows
    ]
    vec = tf.stack(lists)
    src = str(tmp_path / "src" / "v")
    tf.raw_ops.SaveV2(
        prefix=src,
        tensor_names=["empty", "matrix", "sliced", "sliced"],
        shape_and_slices=["", "", "2 0,1", "2 1,1"],
        tensors=[
            tf.gather(vec, tf.constant([], tf.int32)),
            tf.reshape(vec, [1, 2]),
            vec[:1],
            vec[1:],
        ],
    )
    dst = str(tmp_path / "dst" / "v")
    tfckpt.select(src, dst)  # a copy: every tensor, slices and all
    for prefix in (src, dst):
        with tfckpt.open(prefix) as ckpt:
            assert ckpt.info("empty").shape == (0,) and ckpt.read_bytes("empty") == b""
            assert ckpt.info("sliced").slices == (((0, 1),), ((1, 1),))
            for extents in ckpt.info("sliced").slices:
                assert ckpt.read_bytes("sliced", extents)
        assert verify(prefix)["problems"] == []
    with tfckpt.open(src) as a, tfckpt.open(dst) as b:
        assert b.read_bytes("matrix") == a.read_bytes("matrix")
    matrix = tf.raw_ops.RestoreV2(
        prefix=dst, tensor_names=["matrix"], shape_and_slices=[""], dtypes=[tf.variant]
    )[0]
    assert matrix.shape == (1, 2)
    for i, spec in enumerate(["2 0,1", "2 1,1"]):
        part = tf.raw_ops.RestoreV2(
            prefix=dst, tensor_names=["sliced"], shape_and_slices=[spec], dtypes=[tf.variant]
        )[0]
        got = tf.raw_ops.TensorListStack(
            input_handle=part[0], element_dtype=tf.float32, element_shape=[2]
        ).numpy()
        assert (got == rows[i]).all()


# ---------------------------------------------------------------- variants: damage


DAMAGED_VARIANT = "checksum|malformed variant|bytes follow|varint|cannot fit|past the end|element"


@pytest.mark.parametrize("where", [0.5, 0.99])
def test_flipped_variant_byte_is_corrupt(named_variants, tmp_path, where):
    src = named_variants["prefix"]
    assert verify(src)["problems"] == []  # the intact source is fine...
    bad = _flip(src, tmp_path / "bad", "input/iterator", where)
    # ...one inverted byte is not: a checksum that differs, or, where the byte lands in an
    # element's length (the iterator's state TensorFlow writes differs run to run), framing
    # that no longer adds up: both corruption, named.
    with tfckpt.open(bad) as ckpt:
        with pytest.raises(tfckpt.CorruptCheckpointError, match=DAMAGED_VARIANT) as e:
            ckpt.read_bytes("input/iterator")
        assert "input/iterator" in str(e.value)
        assert ckpt.read_bytes("state/list")  # the other variant is untouched
    problems = verify(bad)["problems"]
    assert len(problems) == 1 and "input/iterator" in problems[0], problems
    with pytest.raises(tf.errors.OpError):  # TensorFlow refuses the same bytes
        tf.raw_ops.RestoreV2(
            prefix=bad, tensor_names=["input/iterator"], shape_and_slices=[""], dtypes=[tf.variant]
        )
    with tfckpt.open(bad, verify=False) as ckpt, pytest.raises(ValueError, match=DAMAGED_VARIANT):
        tfckpt.BundleWriter(str(tmp_path / "w" / "w")).add_raw(
            "x", "variant", ckpt.info("input/iterator").shape, ckpt.read_bytes("input/iterator")
        )


# ---------------------------------------------------------------- names that start with NUL


@pytest.fixture(scope="module")
def nul_names(tmp_path_factory):
    """SaveV2 of names starting with NUL, beside a plain name and partitioned tensors.

    ``\\x00abc\\x00\\x01\\x00`` is, byte for byte, the key a slice of a scalar ``abc``
    would have; no tensor lists it, so for TensorFlow it is a name like any other.
    """
    d = tmp_path_factory.mktemp("nul_names")
    prefix = str(d / "nul.ckpt")
    values = {
        "\x00abc": np.array([1.5, -2.5], np.float32),
        "\x00\x00x": np.array([b"s", b""], object),
        "\x00": np.array(3, np.int64),
        "plain": np.arange(6, dtype=np.float64).reshape(2, 3),
        "\x00abc\x00\x01\x00": np.array([7], np.int32),
    }
    full = np.arange(24, dtype=np.float32).reshape(6, 4)
    names = list(values) + ["\x00part", "\x00part", "emb", "emb"]
    specs = [""] * len(values) + ["6 4 0,4:-", "6 4 4,2:-"] * 2
    tensors = [tf.constant(v) for v in values.values()] + [full[:4], full[4:]] * 2
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=specs, tensors=tensors)
    values["\x00part"] = values["emb"] = full
    return prefix, values


def _tf_values(prefix: str) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(prefix)
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()}


def _equal(a, b) -> bool:
    return np.asarray(a).dtype == np.asarray(b).dtype and np.array_equal(a, b)


def test_nul_names_listed_and_read_as_tf(nul_names):
    prefix, values = nul_names
    tf_names = [n for n, _ in tf.train.list_variables(prefix)]
    assert sorted(tf_names) == sorted(values)  # TF lists them; slice keys it leaves out
    tf_vals = _tf_values(prefix)
    with tfckpt.open(prefix) as ckpt:
        assert ckpt.keys() == tf_names
        assert len(ckpt) == len(values)
        for name in values:
            assert name in ckpt
            assert _equal(ckpt[name], tf_vals[name]), name
            assert ckpt.info(name).shape == tf_vals[name].shape
        assert ckpt.info("\x00part").slices == ckpt.info("emb").slices
        assert ckpt.orphan_slice_keys() == []
    listed = [t["name"] for t in dump(tfckpt.open(prefix))["tensors"]]
    assert listed == tf_names
    report = verify(prefix)
    assert report["problems"] == [] and report["tensors"] == len(values)


def test_nul_names_through_cli(nul_names, tmp_path):
    prefix, values = nul_names
    proc = run_text("dump", prefix, "--json")
    assert proc.returncode == 0, proc.stderr
    assert [t["name"] for t in json.loads(proc.stdout)["tensors"]] == [
        n for n, _ in tf.train.list_variables(prefix)
    ]
    out = str(tmp_path / "cli" / "c.ckpt")
    proc = run_text("convert", prefix, out, "--dtype", "float64")
    assert proc.returncode == 0, proc.stderr
    got = _tf_values(out)
    assert sorted(got) == sorted(values)
    assert _equal(got["\x00abc"], values["\x00abc"].astype(np.float64))


def test_nul_names_converted_and_renamed_read_by_tf(nul_names, tmp_path):
    prefix, values = nul_names
    out = str(tmp_path / "conv" / "c.ckpt")
    tfckpt.convert(prefix, out, "float64")  # TF reassembles float64 slices, not float16
    got = _tf_values(out)
    assert sorted(got) == sorted(values)
    assert _equal(got["\x00abc"], values["\x00abc"].astype(np.float64))
    assert _equal(got["\x00part"], values["\x00part"].astype(np.float64))
    assert _equal(got["\x00\x00x"], values["\x00\x00x"])
    renamed = str(tmp_path / "ren" / "r.ckpt")
    tfckpt.rename(prefix, renamed, {"\x00": "nul/"})
    got = _tf_values(renamed)
    assert sorted(got) == sorted(
        ["nul/abc", "nul/\x00x", "nul/", "nul/part", "emb", "plain", "nul/abc\x00\x01\x00"]
    )
    assert _equal(got["nul/part"], values["\x00part"])


def test_nul_names_written_by_tfckpt_match_savev2(nul_names, tmp_path):
    """tfckpt.save of NUL-leading names: TF reads them, files byte-identical to SaveV2's."""
    _, values = nul_names
    whole = {k: v for k, v in values.items() if k not in ("\x00part", "emb")}
    ours = tfckpt.save(whole, str(tmp_path / "ours" / "n"))
    theirs = str(tmp_path / "theirs" / "n")
    names = sorted(whole, key=lambda n: n.encode())
    tf.raw_ops.SaveV2(
        prefix=theirs,
        tensor_names=names,
        shape_and_slices=[""] * len(names),
        tensors=[tf.constant(whole[n]) for n in names],
    )
    got = _tf_values(ours)
    assert sorted(got) == sorted(whole)
    for name, want in whole.items():
        assert _equal(got[name], want), name
    for suffix in (".index", ".data-00000-of-00001"):
        assert Path(ours + suffix).read_bytes() == Path(theirs + suffix).read_bytes()
    sliced = str(tmp_path / "sliced" / "s")
    with tfckpt.BundleWriter(sliced) as w:
        w.add_slice("\x00part", (6, 4), [(0, 4), (0, None)], values["\x00part"][:4])
        w.add_slice("\x00part", (6, 4), [(4, 2), (0, None)], values["\x00part"][4:])
    assert _equal(_tf_values(sliced)["\x00part"], values["\x00part"])


def test_unlisted_slice_is_listed_and_reported(nul_names, tmp_path):
    """A slice entry its tensor no longer lists: a name to TensorFlow's reader, a problem to verify."""
    src, _ = nul_names
    dst = tmp_path / "orphan"
    dst.mkdir()
    for f in Path(src).parent.glob(Path(src).name + ".*"):
        shutil.copy(f, dst / f.name)
    prefix = str(dst / Path(src).name)
    rows = TableReader(Path(prefix + ".index").read_bytes(), prefix).entries
    entries = {k: BundleEntryProto.FromString(v) for k, v in rows if k}
    del entries[b"emb"].slices[1]  # rows 4..6 stay stored, no longer listed
    Path(prefix + ".index").unlink()
    write_index(LOCAL, prefix + ".index", entries, 1, "little", False)
    orphan = encode_slice_key("emb", ((4, 2), (0, None)))
    with tfckpt.open(prefix) as ckpt:
        assert ckpt.orphan_slice_keys() == [orphan]
        name = orphan.decode("utf-8", errors="surrogateescape")
        assert name in ckpt.keys() and name in ckpt
        assert ckpt[name].tolist() == np.arange(16, 24, dtype=np.float32).reshape(2, 4).tolist()
    problems = verify(prefix)["problems"]
    assert any("belongs to no tensor" in p for p in problems), problems


def test_partitioned_name_not_utf8(tmp_path):
    """A partitioned tensor named by bytes that are not UTF-8: its slices stay slices."""
    full = np.arange(8, dtype=np.float32).reshape(4, 2)
    name = b"\xffemb"
    src = str(tmp_path / "src" / "b")
    tf.raw_ops.SaveV2(
        prefix=src,
        tensor_names=tf.constant([name, name]),
        shape_and_slices=["4 2 0,2:-", "4 2 2,2:-"],
        tensors=[tf.constant(full[:2]), tf.constant(full[2:])],
    )
    as_str = name.decode("utf-8", errors="surrogateescape")
    with tfckpt.open(src) as ckpt:
        assert ckpt.keys() == [as_str]
        assert ckpt.info(as_str).slices == (((0, 2), (0, None)), ((2, 2), (0, None)))
        assert (ckpt[as_str] == full).all()
    assert verify(src)["problems"] == []
    dst = str(tmp_path / "dst" / "b")
    tfckpt.convert(src, dst, "float64")
    got = tf.raw_ops.RestoreV2(
        prefix=dst, tensor_names=tf.constant([name]), shape_and_slices=[""], dtypes=[tf.float64]
    )[0]
    assert (got.numpy() == full).all()


def test_diff_compares_variant_elements(tmp_path):
    """Variant elements are compared by their bytes: one changed list of two is one difference."""

    def save(label, second_row):
        rows = [np.array([[1.0, 2.0]], np.float32), np.array([second_row], np.float32)]
        lists = [
            tf.raw_ops.TensorListFromTensor(tensor=tf.constant(r), element_shape=tf.constant([2]))
            for r in rows
        ]
        prefix = str(tmp_path / label / "l")
        tf.raw_ops.SaveV2(
            prefix=prefix,
            tensor_names=["lists", "w"],
            shape_and_slices=["", ""],
            tensors=[tf.stack(lists), tf.constant([1.0, 2.0])],
        )
        return prefix

    a, again, b = save("a", [3.0, 4.0]), save("again", [3.0, 4.0]), save("b", [3.0, 5.0])
    copy = str(tmp_path / "copy" / "l")
    tfckpt.select(a, copy)
    with tfckpt.open(a) as ca:
        for other in (again, copy):
            with tfckpt.open(other) as co:
                assert diff(ca, co)["same"]
        with tfckpt.open(b) as cb:
            report = diff(ca, cb)
            assert not report["same"]
            assert report["values"] == [
                {"name": "lists", "elements": 2, "differing": 1, "max_abs": None, "max_rel": None}
            ]
            assert ca.variant_elements("lists")[0] == cb.variant_elements("lists")[0]
