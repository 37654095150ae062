"""``tfckpt dump GRAPH.meta`` and ``saved_model.pb``: what TensorFlow wrote, listed as
TensorFlow itself lists it after ``import_meta_graph``; hostile graph files refused in one
line."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("tensorflow")

import graph_files as gf  # noqa: E402
from cli_helpers import assert_cli_error, in_process, run_text  # noqa: E402

from tfckpt._proto.meta_graph_pb2 import MetaGraphDef, NodeDef  # noqa: E402
from tfckpt.format.metagraph import MAX_FILE_BYTES  # noqa: E402

GRAPHS = {
    "resource-V2": {"resource": True, "version": "V2"},
    "reference-V1-sharded": {"resource": False, "version": "V1", "sharded": True},
    "reference-V2": {"resource": False, "version": "V2"},
}


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    root = tmp_path_factory.mktemp("graphs")
    out = {}
    for name, kw in GRAPHS.items():
        files = gf.tf1_graph(root / name, **kw)
        out[name] = {**files, "tf": gf.tf_account(files["meta"])}
    saved = gf.tf1_saved_model(root / "saved_model")
    out["saved_model"] = {"dir": saved, "signatures": gf.saved_model_signatures(saved)}
    return out


def dump(path) -> dict:
    rc, out, err = in_process("dump", "--json", path)
    assert rc == 0 and not err, err
    return json.loads(out)


@pytest.mark.parametrize("name", list(GRAPHS))
def test_dump_lists_what_tensorflow_reports(graphs, name):
    case = graphs[name]
    tf_says = case["tf"]
    data = dump(case["meta"])
    listed = [v for v in data["variables"] if "variables" in v["collections"]]
    assert [{k: v[k] for k in ("name", "dtype", "shape")} for v in listed] == tf_says["variables"]
    assert [v["name"] for v in data["variables"] if v["trainable"]] == tf_says["trainable"]
    local = [v["name"] for v in data["variables"] if "local_variables" in v["collections"]]
    assert local == tf_says["local"]
    partitions = {v["name"]: v["partition"] for v in data["variables"] if v["partition"]}
    assert partitions == tf_says["partitions"]
    assert all(v["resource"] is GRAPHS[name]["resource"] for v in data["variables"]), data[
        "variables"
    ]
    saver = {k: data["saver"][k] for k in tf_says["saver"]}
    assert saver == tf_says["saver"]
    collections = {c["name"]: c for c in data["collections"]}
    assert sorted(collections) == tf_says["collections"]
    assert collections["outputs"]["items"] == tf_says["outputs"]
    assert collections["sizes"]["items"] == tf_says["sizes"]
    assert collections["rates"]["items"] == tf_says["rates"]
    assert collections["variables"]["count"] == len(tf_says["variables"])
    assert data["placeholders"] == tf_says["placeholders"]
    assert data["signatures"] == []


@pytest.mark.parametrize("name", list(GRAPHS))
def test_what_the_saver_restores_is_what_it_saved(graphs, name):
    """The Saver's restore ops read exactly the checkpoint's tensors, each partition its
    own slice, in the dtypes the checkpoint holds."""
    case = graphs[name]
    restores = dump(case["meta"])["saver"]["restores"]
    stored = dump(case["prefix"])["tensors"]
    assert {r["key"] for r in restores} == {t["name"] for t in stored}
    dtypes = {t["name"]: t["dtype"] for t in stored}
    assert all(r["dtype"] == dtypes[r["key"]] for r in restores)
    partitions = {v["name"]: v["partition"] for v in dump(case["meta"])["variables"]}
    for r in restores:
        part = partitions[r["variable"]]
        if part is None:
            assert r["slice"] is None and r["key"] == r["variable"]
        else:
            assert r["key"] == part["full_name"] and r["full_shape"] == part["full_shape"]
            want = ",".join(f"{o}:{o + n}" for o, n in zip(part["offset"], part["shape"]))
            assert r["slice"] == want
    # Reference variables' assignments check shapes; resource variables' do not.
    assert {r["validate_shape"] for r in restores} == {not GRAPHS[name]["resource"]}


@pytest.fixture(scope="module")
def saverless(graphs, tmp_path_factory):
    """Graph files without a saver_def: TensorFlow's own with it cleared (their save and
    restore ops left in the graph), and graphs exported before any Saver existed."""
    root = tmp_path_factory.mktemp("saverless")
    out = {}
    for name in ("resource-V2", "reference-V2"):
        out[f"{name} stripped"] = gf.strip_saver(graphs[name]["meta"], str(root / f"{name}.meta"))
    for resource in (True, False):
        files = gf.tf1_graph_without_saver(root / f"never-{resource}", resource=resource)
        out[f"{'resource' if resource else 'reference'} never saved"] = files["meta"]
    return out


def test_without_a_saver_def_the_default_saver_of_import_meta_graph(saverless, tmp_path):
    """What ``import_meta_graph`` restores a graph without a saver_def with: the Saver it
    builds, written out by TensorFlow with its restore ops, restores what dump lists."""
    for name, meta in saverless.items():
        data = dump(meta)
        built = dump(gf.default_saver_meta(meta, str(tmp_path / "built.meta")))["saver"]
        saver = data["saver"]
        assert saver["default"] is True and data["no_saver"] is None, name
        assert built["default"] is False
        same = ("version", "sharded", "max_to_keep", "keep_checkpoint_every_n_hours")
        assert {k: saver[k] for k in same} == {k: built[k] for k in same}, name
        assert saver["restore_op"] is None and built["restore_op"], name

        def order(r):
            return r["key"], r["slice"] or ""

        assert sorted(saver["restores"], key=order) == sorted(built["restores"], key=order), name
        # Local variables are not restored; every global one is, partitions as slices.
        assert {r["variable"] for r in saver["restores"]} == {
            v["name"] for v in data["variables"] if "variables" in v["collections"]
        }
    rc, out, err = in_process("dump", saverless["resource never saved"])
    assert rc == 0 and "no saver_def: the default Saver import_meta_graph builds" in out, out


def test_saved_model_signatures_as_the_loader_gives_them(graphs):
    case = graphs["saved_model"]
    data = dump(os.path.join(case["dir"], "saved_model.pb"))
    (graph,) = data["meta_graphs"]
    assert graph["tags"] == ["serve"]
    signatures = {
        s["key"]: {k: s[k] for k in ("method_name", "inputs", "outputs")}
        for s in graph["signatures"]
    }
    assert signatures == case["signatures"]
    assert graph["saver"]["version"] == "V2"


def test_dump_text_names_each_part(graphs):
    rc, out, err = in_process("dump", graphs["resource-V2"]["meta"])
    assert rc == 0 and not err
    for fragment in (
        "emb/part_1",
        "of emb [10,4] at [4,0]",
        "saver       V2, max_to_keep 3: restores 7 values",
        "save/restore_all",
        "sizes",
        "<unknown rank>",
    ):
        assert fragment in out, (fragment, out)
    assert_cli_error(
        in_process("dump", graphs["resource-V2"]["meta"], "--tensor", "emb"),
        "holds no values",
    )
    # Other commands still say what a .meta is.
    assert_cli_error(
        in_process("stats", graphs["resource-V2"]["meta"]), "MetaGraphDef", "tfckpt dump"
    )


# --- hostile graph files ---------------------------------------------------------------------


def _graph(*nodes: NodeDef) -> MetaGraphDef:
    mg = MetaGraphDef()
    mg.graph_def.node.extend(nodes)
    return mg


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field, encoded by hand."""

    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                return bytes(out)

    return varint(number << 3 | 2) + varint(len(payload)) + payload


