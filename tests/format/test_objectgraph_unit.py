"""The TF2 object graph layer on its own, from hand-built TrackableObjectGraph protos.

No TensorFlow here: the graphs are shaped like the ones TensorFlow writes (Keras 3
tracking the model's variables again under the optimizer, slot variables, lookup
tables stored as several tensors) and every function of ``tfckpt.format.objectgraph`` is
checked on them, down to its limits. Parity with TensorFlow itself is in
test_objectgraph_parity.py.
"""

from __future__ import annotations

import re

import pytest

import tfckpt
from tfckpt._proto.trackable_object_graph_pb2 import TrackableObjectGraph
from tfckpt.format import objectgraph
from tfckpt.format.objectgraph import ObjectGraph

VALUE = ".ATTRIBUTES/VARIABLE_VALUE"


def build(nodes: list[dict]) -> TrackableObjectGraph:
    """``nodes[i]``: ``children`` [(local_name, id)], ``attrs`` [checkpoint_key],
    ``slots`` [(original_id, slot_name, slot_id)], ``has`` (has_checkpoint_values)."""
    proto = TrackableObjectGraph()
    for spec in nodes:
        node = proto.nodes.add()
        for name, node_id in spec.get("children", ()):
            node.children.add(local_name=name, node_id=node_id)
        for key in spec.get("attrs", ()):
            node.attributes.add(name="VARIABLE_VALUE", full_name=key, checkpoint_key=key)
        for original, slot_name, slot in spec.get("slots", ()):
            node.slot_variables.add(
                original_variable_node_id=original, slot_name=slot_name, slot_variable_node_id=slot
            )
        if "has" in spec:
            node.has_checkpoint_values.value = spec["has"]
    return proto


def parsed(nodes: list[dict]) -> ObjectGraph:
    return ObjectGraph.parse(build(nodes).SerializeToString(), path="/ckpt/model")


def keras_like() -> ObjectGraph:
    """root -> model -> _layers -> dense -> kernel, bias; root -> optimizer, which tracks
    the same kernel and bias again, nearer the root, as Keras 3 does; root -> step."""
    return parsed(
        [
            {"children": [("model", 1), ("optimizer", 2), ("step", 3)], "has": True},  # 0
            {"children": [("_layers", 4)], "has": True},  # 1 model
            {"children": [("_variables", 5), ("iterations", 8)], "has": True},  # 2 optimizer
            {"attrs": [f"step/{VALUE}"], "has": True},  # 3
            {"children": [("dense", 9)], "has": True},  # 4 model/_layers
            {"children": [("0", 6), ("1", 7)], "has": True},  # 5 optimizer/_variables
            {"attrs": [f"optimizer/_variables/0/{VALUE}"], "has": True},  # 6 kernel
            {"attrs": [f"optimizer/_variables/1/{VALUE}"], "has": True},  # 7 bias
            {"attrs": [f"optimizer/iterations/{VALUE}"], "has": True},  # 8
            {"children": [("kernel", 6), ("bias", 7)], "has": True},  # 9 dense
        ]
    )


SLOT_V = "v/.OPTIMIZER_SLOT/opt/m/" + VALUE
SLOT_W = "w/.OPTIMIZER_SLOT/opt/m/" + VALUE


def with_slots() -> ObjectGraph:
    """Variables v, w directly under the root, an optimizer holding an "m" slot of each."""
    return parsed(
        [
            {"children": [("v", 1), ("w", 2), ("opt", 3)]},
            {"attrs": [f"v/{VALUE}"]},
            {"attrs": [f"w/{VALUE}"]},
            {"children": [("iter", 4)], "slots": [(1, "m", 5), (2, "m", 6)]},
            {"attrs": [f"opt/iter/{VALUE}"]},
            {"attrs": [SLOT_V]},
            {"attrs": [SLOT_W]},
        ]
    )


