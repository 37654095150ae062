"""TF2 checkpoint names: keys, paths and flat names, in one place.

A TF2 key is an object's path from the root, then ``/.ATTRIBUTES/`` and the attribute's
name (``model/dense/kernel/.ATTRIBUTES/VARIABLE_VALUE``). A tensor's *path* is its key
without ``/.ATTRIBUTES/VARIABLE_VALUE`` (``model/dense/kernel``); a tensor of another
attribute keeps the attribute's name (``table/.ATTRIBUTES/table-keys`` is
``table/table-keys``). Its *flat name* is the same built on its object's first path from
the root that passes no ``optimizer`` edge (the key's own path where the optimizer alone
reaches the object), and for a slot variable its variable's flat name, ``/`` and the
slot's name (``model/dense/kernel/m``), as a TF1 optimizer names its slots. Mostly the
flat name is the path; they differ for slots, and where a key runs through the
optimizer (Keras 3: ``optimizer/_trainable_variables/0``).
"""

from __future__ import annotations

from tfckpt._proto.trackable_object_graph_pb2 import TrackableObjectGraph
from tfckpt.format.objectgraph import ObjectGraph, attribute_tensors, escape_local_name

# TF2 keys end in this for a variable's value; the rest is the object path.
VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
# The attribute name of a variable's value.
VARIABLE_VALUE = "VARIABLE_VALUE"
# The edges to an optimizer (tf.train.Checkpoint(optimizer=...), a Keras model's).
OPTIMIZER_EDGES = frozenset({"optimizer"})
# Training bookkeeping, not weights: TF2's checkpoint save counter, TF1's step.
BOOKKEEPING = frozenset(
    {
        "save_counter/.ATTRIBUTES/VARIABLE_VALUE",
        "global_step",
        "global_step/.ATTRIBUTES/VARIABLE_VALUE",
    }
)


def cut_optimizer_edges(proto: TrackableObjectGraph) -> None:
    """Remove every ``optimizer`` edge of ``proto`` in place: what is still reachable
    from the root is the model; what is not is the optimizer's state."""
    for node in proto.nodes:
        kept = [c for c in node.children if c.local_name not in OPTIMIZER_EDGES]
        if len(kept) != len(node.children):
            del node.children[:]
            node.children.extend(kept)


ATTRIBUTES = "/.ATTRIBUTES/"


def tensor_path(name: str) -> str:
    """A TF2 tensor's path: ``/.ATTRIBUTES/VARIABLE_VALUE`` cut, ``/.ATTRIBUTES/`` → ``/``.

    >>> tensor_path("model/dense/kernel/.ATTRIBUTES/VARIABLE_VALUE")
    'model/dense/kernel'
    """
    if name.endswith(VALUE_SUFFIX):
        return name[: -len(VALUE_SUFFIX)]
    head, sep, tail = name.rpartition(ATTRIBUTES)
    return f"{head}/{tail}" if sep else name


def flat_names(graph: ObjectGraph, present: set[str]) -> dict[str, str]:
    """Every tensor of the graph's attributes and its flat name (see the module's text).

    A variable's path is taken as :func:`tfckpt.export` takes it: the first path from
    the root that passes no ``optimizer`` edge (a Keras 3 variable's key runs
    through ``optimizer/_trainable_variables/N``); an object only the optimizer
    reaches keeps its key's path.
    """
    nodes = graph.nodes
    cut = type(graph.proto)()
    cut.CopyFrom(graph.proto)
    cut_optimizer_edges(cut)
    slot_of: dict[int, tuple[int, str]] = {}
    for node in nodes:
        for s in node.slot_variables:
            slot_of.setdefault(s.slot_variable_node_id, (s.original_variable_node_id, s.slot_name))
    # Only the paths names are built on: a deep or doubling graph costs no more.
    holders = {i for i, node in enumerate(nodes) if node.attributes and i not in slot_of}
    originals = {slot_of[i][0] for i, node in enumerate(nodes) if node.attributes and i in slot_of}
    found = ObjectGraph(cut, graph.path).full_paths(holders | originals)
    found.pop(0, None)  # the root's attributes keep their keys' paths
    full: dict[int, str] | None = None

    def variable_path(i: int) -> str:
        nonlocal full
        if i in found:
            return found[i]
        for a in nodes[i].attributes:
            if a.name == "VARIABLE_VALUE":
                return tensor_path(a.checkpoint_key)
        if full is None:
            full = graph.full_paths(originals - set(found))
        return full.get(i, str(i))

    out: dict[str, str] = {}
    for i, node in enumerate(nodes):
        for a in node.attributes:
            key = a.checkpoint_key
            attr = "" if a.name == "VARIABLE_VALUE" else "/" + a.name
            if i in slot_of:
                original, slot_name = slot_of[i]
                stem = f"{variable_path(original)}/{escape_local_name(slot_name)}{attr}"
            elif i in found:
                stem = found[i] + attr
            else:
                stem = tensor_path(key)
            for t in attribute_tensors(key, present):
                out[t] = stem + t[len(key) :]
    return out
