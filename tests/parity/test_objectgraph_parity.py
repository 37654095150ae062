"""TF2 objects TensorFlow saves as several tensors, through every command, restored by TensorFlow.

A ``tf.lookup.experimental.MutableHashTable`` is one attribute of the object graph,
``table/.ATTRIBUTES/table``, stored as the tensors ``...table-keys`` and
``...table-values``; a ``tf.data`` iterator is the attribute ``.../ITERATOR``, stored as
``.../ITERATOR_STATE``. TensorFlow writes these checkpoints here, tfckpt verifies,
dumps, selects, renames and merges them, and TensorFlow restores the results into fresh
objects.
"""

from __future__ import annotations

import json

import pytest

tf = pytest.importorskip("tensorflow")

import cli_helpers as ch  # noqa: E402
import transform_helpers as th  # noqa: E402

import tfckpt  # noqa: E402
from tfckpt import inspection as tfinspect  # noqa: E402

KEYS = [b"alpha", b"beta", b"gamma", b"delta"]
VALUES = [11, -7, 2**40, 0]
TABLE = "table/.ATTRIBUTES/table"
ITERATOR = "it/.ATTRIBUTES/ITERATOR"


def new_table():
    return tf.lookup.experimental.MutableHashTable(tf.string, tf.int64, default_value=-1)


def lookups(table) -> list[int]:
    return table.lookup(tf.constant(KEYS + [b"absent"])).numpy().tolist()


def new_iterator():
    return iter(tf.data.Dataset.range(10, 30))


def filled_table():
    t = new_table()
    t.insert(tf.constant(KEYS), tf.constant(VALUES, tf.int64))
    return t


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """TF-written checkpoints: table + variable, table only, variable only, iterator + all."""
    d = tmp_path_factory.mktemp("multi_tensor")
    v = tf.Variable([1.5, -2.25, 3.0])
    out = {
        "table_var": tf.train.Checkpoint(table=filled_table(), v=v).save(str(d / "tv" / "ckpt")),
        "table": tf.train.Checkpoint(table=filled_table()).save(str(d / "t" / "ckpt")),
        "var": tf.train.Checkpoint(v=tf.Variable([4.0, 5.0, 6.0])).save(str(d / "v" / "ckpt")),
    }
    it = new_iterator()
    for _ in range(3):
        next(it)  # the restored iterator must continue at 13
    out["iterator"] = tf.train.Checkpoint(it=it, table=filled_table(), v=v).save(
        str(d / "it" / "ckpt")
    )
    return out


def restore(prefix, **objects):
    status = tf.train.Checkpoint(**objects).restore(str(prefix))
    status.assert_existing_objects_matched()
    return status


def graph_of(prefix):
    return th.tf_object_graph(str(prefix))


def attribute_keys(prefix) -> set[str]:
    return {a.checkpoint_key for n in graph_of(prefix).nodes for a in n.attributes}


def cli_json(*args):
    proc = ch.run_text(*args, "--json")
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


# ---------------------------------------------------------------- verify and dump