def v1_adam() -> ObjectGraph:
    """What ``tf.train.Checkpoint(a_opt=tf.compat.v1.train.AdamOptimizer(), model=m)``
    writes for ``m.inner.v`` after one step: the optimizer comes first breadth-first,
    the variable it holds slots for only one level further down."""
    slot = "model/inner/v/.OPTIMIZER_SLOT/a_opt/{}/" + VALUE
    return parsed(
        [
            {"children": [("a_opt", 1), ("model", 2), ("save_counter", 3)]},
            {
                "children": [("beta1_power", 4), ("beta2_power", 5)],
                "slots": [(7, "m", 8), (7, "v", 9)],
            },
            {"children": [("inner", 6)]},
            {"attrs": [f"save_counter/{VALUE}"]},
            {"attrs": [f"a_opt/beta1_power/{VALUE}"]},
            {"attrs": [f"a_opt/beta2_power/{VALUE}"]},
            {"children": [("v", 7)]},
            {"attrs": [f"model/inner/v/{VALUE}"]},
            {"attrs": [slot.format("m")]},
            {"attrs": [slot.format("v")]},
        ]
    )


def paths_by_key(graph: ObjectGraph) -> dict[str, str]:
    paths = graph.paths()
    return {k: paths[i] for k, i in graph.checkpoint_keys().items()}


# --- parse -------------------------------------------------------------------------


def test_parse_round_trips():
    data = build([{"children": [("v", 1)]}, {"attrs": [f"v/{VALUE}"]}]).SerializeToString()
    graph = ObjectGraph.parse(data)
    assert graph.serialize() == data
    assert len(graph.nodes) == 2


@pytest.mark.parametrize(
    "data, fragment",
    [
        (b"\xff\xff\xff", "not a TrackableObjectGraph"),
        (b"", "no root node"),
        (
            build([{"children": [("v", 2)]}, {}]).SerializeToString(),
            "node 0 has child 'v' with node id 2, but there are 2 nodes",
        ),
        (
            build([{"slots": [(0, "m", 5)]}]).SerializeToString(),
            "slot variable 'm' referring to node 5",
        ),
    ],
)
def test_parse_refuses_broken_graphs(data, fragment):
    with pytest.raises(tfckpt.CorruptCheckpointError) as e:
        ObjectGraph.parse(data, path="/ckpt/model")
    assert fragment in str(e.value)
    assert "/ckpt/model" in str(e.value) and objectgraph.OBJECT_GRAPH_KEY in str(e.value)


def _graph_bytes(attributes: int) -> bytes:
    """One node with ``attributes`` empty attributes, encoded directly (fast at 500 000)."""

    def varint(n):
        out = bytearray()
        while n >= 0x80:
            out.append(n & 0x7F | 0x80)
            n >>= 7
        return bytes(out + bytes([n]))

    node = b"\x12\x00" * attributes  # field 2 (attributes), empty message
    return b"\x0a" + varint(len(node)) + node  # field 1 (nodes)


def test_element_limit_is_exact():
    at_limit = ObjectGraph.parse(_graph_bytes(objectgraph.MAX_ELEMENTS - 1))
    assert len(at_limit.nodes[0].attributes) == objectgraph.MAX_ELEMENTS - 1
    with pytest.raises(tfckpt.UnsupportedCheckpointError) as e:
        ObjectGraph.parse(_graph_bytes(objectgraph.MAX_ELEMENTS), path="/ckpt/model")
    assert f"more than {objectgraph.MAX_ELEMENTS} elements" in str(e.value)


# --- walking -----------------------------------------------------------------------


def test_reachable_is_breadth_first_and_skips_orphans_and_cycles():
    graph = parsed(
        [
            {"children": [("a", 1), ("b", 2)]},
            {"children": [("c", 3), ("back", 0)]},
            {"children": [("c_again", 3), ("self", 2)]},
            {},
            {"children": [("x", 1)]},  # not reachable from the root
        ]
    )
    assert graph.reachable() == [0, 1, 2, 3]


def test_paths_are_the_first_found_breadth_first():
    graph = keras_like()
    paths = graph.paths()
    assert paths[0] == ""
    assert paths[1] == "model" and paths[9] == "model/_layers/dense"
    # Depth 3 under the optimizer beats depth 4 under the model, as TensorFlow's keys say.
    assert paths[6] == "optimizer/_variables/0" and paths[7] == "optimizer/_variables/1"
    # Each path is the stem of the checkpoint key TensorFlow wrote for that node.
    for key, path in paths_by_key(graph).items():
        assert key == f"{path}/{VALUE}"
    slotted = with_slots()
    assert slotted.paths()[5] == "v/.OPTIMIZER_SLOT/opt/m"
    for key, path in paths_by_key(slotted).items():
        assert key == f"{path}/{VALUE}"