def _nested_attr(depth: int) -> bytes:
    """A graph whose one attribute nests ``depth`` levels (AttrValue → func → attr → ...),
    encoded by hand: protobuf itself refuses to build it."""
    value = b"\x18\x01"  # AttrValue { i: 1 }
    for _ in range(depth):
        entry = _field(1, b"a") + _field(2, value)  # map entry: key, value
        value = _field(10, _field(1, b"f") + _field(2, entry))  # AttrValue { func {...} }
    node = (
        _field(1, b"deep") + _field(2, b"Const") + _field(5, _field(1, b"value") + _field(2, value))
    )
    return _field(2, _field(1, node))  # MetaGraphDef { graph_def { node } }


def _hostile(tmp_path) -> dict[str, tuple[bytes, str]]:
    good = _graph(NodeDef(name="x", op="Placeholder")).SerializeToString()
    bad_shape = NodeDef(name="v", op="VarHandleOp")
    bad_shape.attr["shape"].i = 3  # an int where a shape belongs
    bad_dtype = NodeDef(name="p", op="Placeholder")
    bad_dtype.attr["dtype"].type = 4000  # type: ignore[assignment]
    deep_shape = NodeDef(name="q", op="Placeholder")
    deep_shape.attr["shape"].shape.dim.add().size = -7
    many_dims = NodeDef(name="r", op="Placeholder")
    for _ in range(300):
        many_dims.attr["shape"].shape.dim.add().size = 1
    no_restore = MetaGraphDef()
    no_restore.saver_def.restore_op_name = "save/restore_all"
    no_restore.graph_def.node.add(name="other", op="NoOp")
    return {
        "empty": (b"", "empty"),
        "truncated": (good[:-3], "not a MetaGraphDef"),
        "random": (os.urandom(4096), ""),
        "text": (b"this is not a graph\n" * 20, ""),
        "wrong kind of attribute": (_graph(bad_shape).SerializeToString(), "'shape'"),
        "unknown dtype": (_graph(bad_dtype).SerializeToString(), "DataType"),
        "negative dimension": (_graph(deep_shape).SerializeToString(), "dimension"),
        "rank above 254": (_graph(many_dims).SerializeToString(), "rank 300"),
        "nested past protobuf's limit": (_nested_attr(200), "not a MetaGraphDef"),
        "restore op not in the graph": (no_restore.SerializeToString(), "restore op"),
        "not utf-8 in a name": (
            _graph(NodeDef(name="x", op="Placeholder")).SerializeToString().replace(b"x", b"\xff"),
            "not a MetaGraphDef",
        ),
    }


