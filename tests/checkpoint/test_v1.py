"""V1 (tensor-slice) checkpoints, written by TensorFlow's ``SaverDef.V1`` Saver during the run.

Expected values come from the session that saved them (TensorFlow's own V1 reader
refuses partitioned, float16 and complex tensors). Every conversion to V2 is read back
by TensorFlow, with ``load_checkpoint`` and with a TF1 ``Saver`` restoring into the
graph that saved the V1 file, bit for bit.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tarfile

import numpy as np
import pytest
from cli_helpers import assert_cli_error, in_process

tf = pytest.importorskip("tensorflow")

from v1_checkpoints import (  # noqa: E402
    SLIM_VARIABLES,
    TWO_CPUS,
    build_dtypes_graph,
    build_sharded_graph,
    build_slim_graph,
    save_v1,
)
from v1_checkpoints import as_array as _array  # noqa: E402

import tfckpt  # noqa: E402
from tfckpt.format.table import BLOCK_SIZE  # noqa: E402


@pytest.fixture(scope="module")
def v1(tmp_path_factory):
    """name -> (saved path as TensorFlow returned it, expected values)."""
    root = tmp_path_factory.mktemp("v1")
    out = {}
    out["dtypes"] = save_v1(
        build_dtypes_graph, str(root / "dtypes" / "model.ckpt"), write_meta_graph=True
    )
    out["sharded"] = save_v1(
        build_sharded_graph,
        str(root / "sharded" / "model.ckpt"),
        sharded=True,
        global_step=5,
        write_meta_graph=False,
    )
    out["slim"] = save_v1(
        build_slim_graph,
        str(root / "slim" / "vgg_16.ckpt"),
        write_meta_graph=False,
        write_state=False,
    )
    return out


# TensorFlow's bundle reader assembles no partitioned float16 tensor, so the output keeps
# it in slices (restorable into the same partitioned variable).
TF_CANNOT_ASSEMBLE = {"part/half"}

BUILDERS = {"dtypes": build_dtypes_graph, "sharded": build_sharded_graph, "slim": build_slim_graph}


def assert_same(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    if want.dtype == object or got.dtype == object:
        assert got.reshape(-1).tolist() == want.reshape(-1).tolist(), what
        return
    assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
    assert got.tobytes() == want.tobytes(), (what, got, want)


def test_every_path_form(v1, tmp_path):
    """Each form TensorFlow accepts for a V1 checkpoint (it wrote no .index)."""
    saved, want = v1["sharded"]
    d = os.path.dirname(saved)
    assert saved.endswith("model.ckpt-5-?????-of-00002")
    assert sorted(os.listdir(d)) == [
        "checkpoint",
        "model.ckpt-5-00000-of-00002",
        "model.ckpt-5-00001-of-00002",
    ]
    base = os.path.join(d, "model.ckpt-5")
    for path in [saved, base, base + "-00001-of-00002", d]:
        with tfckpt.open(path) as ckpt:
            assert ckpt.prefix == base, path
            assert ckpt.header.num_shards == 2
            assert sorted(ckpt.keys()) == sorted(want)
    dtypes_file = v1["dtypes"][0]
    for path in [dtypes_file, os.path.dirname(dtypes_file)]:
        with tfckpt.open(path) as ckpt:
            assert ckpt.prefix == dtypes_file
    slim = v1["slim"][0]
    assert os.listdir(os.path.dirname(slim)) == ["vgg_16.ckpt"]
    assert os.path.getsize(slim) > 2 * BLOCK_SIZE  # three table blocks at least
    with tfckpt.open(os.path.dirname(slim)) as ckpt:  # no state file, one checkpoint
        assert ckpt.prefix == slim and len(ckpt) == SLIM_VARIABLES
    two = tmp_path / "two"
    two.mkdir()
    shutil.copy(slim, two)
    shutil.copy(dtypes_file, two)
    with pytest.raises(tfckpt.CheckpointNotFoundError, match="2 V1 checkpoints.*model.ckpt"):
        tfckpt.open(two)


@pytest.mark.parametrize("name", ["dtypes", "sharded", "slim"])
def test_keys_and_values(v1, name):
    saved, want = v1[name]
    listed = [n for n, _ in tf.train.list_variables(saved)]
    with tfckpt.open(saved) as ckpt:
        assert ckpt.keys() == listed
        assert sorted(listed) == sorted(want)
        for key in ckpt.keys():
            info = ckpt.info(key)
            assert info.shape == want[key].shape
            assert_same(ckpt[key], want[key], key)
            chunks = list(ckpt.iter_chunks(key, 16))
            assert_same(np.concatenate(chunks).reshape(want[key].shape), want[key], key)


def test_slices(v1):
    saved, want = v1["dtypes"]
    with tfckpt.open(saved) as ckpt:
        info = ckpt.info("part/emb")
        assert info.slices == (((0, 4), (0, 4)), ((4, 3), (0, 4)), ((7, 3), (0, 4)))
        assert info.stored_elements == 40 and info.nbytes == 160
        parts = ckpt.slice_info("part/wide")
        assert [p.extents for p in parts] == [((0, 5), (0, 4)), ((0, 5), (4, 3))]
        assert_same(ckpt.read_slice("part/wide", ((0, 5), (4, 3))), want["part/wide"][:, 4:], "w")
        assert ckpt.info("f16").slices == () and ckpt.slice_info("f16") == []
        # TensorFlow's own reader gives up on these.
        reader = tf.compat.v1.train.NewCheckpointReader(saved)
        for key in ("part/emb", "f16"):
            with pytest.raises(Exception):  # noqa: B017 - whatever TensorFlow raises
                reader.get_tensor(key)


def _restore_tf1(name, prefix):
    with tf.Graph().as_default():
        variables = BUILDERS[name]()
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=TWO_CPUS) as sess:
            saver.restore(sess, prefix)
            names = list(variables)
            values = sess.run([tf.convert_to_tensor(variables[n]) for n in names])
            return dict(zip(names, map(_array, values)))


@pytest.mark.parametrize("name", ["dtypes", "sharded"])
def test_convert_to_v2_restores_in_tensorflow(v1, name, tmp_path):
    saved, want = v1[name]
    rc, out, err = in_process("convert", saved, str(tmp_path) + "/")
    assert rc == 0, err
    prefix = tfckpt.latest_checkpoint(str(tmp_path))
    assert prefix is not None and os.path.isfile(prefix + ".index")
    reader = tf.train.load_checkpoint(prefix)
    assert sorted(reader.get_variable_to_shape_map()) == sorted(want)
    for key, value in want.items():
        if key in TF_CANNOT_ASSEMBLE:  # kept in its slices; the Saver below restores it
            with pytest.raises(ValueError, match="half"):
                reader.get_tensor(key)
            continue
        assert_same(_array(reader.get_tensor(key)), value, key)
    restored = _restore_tf1(name, prefix)
    for key, value in want.items():
        assert_same(restored[key], value, key)


def test_commands(v1, tmp_path, tf_checkpoints):
    saved, want = v1["dtypes"]
    rc, out, err = in_process("dump", saved)
    assert rc == 0 and "V1 (tensor slices)" in out, err
    assert "part/emb" in out
    rc, out, err = in_process("stats", saved)
    assert rc == 0 and "f32" in out, err
    rc, out, err = in_process("verify", saved)
    assert rc == 0 and out.startswith("ok:"), (out, err)
    assert in_process("convert", saved, tmp_path / "v2" / "model")[0] == 0
    rc, out, err = in_process("diff", saved, tmp_path / "v2" / "model")
    assert rc == 0 and "same" in out, (out, err)

    assert in_process("rename", saved, tmp_path / "r" / "m", "--map", "f32=renamed")[0] == 0
    r = tf.train.load_checkpoint(str(tmp_path / "r" / "m"))
    assert_same(_array(r.get_tensor("renamed")), want["f32"], "renamed")
    assert in_process("select", saved, tmp_path / "s" / "m", "--include", "^part/")[0] == 0
    r = tf.train.load_checkpoint(str(tmp_path / "s" / "m"))
    assert sorted(r.get_variable_to_shape_map()) == ["part/emb", "part/half", "part/wide"]
    with tfckpt.open(tmp_path / "s" / "m") as out:
        assert_same(out["part/half"], want["part/half"], "part/half")

    v2 = tf_checkpoints("tf1_saver").prefix
    rc, out, err = in_process("merge", saved, v2, "-o", tmp_path / "m" / "m")
    assert rc == 0, err
    r = tf.train.load_checkpoint(str(tmp_path / "m" / "m"))
    with tfckpt.open(v2) as other:
        assert sorted(r.get_variable_to_shape_map()) == sorted([*want, *other.keys()])
        for key in other.keys():
            assert_same(r.get_tensor(key), other[key], key)
    for key, value in want.items():
        if key not in TF_CANNOT_ASSEMBLE:
            assert_same(_array(r.get_tensor(key)), value, key)


def test_not_checkpoints(v1, tmp_path):
    """Files users mistake for checkpoints get an error that says what they are."""
    saved = v1["dtypes"][0]
    cases = {}
    cases[saved + ".meta"] = "MetaGraphDef"
    empty = tmp_path / "empty.ckpt"
    empty.write_bytes(b"")
    cases[str(empty)] = "empty"
    npz = tmp_path / "arrays.npz"
    np.savez(npz, a=np.arange(3))
    cases[str(npz)] = "tfckpt import"

    module = tf.Module()
    module.v = tf.Variable([1.0, 2.0])
    tf.saved_model.save(module, str(tmp_path / "sm"))
    cases[str(tmp_path / "sm" / "saved_model.pb")] = "SavedModel"

    import keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.save(tmp_path / "m.keras")
    cases[str(tmp_path / "m.keras")] = "Keras"
    graphs = (saved + ".meta", str(tmp_path / "sm" / "saved_model.pb"))
    for path, fragment in cases.items():
        if path in graphs:  # no checkpoint, but dump shows the graph (test_meta.py)
            rc, out, err = in_process("dump", path)
            assert rc == 0 and out.startswith("graph "), (rc, out, err)
        else:
            assert_cli_error(in_process("dump", path), fragment)
        with pytest.raises(tfckpt.UnsupportedCheckpointError, match=fragment):
            tfckpt.open(path)
    # A tarball is no longer one of them: it opens what it holds (tests/io/test_archives.py).
    tar = tmp_path / "model.tar.gz"
    with tarfile.open(tar, "w:gz") as t:
        t.add(saved, arcname="model.ckpt")
    with tfckpt.open(tar) as inside, tfckpt.open(saved) as outside:
        assert inside.prefix == f"{tar}#model.ckpt" and inside.keys() == outside.keys()
    if importlib.util.find_spec("h5py") is not None:  # a Keras HDF5 file is a source
        model.save(tmp_path / "m.h5")
        with tfckpt.open(tmp_path / "m.h5") as h5:
            assert [h5.info(n).shape for n in h5.keys()] == [(2, 1), (1,)]


def test_verify_meta_against_stored_slices(v1, tmp_path):
    """A slice the meta lists but no entry stores, and an entry no meta lists."""
    from tfckpt.format import orderedcode
    from tfckpt.format.table import TableBuilder, TableReader

    saved = v1["dtypes"][0]
    entries = dict(TableReader(open(saved, "rb").read()).entries)
    missing = orderedcode.encode_slice_key("part/emb", ((4, 3), (0, 4)))
    del entries[missing]
    entries[orderedcode.encode_slice_key("ghost", ())] = entries[
        orderedcode.encode_slice_key("f32", ((0, None), (0, None)))
    ]
    damaged = tmp_path / "model.ckpt"
    with open(damaged, "wb") as f:
        builder = TableBuilder(f)
        for key in sorted(entries):
            builder.add(key, entries[key])
        builder.finish()
    rc, out, err = in_process("verify", damaged)
    assert rc == 1, (out, err)
    out = out + err
    assert "'part/emb'" in out and "4:7,0:4" in out and "not stored" in out, out
    assert "belongs to no tensor" in out and "ghost" in out, out
    with tfckpt.open(damaged) as ckpt:
        assert_same(ckpt["f32"], v1["dtypes"][1]["f32"], "f32")
        with pytest.raises(tfckpt.CorruptCheckpointError, match="not stored"):
            ckpt["part/emb"]


def test_v1_on_object_storage(v1, tmp_path):
    """A sharded V1 save in an fsspec store: read with range reads, converted to V2."""
    fsspec = pytest.importorskip("fsspec")
    saved, want = v1["sharded"]
    fs = fsspec.filesystem("memory")
    for f in sorted(os.listdir(os.path.dirname(saved))):
        if f != "checkpoint":
            fs.pipe(f"/v1-remote/{f}", open(os.path.join(os.path.dirname(saved), f), "rb").read())
    try:
        with tfckpt.open("memory://v1-remote/model.ckpt-5-?????-of-00002") as ckpt:
            assert ckpt.prefix == "memory://v1-remote/model.ckpt-5"
            for key, value in want.items():
                assert_same(ckpt[key], value, key)
        tfckpt.select("memory://v1-remote/model.ckpt-5", str(tmp_path / "m"))
    finally:
        fs.rm("/v1-remote", recursive=True)
    reader = tf.train.load_checkpoint(str(tmp_path / "m"))
    for key, value in want.items():
        assert_same(_array(reader.get_tensor(key)), value, key)


def build_large_graph():
    """A tensor larger than a few tiles of 4 KiB, whole and partitioned."""
    rng = np.random.default_rng(14)
    return {
        "big": tf.compat.v1.get_variable(
            "big", initializer=rng.standard_normal((300, 40)).astype(np.float32)
        ),
        "parted": tf.compat.v1.get_variable(
            "parted",
            shape=[120, 30],
            dtype=tf.float32,
            initializer=tf.compat.v1.random_normal_initializer(seed=5),
            partitioner=tf.compat.v1.fixed_size_partitioner(3),
        ),
    }


def test_read_elements_and_tiled_permute(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    saved, want = save_v1(
        build_large_graph, str(tmp_path / "large" / "model.ckpt"), write_meta_graph=False
    )
    flat = want["big"].reshape(-1)
    with tfckpt.open(saved) as ckpt:
        for start, count in [(0, 1), (0, flat.size), (37, 1000), (flat.size - 5, 5), (9, 0)]:
            got = ckpt.read_elements("big", start, count)
            assert got.dtype == np.float32 and got.shape == (count,)
            np.testing.assert_array_equal(got, flat[start : start + count])
        slices = ckpt.info("parted").slices
        assert len(slices) == 3
        for extents in slices:
            index = tuple(slice(s, None if n is None else s + n) for s, n in extents)
            part = want["parted"][index].reshape(-1)
            for start, count in [(0, part.size), (3, 50), (part.size - 1, 1)]:
                got = ckpt.read_elements("parted", start, count, extents)
                np.testing.assert_array_equal(got, part[start : start + count])
        for start, count in [(flat.size - 1, 2), (-1, 1), (0, -1)]:
            with pytest.raises(ValueError, match="lie outside"):
                ckpt.read_elements("big", start, count)
    out = tmp_path / "out.safetensors"
    tfckpt.export(
        saved,
        str(out),
        permute=[("^big$", (1, 0)), ("^parted$", (1, 0))],
        chunk_bytes=4096,
    )
    got = safetensors_numpy.load_file(str(out))
    np.testing.assert_array_equal(got["big"], want["big"].T)
    np.testing.assert_array_equal(got["parted"], want["parted"].T)
