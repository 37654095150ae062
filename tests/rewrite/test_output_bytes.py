"""convert, rename, select and merge write the very bytes TensorFlow's SaveV2 writes.

For checkpoints TensorFlow wrote, each command's ``.index`` and data shard are
compared byte for byte with what ``tf.raw_ops.SaveV2`` writes for the tensors the
output must hold: the same names, dtypes and values (``tf.cast`` for a convert),
including strings, empty tensors, scalars and the slices of a partitioned tensor.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import tfckpt  # noqa: E402


def index_order(tensors: dict) -> dict:
    """``tensors`` in the order of their index keys: every slice key (a partitioned
    tensor's) sorts before every tensor name."""
    return {
        n: tensors[n] for n in sorted(tensors, key=lambda n: (not tensors[n][0][0], n.encode()))
    }


def savev2(prefix: str, tensors: dict[str, list[tuple[str, object]]]) -> str:
    """One SaveV2 of ``tensors``: name -> [(shape_and_slice, tf.Tensor)], one entry per
    slice. SaveV2 appends data in the order it is given: :func:`index_order` unless
    the caller has ordered them otherwise."""
    names, specs, values = [], [], []
    for name, parts in tensors.items():
        for spec, value in parts:
            names.append(name)
            specs.append(spec)
            values.append(value)
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=specs, tensors=values)
    return prefix


def source_tensors(seed: int, scope: str) -> dict[str, list[tuple[str, object]]]:
    rng = np.random.default_rng(seed)

    def normal(shape, dtype=np.float32):
        return (rng.standard_normal(shape) * 0.5).astype(dtype)

    emb = normal((6, 4))
    return {
        f"{scope}/kernel": [("", tf.constant(normal((5, 7))))],
        f"{scope}/bias": [("", tf.constant(normal(7, np.float64)))],
        f"{scope}/bf16": [("", tf.cast(tf.constant(normal((3, 2))), tf.bfloat16))],
        f"{scope}/half": [("", tf.constant(normal(5, np.float16)))],
        f"{scope}/empty": [("", tf.constant(np.zeros((0, 3), np.float32)))],
        f"{scope}/scalar": [("", tf.constant(np.float32(-2.5)))],
        f"{scope}/emb": [("6 4 0,2:-", tf.constant(emb[:2])), ("6 4 2,4:-", tf.constant(emb[2:]))],
        f"{scope}/step": [("", tf.constant(np.int64(1234)))],
        f"{scope}/mask": [("", tf.constant(rng.integers(0, 2, 9).astype(bool)))],
        f"{scope}/vocab": [
            ("", tf.constant(np.array([b"the", b"", b"\xff\x00" * 30, b"q" * 300], dtype=object)))
        ],
    }


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("output-bytes")
    out = {}
    for seed, scope in ((1, "a"), (2, "b")):
        tensors = source_tensors(seed, scope)
        out[scope] = (savev2(str(root / scope / "model"), index_order(tensors)), tensors)
        whole = {n: v for n, v in tensors.items() if len(v) == 1}
        out[scope + "_whole"] = (savev2(str(root / scope / "whole"), index_order(whole)), whole)
    return out


def assert_same_files(ours: str, theirs: str, shards: int = 1) -> None:
    def files(prefix):
        d, base = Path(prefix).parent, Path(prefix).name
        return sorted(p.name[len(base) :] for p in d.iterdir() if p.name.startswith(base + "."))

    suffixes = [f".data-{i:05d}-of-{shards:05d}" for i in range(shards)] + [".index"]
    assert files(ours) == files(theirs) == suffixes
    for suffix in suffixes:
        assert Path(ours + suffix).read_bytes() == Path(theirs + suffix).read_bytes(), suffix


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_convert(sources, tmp_path, dtype):
    src, tensors = sources["a"]
    ours = str(tmp_path / "ours" / "model")
    tfckpt.convert(src, ours, dtype)
    target = tf.as_dtype(dtype)
    cast = {
        name: [(spec, tf.cast(v, target) if v.dtype.is_floating else v) for spec, v in parts]
        for name, parts in tensors.items()
    }
    assert_same_files(ours, savev2(str(tmp_path / "theirs" / "model"), index_order(cast)))


