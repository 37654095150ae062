"""TensorFlow parity found by review: each case is written by real TensorFlow during the run.

A broken object-graph tensor is a one-line error (or a verify finding); a dtype cast
leaves lookup tables as TensorFlow restores them; ``verify --tf`` hands TensorFlow
what it opens for every spelling of a sharded V1 checkpoint; an unchanged object
graph is copied byte for byte; a moved state file is reported once.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings

import numpy as np
import pytest
from cli_helpers import assert_cli_error, in_process, run_text, user_env

tf = pytest.importorskip("tensorflow")

import tfckpt  # noqa: E402

V1 = tf.compat.v1.train.SaverDef.V1
TWO_CPUS = tf.compat.v1.ConfigProto(device_count={"CPU": 2})


@pytest.fixture(scope="module")
def sharded_v1(tmp_path_factory):
    """A V1 save on two devices (two files), as TensorFlow's Saver wrote it:
    (the path it returned, the values saved)."""
    d = tmp_path_factory.mktemp("sharded_v1")
    values = {"dev0/w": np.arange(6, dtype=np.float32), "dev1/step": np.arange(3)}
    with tf.Graph().as_default():
        with tf.device("/cpu:0"):
            tf.compat.v1.get_variable("dev0/w", initializer=values["dev0/w"])
        with tf.device("/cpu:1"):
            tf.compat.v1.get_variable("dev1/step", initializer=values["dev1/step"])
        saver = tf.compat.v1.train.Saver(write_version=V1, sharded=True)
        with tf.compat.v1.Session(config=TWO_CPUS) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            saved = saver.save(sess, str(d / "model.ckpt"), global_step=5, write_meta_graph=False)
    assert saved.endswith("model.ckpt-5-?????-of-00002"), saved
    return saved, values


# -- 5: a state file naming a moved V1 checkpoint is one warning


def _moved_v1(sharded_v1, tmp_path):
    saved, _ = sharded_v1
    moved = tmp_path / "moved"
    moved.mkdir()
    for name in os.listdir(os.path.dirname(saved)):
        if name.startswith("model.ckpt-5-"):
            shutil.copy(os.path.join(os.path.dirname(saved), name), moved / name)
    gone = os.path.join(str(tmp_path / "elsewhere"), os.path.basename(saved))
    # What TensorFlow's Saver wrote, with the directory it no longer is in.
    state = open(os.path.join(os.path.dirname(saved), "checkpoint")).read()
    (moved / "checkpoint").write_text(state.replace(saved, gone))
    assert gone in (moved / "checkpoint").read_text()
    return moved, gone


def test_moved_v1_state_file_warns_once(sharded_v1, tmp_path):
    moved, gone = _moved_v1(sharded_v1, tmp_path)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with tfckpt.open(moved) as ckpt:
            assert ckpt.keys() == ["dev0/w", "dev1/step"]
    path_warnings = [w for w in seen if issubclass(w.category, tfckpt.CheckpointPathWarning)]
    assert len(path_warnings) == 1, [str(w.message) for w in path_warnings]
    assert gone in str(path_warnings[0].message)

    for env in (user_env(), user_env(PYTHONWARNINGS="always")):
        proc = run_text("dump", moved, env=env)
        assert proc.returncode == 0, proc.stderr
        notes = [line for line in proc.stderr.splitlines() if gone in line]
        assert len(notes) == 1, proc.stderr


# -- 3: verify --tf on a sharded V1 save, however it is spelled


def test_verify_tf_sharded_v1_every_spelling(sharded_v1):
    saved, _ = sharded_v1
    directory = os.path.dirname(saved)
    prefix = saved[: -len("-?????-of-00002")]
    shard = f"{prefix}-00000-of-00002"
    assert os.path.isfile(shard) and not os.path.exists(prefix)
    for spelling in (saved, prefix, shard, directory):
        rc, out, err = in_process("verify", "--tf", spelling)
        assert rc == 0 and err == "", (spelling, err)
        assert "TensorFlow's reader agrees bit-for-bit" in out, (spelling, out)
        assert "2 tensors" in out, (spelling, out)
    # What verify hands TensorFlow opens there too.
    with tfckpt.open(prefix) as ckpt:
        assert tf.train.load_checkpoint(ckpt.tf_path).has_tensor("dev1/step")


# -- 1: an object-graph tensor that is no scalar serialized graph


BAD_GRAPHS = {
    "float": (lambda: tf.constant(1.5), "not float32 of shape []"),
    "strings": (lambda: tf.constant(["a", "b"]), "not string of shape [2]"),
    "not_a_proto": (lambda: tf.constant(b"\xff\xff\x01 no proto"), "not a TrackableObjectGraph"),
}


@pytest.fixture(scope="module")
def bad_graphs(tmp_path_factory):
    """kind -> prefix of a bundle TensorFlow's SaveV2 wrote with that graph tensor."""
    root = tmp_path_factory.mktemp("bad_graphs")
    out = {}
    for kind, (value, _) in BAD_GRAPHS.items():
        prefix = str(root / kind / "ckpt")
        tf.raw_ops.SaveV2(
            prefix=prefix,
            tensor_names=["_CHECKPOINTABLE_OBJECT_GRAPH", "w"],
            shape_and_slices=["", ""],
            tensors=[value(), tf.constant([1.0, 2.0])],
        )
        out[kind] = prefix
    return out