def test_verify_accepts_the_tensors_of_an_attribute(written):
    names = {n for n, _ in tf.train.list_variables(written["iterator"])}
    assert {TABLE + "-keys", TABLE + "-values", ITERATOR + "_STATE"} <= names
    assert {TABLE, ITERATOR} <= attribute_keys(written["iterator"])
    assert not {TABLE, ITERATOR} & names
    proc = ch.run_text("verify", written["table_var"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok: ")
    # The iterator's variant state aside, no object-graph problem either.
    report = tfinspect.verify(written["iterator"])
    assert not [p for p in report["problems"] if "object graph" in p], report["problems"]


def test_verify_still_reports_a_missing_tensor(written, tmp_path):
    with tfckpt.open(written["table_var"]) as ckpt:
        tensors = {k: ckpt[k] for k in ckpt.keys() if k != TABLE + "-values"}
    damaged = tmp_path / "damaged"
    tfckpt.save(tensors, damaged)
    rc, data = cli_json("verify", damaged)
    assert rc == 1
    assert data["problems"] == [
        f"{damaged}: the object graph names {TABLE + '-values'!r}, which the checkpoint lacks"
    ]
    proc = ch.run_text("rename", damaged, tmp_path / "out", "--map", "table/=lookup/")
    ch.assert_cli_error(proc, TABLE + "-values")


def test_dump_object_graph_shows_every_tensor_of_the_attribute(written):
    prefix = written["iterator"]
    reader = tf.train.load_checkpoint(prefix)
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    _, data = cli_json("dump", prefix, "--object-graph")
    attrs = {a["checkpoint_key"]: a for n in data["nodes"] for a in n["attributes"]}
    for key, suffixes in ((TABLE, ("-keys", "-values")), (ITERATOR, ("_STATE",))):
        assert [t["name"] for t in attrs[key]["tensors"]] == [key + s for s in suffixes]
        for t in attrs[key]["tensors"]:
            assert (t["dtype"], t["shape"]) == (dtypes[t["name"]].name, shapes[t["name"]])
        assert attrs[key]["dtype"] is None
    v = attrs["v/.ATTRIBUTES/VARIABLE_VALUE"]
    assert v["tensors"] == [{"name": v["checkpoint_key"], "dtype": "float32", "shape": [3]}]
    text = ch.run_text("dump", prefix, "--object-graph").stdout
    assert f"  [table] {TABLE}  2 tensors\n" in text
    assert f"      {TABLE}-keys  string [4]\n      {TABLE}-values  int64 [4]\n" in text
    state = ",".join(map(str, shapes[ITERATOR + "_STATE"]))
    assert f"      {ITERATOR}_STATE  variant [{state}]\n" in text
    assert "MISSING" not in text


# ---------------------------------------------------------------- rewrites restored by TF


def test_rename_rekeys_the_attribute_and_all_its_tensors(written, tmp_path):
    out = tmp_path / "renamed"
    proc = ch.run_text(
        "rename", written["table_var"], out, "--map", "table/=lookup/", "--map", "v/=weights/"
    )
    assert proc.returncode == 0, proc.stderr
    names = {n for n, _ in tf.train.list_variables(str(out))}
    assert {"lookup/.ATTRIBUTES/table-keys", "lookup/.ATTRIBUTES/table-values"} <= names
    assert not any(n.startswith("table/") for n in names)
    assert "lookup/.ATTRIBUTES/table" in attribute_keys(out)
    t, v = new_table(), tf.Variable([0.0, 0.0, 0.0])
    restore(out, table=t, v=v)
    assert lookups(t) == VALUES + [-1]
    assert v.numpy().tolist() == [1.5, -2.25, 3.0]


def test_rename_that_would_split_an_attribute_is_refused(written, tmp_path):
    proc = ch.run_text(
        "rename",
        written["table_var"],
        tmp_path / "out",
        "--map",
        "table/.ATTRIBUTES/table-keys=keys",
    )
    ch.assert_cli_error(proc, TABLE, "renamed alike")
    assert not (tmp_path / "out").exists()


def test_drop_object_drops_every_tensor_of_the_object(written, tmp_path):
    out = tmp_path / "no_table"
    proc = ch.run_text("select", written["table_var"], out, "--drop-object", "table")
    assert proc.returncode == 0, proc.stderr
    names = {n for n, _ in tf.train.list_variables(str(out))}
    assert not any(n.startswith("table/") for n in names), names
    v = tf.Variable([0.0, 0.0, 0.0])
    restore(out, v=v)
    assert v.numpy().tolist() == [1.5, -2.25, 3.0]
    assert tfinspect.verify(str(out))["problems"] == []


def test_keeping_an_object_keeps_every_tensor_of_it(written, tmp_path):
    out = tmp_path / "only_table"
    proc = ch.run_text("select", written["table_var"], out, "--drop-object", "v")
    assert proc.returncode == 0, proc.stderr
    t = new_table()
    restore(out, table=t)
    assert lookups(t) == VALUES + [-1]


def test_excluding_one_tensor_drops_the_whole_attribute(written, tmp_path):
    out = tmp_path / "partial"
    _, data = cli_json("select", written["table_var"], out, "--exclude", "table-keys$", "--dry-run")
    reasons = {d["name"]: d["reason"] for d in data["dropped"]}
    assert reasons == {
        TABLE + "-keys": "excluded",
        TABLE + "-values": f"its attribute {TABLE!r} is not kept whole",
    }
    assert (
        ch.run_text("select", written["table_var"], out, "--exclude", "table-keys$").returncode == 0
    )
    assert TABLE not in attribute_keys(out)
    assert tfinspect.verify(str(out))["problems"] == []


def test_merge_joins_a_table_and_a_variable(written, tmp_path):
    out = tmp_path / "merged"
    proc = ch.run_text("merge", written["table"], written["var"], "-o", out)
    assert proc.returncode == 0, proc.stderr
    t, v = new_table(), tf.Variable([0.0, 0.0, 0.0])
    restore(out, table=t, v=v)
    assert lookups(t) == VALUES + [-1]
    assert v.numpy().tolist() == [4.0, 5.0, 6.0]


def test_plans_with_an_iterator_keep_its_state(written, tmp_path):
    """From the indexes alone: every command plans the iterator's state with its attribute."""
    src = written["iterator"]
    p = tfckpt.plan(src, tmp_path / "r", rename={"it/": "iterator/"})
    new = {t.name: t.new_name for t in p.tensors}
    assert new[ITERATOR + "_STATE"] == "iterator/.ATTRIBUTES/ITERATOR_STATE"
    graph = type(graph_of(src)).FromString(p.object_graph)
    keys = {a.checkpoint_key for n in graph.nodes for a in n.attributes}
    assert "iterator/.ATTRIBUTES/ITERATOR" in keys and TABLE in keys
    p = tfckpt.plan(src, tmp_path / "s", drop_objects=["it"])
    assert ITERATOR + "_STATE" not in {t.name for t in p.tensors}
    assert [(n, r) for _, n, r in p.dropped] == [(ITERATOR + "_STATE", "object 'it' dropped")]
    p = tfckpt.plan([src, written["var"]], tmp_path / "m", drop_objects=["v"])
    assert {ITERATOR + "_STATE", TABLE + "-keys", TABLE + "-values"} <= {t.name for t in p.tensors}


def _reads_variants(prefix: str) -> bool:
    with tfckpt.open(prefix) as ckpt:
        try:
            ckpt.read_bytes(ITERATOR + "_STATE")
        except tfckpt.CorruptCheckpointError:
            return False
    return True


def test_iterator_continues_after_every_rewrite(written, tmp_path):
    src = written["iterator"]
    if not _reads_variants(src):
        pytest.skip("this build of tfckpt cannot read TensorFlow's variant tensors")
    assert ch.run_text("verify", src).returncode == 0
    runs = [
        (
            tmp_path / "r",
            ("rename", src, tmp_path / "r", "--map", "it/=iterator/", "--map", "table/=lookup/"),
        ),
        (tmp_path / "s", ("select", src, tmp_path / "s", "--drop-object", "v")),
        (tmp_path / "m", ("merge", src, written["var"], "-o", tmp_path / "m", "--prefer", "first")),
    ]
    for out, argv in runs:
        proc = ch.run_text(*argv)
        assert proc.returncode == 0, (argv, proc.stderr)
        it, t = new_iterator(), new_table()
        restore(out, it=it, table=t)
        assert [int(next(it)) for _ in range(3)] == [13, 14, 15], argv
        assert lookups(t) == VALUES + [-1], argv
        assert ch.run_text("verify", out).returncode == 0, argv


def test_slots_of_a_variable_deeper_than_its_optimizer_survive_a_rewrite(tmp_path):
    """An optimizer tracked before the model it trains: the slot variables hang off a
    variable found later in the walk, and a rewrite keeps them (TF restores them)."""
    tf.compat.v1.enable_resource_variables()
    model = tf.Module()
    model.inner = tf.Module()
    model.inner.v = tf.Variable([1.0, 2.0, 3.0])
    opt = tf.compat.v1.train.AdamOptimizer(0.1)
    opt.minimize(lambda: tf.reduce_sum(model.inner.v**2), var_list=[model.inner.v])
    src = tf.train.Checkpoint(a_opt=opt, model=model).save(str(tmp_path / "src" / "ckpt"))
    dst = str(tmp_path / "out" / "ckpt")
    tfckpt.select(src, dst, drop_objects=["save_counter"])
    with tfckpt.open(src) as a, tfckpt.open(dst) as b:
        slots = [k for k in a.keys() if ".OPTIMIZER_SLOT" in k]
        assert len(slots) == 2 and all(k in b for k in slots)

    fresh = tf.Module()
    fresh.inner = tf.Module()
    fresh.inner.v = tf.Variable([0.0, 0.0, 0.0])
    fresh_opt = tf.compat.v1.train.AdamOptimizer(0.1)
    fresh_opt.minimize(lambda: tf.reduce_sum(fresh.inner.v**2), var_list=[fresh.inner.v])
    for var in fresh_opt.variables():
        var.assign(tf.zeros_like(var))
    tf.train.Checkpoint(a_opt=fresh_opt, model=fresh).read(dst).assert_existing_objects_matched()
    for name in ("m", "v"):
        ours = fresh_opt.get_slot(fresh.inner.v, name).numpy()
        theirs = opt.get_slot(model.inner.v, name).numpy()
        assert ours.tolist() == theirs.tolist() and ours.any()