def test_rename(sources, tmp_path):
    """Renamed tensors keep their place in the data: SaveV2 given the source's order."""
    src, tensors = sources["a"]
    ours = str(tmp_path / "ours" / "model")
    tfckpt.rename(src, ours, {r"a/(k|b)": r"z/renamed_\1", "a/": "m/"})
    renamed = {
        re.sub(r"^a/(k|b)", r"z/renamed_\1", n) if re.match(r"a/(k|b)", n) else "m/" + n[2:]: parts
        for n, parts in index_order(tensors).items()
    }
    assert "z/renamed_kernel" in renamed and "z/renamed_bf16" in renamed
    assert_same_files(ours, savev2(str(tmp_path / "theirs" / "model"), renamed))


def test_select(sources, tmp_path):
    src, tensors = sources["a"]
    ours = str(tmp_path / "ours" / "model")
    tfckpt.select(src, ours, include=["emb|vocab|kernel|half"], exclude=["half"])
    kept = {n: tensors[n] for n in ("a/emb", "a/vocab", "a/kernel")}
    assert_same_files(ours, savev2(str(tmp_path / "theirs" / "model"), index_order(kept)))


@pytest.mark.parametrize(
    "partitioned",
    [False, True],
    ids=["whole", "partitioned"],
)
def test_merge(sources, tmp_path, partitioned):
    """TensorFlow's MergeV2Checkpoints keeps one shard per source (a sharded save's
    per-device parts); a merge of whole checkpoints writes one data file (issue 28), each
    tensor's bytes as TensorFlow's merge wrote them (the same CRC32C, dtype and shape)
    and restored alike."""
    parts, ours_sources = [], []
    for scope in ("b", "a"):
        src, tensors = sources[scope if partitioned else scope + "_whole"]
        ours_sources.append(src)
        parts.append(savev2(str(tmp_path / "parts" / scope), index_order(tensors)))
    ours = str(tmp_path / "ours" / "model")
    tfckpt.merge(ours_sources, ours)
    theirs = str(tmp_path / "theirs" / "model")
    tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=parts, destination_prefix=theirs)
    assert Path(ours + ".data-00000-of-00001").exists()
    assert not Path(ours + ".data-00000-of-00002").exists()
    with tfckpt.open(ours) as a, tfckpt.open(theirs) as b:
        assert a.keys() == b.keys()
        for name in a.keys():
            if not a.info(name).slices:
                ia, ib = a.info(name), b.info(name)
                assert (ia.dtype, ia.shape, ia.crc32c) == (ib.dtype, ib.shape, ib.crc32c), name
    r_ours, r_theirs = tf.train.load_checkpoint(ours), tf.train.load_checkpoint(theirs)
    names = r_theirs.get_variable_to_shape_map()
    assert r_ours.get_variable_to_shape_map() == names
    for name in names:
        np.testing.assert_array_equal(r_ours.get_tensor(name), r_theirs.get_tensor(name))


def test_rename_tf2(tmp_path):
    """A TF2 checkpoint: the object graph re-keyed as TensorFlow's own proto would be."""
    from tensorflow.core.protobuf.trackable_object_graph_pb2 import TrackableObjectGraph

    model = tf.Module()
    model.dense = tf.Module()
    model.dense.kernel = tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3) / 7)
    model.dense.bias = tf.Variable(np.array([0.5, -0.25, 1e-3], np.float32))
    src = tf.train.Checkpoint(model=model, step=tf.Variable(7, dtype=tf.int64)).write(
        str(tmp_path / "src" / "ckpt")
    )
    ours = str(tmp_path / "ours" / "ckpt")
    tfckpt.rename(src, ours, {"model/dense/": "model/layer/"})

    reader = tf.train.load_checkpoint(src)
    graph = TrackableObjectGraph.FromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    for node in graph.nodes:
        for attr in node.attributes:
            attr.checkpoint_key = attr.checkpoint_key.replace("model/dense/", "model/layer/")
    with tfckpt.open(src) as ckpt:  # renamed tensors keep their place in the data
        order = sorted(ckpt.keys(), key=lambda n: ckpt.info(n).offset)
    tensors = {}
    for name in order:
        value = (
            graph.SerializeToString()
            if name == "_CHECKPOINTABLE_OBJECT_GRAPH"
            else reader.get_tensor(name)
        )
        tensors[name.replace("model/dense/", "model/layer/")] = [("", tf.constant(value))]
    assert list(tensors)[-1] == "_CHECKPOINTABLE_OBJECT_GRAPH"  # TensorFlow writes it last
    assert_same_files(ours, savev2(str(tmp_path / "theirs" / "ckpt"), tensors))