def test_slot_variable_needs_its_original_reached():
    graph = parsed(
        [
            {"children": [("opt", 1)]},
            {"slots": [(2, "m", 3)]},
            {"attrs": ["orphan"]},  # the original: no edge leads to it
            {"attrs": ["slot"]},
        ]
    )
    assert graph.reachable() == [0, 1]
    assert set(graph.paths()) == {0, 1}


def test_slot_variable_of_a_variable_reached_after_its_optimizer():
    graph = v1_adam()
    assert sorted(graph.reachable()) == list(range(10))
    assert graph.paths()[8] == "model/inner/v/.OPTIMIZER_SLOT/a_opt/m"
    # Cutting an unrelated object must not take the slots with it.
    assert graph.drop_objects(["save_counter"]) == {f"save_counter/{VALUE}"}
    assert len(graph.checkpoint_keys()) == 5


def test_long_paths_keep_their_end():
    names = [f"level{i:03d}" for i in range(200)]
    graph = parsed([{"children": [(n, i + 1)]} for i, n in enumerate(names)] + [{}])
    full = "/".join(names)
    paths = graph.paths(limit=100)
    assert len(paths[200]) == 100
    assert paths[200] == "…" + full[-99:]
    assert graph.paths()[200] == "…" + full[-(objectgraph.PATH_CHARS - 1) :]
    assert graph.paths(limit=len(full))[200] == full


def test_paths_escape_local_names_as_tensorflow_does():
    # TensorFlow escapes a local name before joining it into an object path: "." becomes
    # "..", "/" becomes ".S" (trackable_utils.escape_local_name).
    graph = parsed(
        [
            {"children": [("a/b", 1), ("x.y", 2)]},
            {"attrs": [f"a.Sb/{VALUE}"]},
            {"attrs": [f"x..y/{VALUE}"]},
        ]
    )
    for key, path in paths_by_key(graph).items():
        assert key == f"{path}/{VALUE}"


# --- keys and the tensors behind them ------------------------------------------------


def test_checkpoint_keys_name_their_nodes():
    keys = keras_like().checkpoint_keys()
    assert keys[f"step/{VALUE}"] == 3
    assert keys[f"optimizer/_variables/0/{VALUE}"] == 6
    assert len(keys) == 4


@pytest.mark.parametrize(
    "present, expected",
    [
        ({"t"}, ("t",)),
        ({"t", "t-keys", "t-values"}, ("t",)),  # the key itself wins over a suffix set
        ({"t-keys", "t-values"}, ("t-keys", "t-values")),
        ({"t-values"}, ("t-keys", "t-values")),  # a lone member claims the whole set
        ({"t_STATE"}, ("t_STATE",)),
        ({"t-keys", "t_STATE"}, ("t-keys", "t-values")),  # the first suffix set
        ({"t_other", "tt"}, ("t",)),  # only the known suffixes
        (set(), ("t",)),
    ],
)
def test_attribute_tensors(present, expected):
    assert objectgraph.attribute_tensors("t", present) == expected


def test_graph_attribute_tensors_and_missing_keys():
    graph = parsed(
        [
            {"children": [("table", 1), ("v", 2)]},
            {"attrs": ["table/.ATTRIBUTES/table"]},
            {"attrs": [f"v/{VALUE}"]},
        ]
    )
    present = {"table/.ATTRIBUTES/table-keys", f"v/{VALUE}"}
    assert graph.attribute_tensors(present) == {
        "table/.ATTRIBUTES/table": (
            "table/.ATTRIBUTES/table-keys",
            "table/.ATTRIBUTES/table-values",
        ),
        f"v/{VALUE}": (f"v/{VALUE}",),
    }
    assert graph.missing_keys(present) == ["table/.ATTRIBUTES/table-values"]
    assert graph.missing_keys(list(present) + ["table/.ATTRIBUTES/table-values"]) == []


def test_renamed_key_keeps_suffixes_alike():
    rename = {"t-keys": "u-keys", "t-values": "u-values"}
    assert objectgraph.renamed_key("t", ["t-keys", "t-values"], rename) == "u"
    assert objectgraph.renamed_key("t", ["t"], {"t": "w"}) == "w"
    for bad in (
        {"t-keys": "u-keys", "t-values": "w-values"},
        {"t-keys": "u-keys", "t-values": "u-vals"},
    ):
        with pytest.raises(tfckpt.CheckpointError) as e:
            objectgraph.renamed_key("t", ["t-keys", "t-values"], bad, path="/ckpt/model")
        assert "'t'" in str(e.value) and "/ckpt/model" in str(e.value)