@pytest.mark.parametrize("kind", sorted(BAD_GRAPHS))
def test_bad_object_graph_tensor(bad_graphs, kind, tmp_path):
    prefix, why = bad_graphs[kind], BAD_GRAPHS[kind][1]
    where = (prefix, "_CHECKPOINTABLE_OBJECT_GRAPH", why)
    # TensorFlow lists it as any tensor; so does dump.
    assert sorted(n for n, _ in tf.train.list_variables(prefix)) == [
        "_CHECKPOINTABLE_OBJECT_GRAPH",
        "w",
    ]
    rc, out, err = in_process("dump", prefix)
    assert rc == 0 and err == "", err
    assert "_CHECKPOINTABLE_OBJECT_GRAPH" in out and "w " in out
    # verify: a finding, one line naming file and tensor.
    rc, out, err = in_process("verify", prefix)
    assert rc == 1 and out == "" and "Traceback" not in err, (rc, out, err)
    assert len(err.splitlines()) == 1 and all(f in err for f in where), err
    for args in (
        ["dump", "--object-graph", prefix],
        ["convert", "--dtype", "float16", prefix, tmp_path / "out"],
        ["rename", "--map", "w=v", prefix, tmp_path / "renamed"],
        ["flatten", prefix, tmp_path / "flat"],
    ):
        assert_cli_error(in_process(*args), *where)
    with pytest.raises(tfckpt.CheckpointError, match="_CHECKPOINTABLE_OBJECT_GRAPH"):
        tfckpt.plan(prefix, tmp_path / "planned", cast="float16")


# -- 4: an object graph nothing changes is copied byte for byte

GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"
V_KEY = "v/.ATTRIBUTES/VARIABLE_VALUE"


