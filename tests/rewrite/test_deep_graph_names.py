"""flatten, graft and export of hostile TF2 object graphs, hand-built around the attributes
of a checkpoint TensorFlow wrote: flat names are built only for tensors, and never without
bound (a chain 10 000 objects deep stays small; slot paths that double are errors).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from cli_helpers import assert_cli_error, in_process  # noqa: E402

import tfckpt  # noqa: E402


@pytest.fixture(scope="module")
def tf2_base(tmp_path_factory):
    """A TF2 checkpoint TensorFlow wrote: its tensors and its variable's attribute."""
    from tfckpt._proto.trackable_object_graph_pb2 import TrackableObjectGraph
    from tfckpt.format.objectgraph import OBJECT_GRAPH_KEY

    d = tmp_path_factory.mktemp("tf2_base")
    prefix = tf.train.Checkpoint(v=tf.Variable([1.0, 2.0])).save(str(d / "ckpt"))
    with tfckpt.open(prefix) as ckpt:
        tensors = {k: ckpt[k] for k in ckpt.keys()}
    graph = TrackableObjectGraph.FromString(tensors[OBJECT_GRAPH_KEY].item())
    (attr,) = [a for n in graph.nodes for a in n.attributes if a.checkpoint_key.startswith("v/")]
    return {"prefix": prefix, "dir": d, "tensors": tensors, "attr": attr}


def _hostile(base, name: str, shape: str, n: int) -> str:
    """``chain``: the variable n objects deep; ``doubling``: the variable the last of n
    slot variables, each the slot of the one before, whose paths double at each."""
    from tfckpt._proto.trackable_object_graph_pb2 import TrackableObjectGraph
    from tfckpt.format.objectgraph import OBJECT_GRAPH_KEY

    g = TrackableObjectGraph()
    for _ in range(n + 2):
        g.nodes.add()
    if shape == "chain":
        for k in range(n + 1):
            ref = g.nodes[k].children.add()
            ref.node_id, ref.local_name = k + 1, "c"
    else:
        ref = g.nodes[0].children.add()
        ref.node_id, ref.local_name = 1, "v"
        for k in range(1, n + 1):
            s = g.nodes[k].slot_variables.add()
            s.original_variable_node_id, s.slot_variable_node_id, s.slot_name = k, k + 1, "m"
    g.nodes[n + 1].attributes.add().CopyFrom(base["attr"])
    raw = np.array(g.SerializeToString(), dtype=object)
    tensors = {
        k: v for k, v in base["tensors"].items() if k.startswith("v/") or k == OBJECT_GRAPH_KEY
    }
    prefix = str(base["dir"] / name)
    tfckpt.save({**tensors, OBJECT_GRAPH_KEY: raw}, prefix, overwrite=True)
    return prefix


def test_flatten_graft_export_of_a_deep_chain_stay_small(tf2_base, tmp_path):
    import tracemalloc

    prefix = _hostile(tf2_base, "chain", "chain", 10_000)
    tracemalloc.start()
    try:
        tfckpt.flatten(prefix, str(tmp_path / "flat"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak  # the 10 000 paths above it would be 100 MB
    with tfckpt.open(str(tmp_path / "flat")) as ckpt:
        (name,) = ckpt.keys()
        assert name == "/".join(["c"] * 10_001)
    tfckpt.graft(prefix, [str(tmp_path / "flat")], str(tmp_path / "back"))
    with tfckpt.open(str(tmp_path / "back")) as ckpt:
        assert ckpt["v/.ATTRIBUTES/VARIABLE_VALUE"].tolist() == [1.0, 2.0]
    safetensors = pytest.importorskip("safetensors.numpy")
    tracemalloc.start()
    try:
        tfckpt.export(prefix, str(tmp_path / "model.safetensors"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak
    (name,) = safetensors.load_file(str(tmp_path / "model.safetensors"))
    assert name == "/".join(["c"] * 10_001)


def test_flatten_graft_export_of_doubling_slot_paths_are_errors(tf2_base, tmp_path):
    prefix = _hostile(tf2_base, "doubling", "doubling", 60)
    assert_cli_error(in_process("flatten", prefix, tmp_path / "flat"), prefix, "too long")
    assert_cli_error(
        in_process("graft", prefix, tf2_base["prefix"], "-o", tmp_path / "g", "--allow-missing"),
        prefix,
        "too long",
    )
    assert_cli_error(in_process("export", prefix, tmp_path / "m.safetensors"), prefix, "too long")
    assert os.listdir(tmp_path) == []