def test_rekey():
    graph = keras_like()
    graph.rekey({f"step/{VALUE}": "global_step", "absent": "ignored"})
    keys = graph.checkpoint_keys()
    assert keys["global_step"] == 3 and f"step/{VALUE}" not in keys and len(keys) == 4
    with pytest.raises(tfckpt.CheckpointError) as e:
        graph.rekey({"global_step": "bad\udcff"})  # a name of bytes that are not UTF-8
    assert "UTF-8" in str(e.value) and "/ckpt/model" in str(e.value)


def test_drop_keys():
    graph = keras_like()
    graph.drop_keys([f"step/{VALUE}", "absent"])
    assert f"step/{VALUE}" not in graph.checkpoint_keys() and len(graph.nodes) == 10


# --- dropping objects --------------------------------------------------------------


def test_drop_object_reachable_elsewhere_keeps_it():
    """Keras 3: cutting the model keeps its variables, still tracked by the optimizer."""
    graph = keras_like()
    removed = graph.drop_objects(["model"])
    assert removed == set()
    assert graph.root_children() == ["optimizer", "step"]
    assert set(graph.checkpoint_keys()) == set(keras_like().checkpoint_keys())
    assert len(graph.nodes) == 7  # model's own nodes are gone, renumbered without gaps
    assert sorted(graph.reachable()) == list(range(7))


def test_drop_optimizer_keeps_the_models_variables():
    graph = keras_like()
    assert graph.drop_objects(["optimizer"]) == {f"optimizer/iterations/{VALUE}"}
    # The kernel and bias stay (reached through the model), now found by the model's path.
    assert (
        graph.paths()[graph.checkpoint_keys()[f"optimizer/_variables/0/{VALUE}"]]
        == "model/_layers/dense/kernel"
    )
    assert len(graph.nodes) == 7


def test_drop_optimizer_takes_its_slots():
    graph = with_slots()
    assert graph.drop_objects(["opt"]) == {f"opt/iter/{VALUE}", SLOT_V, SLOT_W}
    assert set(graph.checkpoint_keys()) == {f"v/{VALUE}", f"w/{VALUE}"}
    assert len(graph.nodes) == 3


def test_dropping_a_slots_original_drops_the_slot_and_its_reference():
    graph = with_slots()
    assert graph.drop_objects(["v"]) == {f"v/{VALUE}", SLOT_V}
    assert len(graph.nodes) == 5
    (slot,) = graph.nodes[graph.checkpoint_keys()[f"opt/iter/{VALUE}"] - 1].slot_variables
    assert graph.paths()[slot.original_variable_node_id] == "w"
    assert graph.nodes[slot.slot_variable_node_id].attributes[0].checkpoint_key == SLOT_W
    assert paths_by_key(graph)[SLOT_W] == "w/.OPTIMIZER_SLOT/opt/m"


def test_bare_name_cuts_every_edge_a_path_exactly_one():
    def graph():
        return parsed(
            [
                {"children": [("a", 1), ("b", 2)]},
                {"children": [("w", 3)]},
                {"children": [("w", 4)]},
                {"attrs": ["a/w"]},
                {"attrs": ["b/w"]},
            ]
        )

    assert graph().drop_objects(["w"]) == {"a/w", "b/w"}
    g = graph()
    assert g.drop_objects(["b/w"]) == {"b/w"}
    assert set(g.checkpoint_keys()) == {"a/w"}
    assert graph().drop_objects(["/a/w/"]) == {"a/w"}  # empty parts ignored


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("nothing", "no object named 'nothing'"),
        ("a/nothing/w", "no object at 'a/nothing'"),
        ("", "empty object path"),
        ("//", "empty object path"),
    ],
)
def test_drop_objects_refuses_what_is_not_there(spec, fragment):
    graph = parsed([{"children": [("a", 1)]}, {"children": [("w", 2)]}, {"attrs": ["k"]}])
    with pytest.raises(tfckpt.CheckpointError) as e:
        graph.drop_objects([spec])
    assert fragment in str(e.value) and "/ckpt/model" in str(e.value)