def test_hostile_graph_files_are_one_line_errors(tmp_path):
    for what, (data, fragment) in _hostile(tmp_path).items():
        path = tmp_path / f"{what.replace(' ', '_')}.meta"
        path.write_bytes(data)
        result = in_process("dump", path)
        if what in ("random", "text") and result[0] == 0:
            continue  # bytes that happen to parse as a (meaningless) graph are listed
        line = assert_cli_error(result, str(path), fragment)
        assert what == "empty" or "tfckpt: error:" in line, (what, line)
        assert_cli_error(in_process("check", path, "--against", path), str(path))


def test_huge_repeated_fields_parse_in_linear_time(tmp_path):
    """Two million packed dimensions and a million nodes: parsed and listed in seconds."""
    mg = MetaGraphDef()
    big = NodeDef(name="big", op="Const")
    big.attr["value"].list.i.extend(range(2_000_000))
    mg.graph_def.node.append(big)
    mg.graph_def.node.extend(NodeDef(name=f"n{i}", op="NoOp") for i in range(200_000))
    path = tmp_path / "big.meta"
    path.write_bytes(mg.SerializeToString())
    data = dump(path)
    assert data["nodes"] == 200_001 and data["variables"] == []


def test_a_file_above_protobufs_limit_is_refused_before_reading(tmp_path):
    path = tmp_path / "huge.meta"
    with open(path, "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: nothing is written
    assert_cli_error(in_process("dump", path), str(path), "protobuf's limit")


def test_hostile_graph_through_a_real_process(tmp_path):
    path = tmp_path / "cut.meta"
    path.write_bytes(_graph(NodeDef(name="x", op="Placeholder")).SerializeToString()[:7])
    assert_cli_error(run_text("dump", path), "not a MetaGraphDef")