def _unordered_graph() -> bytes:
    """A graph root -> v (one variable) with its fields in an order protobuf never
    writes (attributes before children, a key before its name): the same message,
    other bytes."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2 as pb

    obj, ref = pb.TrackableObjectGraph.TrackableObject, pb.TrackableObjectGraph
    attr = obj.SerializedTensor
    root = obj(children=[obj.ObjectReference(node_id=1, local_name="v")])
    var = (
        attr(checkpoint_key=V_KEY).SerializeToString()
        + attr(name="VARIABLE_VALUE", full_name="v").SerializeToString()
    )
    var_node = obj(attributes=[attr.FromString(var)])
    # Nodes: node 1's attributes written field by field, keys first.
    node1 = b"\x12" + bytes([len(var)]) + var  # field 2 (attributes), length-delimited
    assert obj.FromString(node1) == var_node
    data = b"".join(b"\x0a" + bytes([len(n)]) + n for n in (root.SerializeToString(), node1))
    parsed = ref.FromString(data)
    assert parsed == ref(nodes=[root, var_node])
    assert parsed.SerializeToString() != data  # protobuf would write other bytes
    return data


def _graph_bytes(prefix) -> bytes:
    return tf.train.load_checkpoint(str(prefix)).get_tensor(GRAPH)


def test_unchanged_object_graph_bytes_pass_through(tmp_path):
    data = _unordered_graph()
    src = str(tmp_path / "src" / "ckpt")
    tf.raw_ops.SaveV2(
        prefix=src,
        tensor_names=[GRAPH, V_KEY, "extra"],
        shape_and_slices=["", "", ""],
        tensors=[tf.constant(data), tf.constant([1.0, 2.0, 3.0]), tf.constant([7.0])],
    )
    assert _graph_bytes(src) == data
    runs = {
        "copy": ["convert", src, tmp_path / "copy"],
        "half": ["convert", "--dtype", "float16", src, tmp_path / "half"],
        # No attribute names "extra": renaming it changes nothing in the graph.
        "renamed": ["rename", "--map", "extra=more", src, tmp_path / "renamed"],
    }
    for what, args in runs.items():
        rc, _, err = in_process(*args)
        assert rc == 0, (what, err)
        out = tmp_path / what
        assert _graph_bytes(out) == data, what
        # TensorFlow restores it as written.
        dtype = tf.float16 if what == "half" else tf.float32
        v = tf.Variable(tf.zeros([3], dtype))
        tf.train.Checkpoint(v=v).restore(str(out)).expect_partial()
        assert v.numpy().tolist() == [1.0, 2.0, 3.0], what


def test_tf_written_object_graph_bytes_pass_through(tmp_path):
    v = tf.Variable([1.0, 2.0])
    saved = tf.train.Checkpoint(v=v, step=tf.Variable(3)).write(str(tmp_path / "tf" / "ckpt"))
    rc, _, err = in_process("convert", "--dtype", "float16", saved, tmp_path / "half")
    assert rc == 0, err
    assert _graph_bytes(tmp_path / "half") == _graph_bytes(saved)
    # A rename the graph stores is still written into it.
    rc, _, err = in_process("rename", "--map", "v/=w/", saved, tmp_path / "renamed")
    assert rc == 0, err
    renamed = _graph_bytes(tmp_path / "renamed")
    assert renamed != _graph_bytes(saved) and b"w/.ATTRIBUTES/VARIABLE_VALUE" in renamed


# -- 2: --dtype casts variables, not lookup tables


def _dtypes(prefix) -> dict[str, str]:
    return {
        k: v.name
        for k, v in tf.train.load_checkpoint(str(prefix)).get_variable_to_dtype_map().items()
    }


def test_cast_keeps_tf2_lookup_table(tmp_path):
    table = tf.lookup.experimental.MutableHashTable(tf.string, tf.float32, default_value=-1.0)
    table.insert(tf.constant(["a", "b"]), tf.constant([1.5, 2.5]))
    saved = tf.train.Checkpoint(v=tf.Variable([1.0, 2.0]), table=table).write(
        str(tmp_path / "src" / "ckpt")
    )
    rc, _, err = in_process("convert", "--dtype", "float16", saved, tmp_path / "half")
    assert rc == 0, err
    assert _dtypes(tmp_path / "half") == {
        GRAPH: "string",
        "table/.ATTRIBUTES/table-keys": "string",
        "table/.ATTRIBUTES/table-values": "float32",
        "v/.ATTRIBUTES/VARIABLE_VALUE": "float16",
    }
    # TensorFlow restores it into a float16 variable beside the float32 table.
    restored = tf.lookup.experimental.MutableHashTable(tf.string, tf.float32, default_value=-1.0)
    v = tf.Variable(tf.zeros([2], tf.float16))
    tf.train.Checkpoint(v=v, table=restored).read(str(tmp_path / "half")).assert_consumed()
    assert v.dtype == tf.float16 and v.numpy().tolist() == [1.0, 2.0]
    assert restored.lookup(tf.constant(["b", "a", "c"])).numpy().tolist() == [2.5, 1.5, -1.0]
    # A rule naming the table casts it on purpose.
    args = ["--dtype", "float16", "--dtype-rule", "table-values$=float16"]
    rc, _, err = in_process("convert", *args, saved, tmp_path / "all")
    assert rc == 0, err
    assert _dtypes(tmp_path / "all")["table/.ATTRIBUTES/table-values"] == "float16"


def _tf1_graph(w_dtype):
    w = tf.compat.v1.get_variable("w", initializer=np.array([1.0, 2.0], w_dtype))
    table = tf.lookup.experimental.MutableHashTable(
        tf.string, tf.float32, default_value=-1.0, name="tbl"
    )
    return w, table


def test_cast_keeps_tf1_lookup_table(tmp_path):
    with tf.Graph().as_default():
        _, table = _tf1_graph(np.float32)
        insert = table.insert(tf.constant(["a", "b"]), tf.constant([1.5, 2.5]))
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), insert])
            saved = saver.save(sess, str(tmp_path / "src" / "model.ckpt"), write_meta_graph=False)
    assert {"tbl-keys", "tbl-values", "w"} <= set(_dtypes(saved))
    rc, _, err = in_process("convert", "--dtype", "float16", saved, tmp_path / "half")
    assert rc == 0, err
    got = _dtypes(tmp_path / "half")
    assert (got["w"], got["tbl-keys"], got["tbl-values"]) == ("float16", "string", "float32")
    with tf.Graph().as_default():
        w, table = _tf1_graph(np.float16)
        lookup = table.lookup(tf.constant(["b", "a", "c"]))
        with tf.compat.v1.Session() as sess:
            tf.compat.v1.train.Saver().restore(sess, str(tmp_path / "half"))
            assert sess.run(w).tolist() == [1.0, 2.0]
            assert sess.run(lookup).tolist() == [2.5, 1.5, -1.0]
    rc, _, err = in_process(
        "convert", "--dtype", "float16", "--dtype-rule", "^tbl-=float16", saved, tmp_path / "all"
    )
    assert rc == 0, err
    assert _dtypes(tmp_path / "all")["tbl-values"] == "float16"


def test_average_cast_keeps_tf2_lookup_table(tmp_path):
    table = tf.lookup.experimental.MutableHashTable(tf.string, tf.float32, default_value=-1.0)
    table.insert(tf.constant(["a"]), tf.constant([1.5]))
    v = tf.Variable([1.0, 2.0])
    ckpt = tf.train.Checkpoint(v=v, table=table)
    first = ckpt.write(str(tmp_path / "run" / "ckpt-1"))
    v.assign([3.0, 4.0])
    second = ckpt.write(str(tmp_path / "run" / "ckpt-2"))
    rc, _, err = in_process("average", "--dtype", "float16", first, second, "-o", tmp_path / "avg")
    assert rc == 0, err
    got = _dtypes(tmp_path / "avg")
    assert got["table/.ATTRIBUTES/table-values"] == "float32"
    assert got["v/.ATTRIBUTES/VARIABLE_VALUE"] == "float16"
    restored = tf.lookup.experimental.MutableHashTable(tf.string, tf.float32, default_value=-1.0)
    half = tf.Variable(tf.zeros([2], tf.float16))
    tf.train.Checkpoint(v=half, table=restored).read(str(tmp_path / "avg")).assert_consumed()
    assert half.numpy().tolist() == [2.0, 3.0]
    assert restored.lookup(tf.constant(["a"])).numpy().tolist() == [1.5]


def test_dry_run_says_whether_the_graph_is_copied_or_rewritten(tmp_path):
    saved = tf.train.Checkpoint(v=tf.Variable([1.0, 2.0])).write(str(tmp_path / "tf" / "ckpt"))
    rc, out, err = in_process("convert", "--dry-run", "--dtype", "float16", saved, tmp_path / "h")
    assert rc == 0, err
    assert out.rstrip().endswith("object graph copied"), out
    rc, out, err = in_process("rename", "--dry-run", "--map", "v/=w/", saved, tmp_path / "r")
    assert rc == 0, err
    assert out.rstrip().endswith("object graph rewritten"), out
    rc, out, err = in_process("convert", "--dry-run", "--json", saved, tmp_path / "h")
    assert rc == 0, err
    assert json.loads(out)["object_graph_copied"] is True


def test_average_copies_lookup_tables_from_the_newest(tmp_path):
    # A table's values line up with its keys, whose order differs between saves: the
    # mean of two tables' values is no table. Keys and values come from the newest.
    table = tf.lookup.experimental.MutableHashTable(tf.string, tf.float32, default_value=-1.0)
    v = tf.Variable([1.0, 2.0])
    ckpt = tf.train.Checkpoint(v=v, table=table)
    table.insert(tf.constant(["a", "b"]), tf.constant([1.0, 2.0]))
    first = ckpt.write(str(tmp_path / "run" / "ckpt-1"))
    table.remove(tf.constant(["a", "b"]))
    table.insert(tf.constant(["c", "b", "a"]), tf.constant([30.0, 20.0, 10.0]))
    v.assign([3.0, 4.0])
    second = ckpt.write(str(tmp_path / "run" / "ckpt-2"))
    rc, _, err = in_process("average", first, second, "-o", tmp_path / "avg")
    assert rc == 0, err
    newest = tf.train.load_checkpoint(second)
    got = tf.train.load_checkpoint(str(tmp_path / "avg"))
    for key in ("table/.ATTRIBUTES/table-keys", "table/.ATTRIBUTES/table-values"):
        assert got.get_tensor(key).tolist() == newest.get_tensor(key).tolist()
    restored = tf.lookup.experimental.MutableHashTable(tf.string, tf.float32, default_value=-1.0)
    mean = tf.Variable(tf.zeros([2]))
    tf.train.Checkpoint(v=mean, table=restored).read(str(tmp_path / "avg")).assert_consumed()
    assert mean.numpy().tolist() == [2.0, 3.0]
    assert restored.lookup(tf.constant(["a", "b", "c"])).numpy().tolist() == [10.0, 20.0, 30.0]


def test_average_copies_tf1_lookup_tables_from_the_newest(tmp_path):
    v1 = tf.compat.v1
    saved = []
    for step, (keys, values) in enumerate([(["a", "b"], [1.0, 2.0]), (["b", "a"], [20.0, 10.0])]):
        with tf.Graph().as_default(), v1.Session() as sess:
            table = v1.lookup.experimental.MutableHashTable(
                tf.string, tf.float32, default_value=-1.0, name="vocab"
            )
            var = v1.get_variable("w", initializer=tf.constant([1.0 + 2 * step, 2.0 + 2 * step]))
            sess.run([var.initializer, table.insert(tf.constant(keys), tf.constant(values))])
            saved.append(
                v1.train.Saver().save(
                    sess, str(tmp_path / "tf1" / f"m-{step}"), write_meta_graph=False
                )
            )
    rc, _, err = in_process("average", *saved, "-o", tmp_path / "avg")
    assert rc == 0, err
    got = tf.train.load_checkpoint(str(tmp_path / "avg"))
    newest = tf.train.load_checkpoint(saved[-1])
    for key in ("vocab-keys", "vocab-values"):
        assert got.get_tensor(key).tolist() == newest.get_tensor(key).tolist()
    assert got.get_tensor("w").tolist() == [2.0, 3.0]