def test_prune_recomputes_has_checkpoint_values():
    graph = parsed(
        [
            {"children": [("holder", 1), ("v", 2), ("w", 3)], "has": True},
            {"children": [("v", 2)], "has": True},  # holds nothing of its own
            {"attrs": ["v"], "has": True},
            {"attrs": ["w"], "has": True},
            {"attrs": ["lost"]},  # unreachable
        ]
    )
    assert graph.prune() == {"lost"}
    assert [n.has_checkpoint_values.value for n in graph.nodes] == [True] * 4
    graph.drop_keys(["v"])
    graph.refresh_has_values()
    assert [n.has_checkpoint_values.value for n in graph.nodes] == [True, False, False, True]
    assert graph.drop_objects(["w"]) == {"w"}
    assert [n.has_checkpoint_values.value for n in graph.nodes] == [False, False, False]


def test_prune_reports_unreachable_attributes():
    graph = parsed([{"children": [("a", 1)]}, {"attrs": ["a"]}, {"attrs": ["lost"]}])
    assert graph.prune() == {"lost"}
    assert len(graph.nodes) == 2 and set(graph.checkpoint_keys()) == {"a"}


# --- merging -----------------------------------------------------------------------


def test_merge_joins_roots_and_renumbers():
    first = with_slots()
    second = parsed(
        [
            {"children": [("head", 1)], "has": True, "attrs": ["root_attr"]},
            {"children": [("w", 2)], "slots": [(2, "v", 3)], "has": True},
            {"attrs": ["head/w"], "has": True},
            {"attrs": ["head/w/.OPTIMIZER_SLOT/head/v"], "has": True},
        ]
    )
    merged = ObjectGraph.merge([first, second], ["first", "second"])
    assert merged.root_children() == ["v", "w", "opt", "head"]
    assert len(merged.nodes) == 7 + 3
    assert merged.nodes[0].has_checkpoint_values.value
    assert [a.checkpoint_key for a in merged.nodes[0].attributes] == ["root_attr"]
    paths = paths_by_key(merged)
    assert paths == {
        **paths_by_key(first),
        "root_attr": "",
        "head/w": "head/w",
        "head/w/.OPTIMIZER_SLOT/head/v": "head/w/.OPTIMIZER_SLOT/head/v",
    }
    # The merged graph serialises, parses and checks like any other.
    again = ObjectGraph.parse(merged.serialize())
    assert paths_by_key(again) == paths


@pytest.mark.parametrize(
    "second, fragment",
    [
        ([{"children": [("step", 1)]}, {"attrs": ["x"]}], "root object named 'step'"),
        ([{"attrs": ["y"]}], "root attribute 'VARIABLE_VALUE'"),
    ],
)
def test_merge_refuses_clashes_naming_both(second, fragment):
    first = parsed([{"children": [("step", 1)], "attrs": ["z"]}, {"attrs": ["s"]}])
    with pytest.raises(tfckpt.CheckpointError) as e:
        ObjectGraph.merge([first, parsed(second)], ["a/model", "b/model"])
    assert fragment in str(e.value)
    assert "a/model" in str(e.value) and "b/model" in str(e.value)


def test_drop_root_child():
    graph = keras_like()
    assert graph.drop_root_child("absent") == set()
    assert graph.drop_root_child("step") == {f"step/{VALUE}"}
    assert graph.root_children() == ["model", "optimizer"]


# --- without TensorFlow ----------------------------------------------------------------

WITHOUT_TF = """
import sys
class NoTensorFlow:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "tensorflow":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoTensorFlow())
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""


def test_runs_and_fuzz_skips_without_tensorflow(tmp_path):
    """These tests need no TensorFlow; test_fuzz.py skips cleanly where it is absent."""
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            WITHOUT_TF,
            "-q",
            "-p",
            "no:cacheprovider",
            "-rs",
            "--basetemp",
            str(tmp_path / "run"),
            "-k",
            "not without_tensorflow",
            os.path.join(here, "test_objectgraph_unit.py"),
            os.path.join(here, "..", "faults", "test_fuzz.py"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        # The run hides TensorFlow: under `make test-core` its skips are the point.
        env={k: v for k, v in os.environ.items() if k != "TFCKPT_TEST_CORE"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    summary = proc.stdout.strip().splitlines()[-1]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", summary)}
    assert set(counts) <= {"passed", "skipped", "deselected", "xfailed"}, summary
    assert counts.get("passed") and counts.get("skipped"), summary
    assert "could not import 'tensorflow'" in proc.stdout
