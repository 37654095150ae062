"""A Keras 2 HDF5 file as the target of ``tfckpt check``: what the model that wrote it
restores, read from the file's layers and weights (names, dtypes, shapes).

A ``save_weights`` file (``w.h5``), a whole model (``m.h5``: its ``model_weights``) and
Hugging Face's ``tf_model.h5`` stand for a tf.keras model built as the writer's was, and
the checkpoint is what that model would load:

- another Keras HDF5 file: ``model.load_weights(file)`` pairs the model's layers that have
  weights with the file's, in order, then weight by weight in order. A file with another
  number of such layers, or a layer with another number of weights, is refused whole
  (whatever the names); a weight of another shape fails its assignment; values of
  another dtype are cast by numpy (information, never a failure). Names do not count.
- a TF2 checkpoint (``save_weights`` in TF format: the model is the root; or
  ``tf.train.Checkpoint(model=...)``: the root's ``model``): restored through the object
  graph, the model's ``layer_with_weights-N`` in order; within a layer a variable is
  found by its full name (equal, or equal below the model's own scope), else by its
  attribute's name as the weight's last name component, in order where one repeats.
  TensorFlow restores only the dtype saved and checks shapes; tensors of the checkpoint
  that no weight reads (an optimizer's state) are unused, failing ``--assert-consumed``.

Only weights are compared: layers without weights (``Dropout``) are no part of a
Keras HDF5 file, so what ``assert_existing_objects_matched`` says of them is not
predicted. h5py is not imported here: the file is read through
:class:`~tfckpt.checkpoint.hdf5.HDF5Checkpoint` (``keras_layers``).
"""

from __future__ import annotations

import re

from tfckpt.checkpoint.opening import find_hdf5, keras_file_within, open_in
from tfckpt.checkpoint.restoring import Expectation, Finding, Wanted
from tfckpt.errors import UnsupportedCheckpointError
from tfckpt.format import dtypes as _dt
from tfckpt.format.objectgraph import OBJECT_GRAPH_KEY, ObjectGraph
from tfckpt.io.storage import Storage

TOP_LEVEL = "top_level_model_weights"
_LAYER_WITH_WEIGHTS = re.compile(r"layer_with_weights-(\d+)\Z")
# Edges that never lead to a layer's own weights.
_NOT_WEIGHTS = re.compile(r"optimizer\Z|_?seed_generator")


class KerasH5Target:
    """A Keras HDF5 file (``h5``, open) standing for the model that wrote it."""

    def __init__(self, h5, label: str):
        self.h5 = h5
        self.label = label
        listed = h5.keras_layers or []
        self.layers = [(n, ts) for n, ts in listed if ts and n != TOP_LEVEL]
        self.top: list[str] = next((ts for n, ts in listed if n == TOP_LEVEL), [])

    def close(self) -> None:
        self.h5.close()

    def expect(self, ckpt) -> Expectation:
        if getattr(ckpt, "keras_layers", None) is not None:
            return self._by_order(ckpt)
        if OBJECT_GRAPH_KEY in ckpt:
            return self._by_objects(ckpt)
        raise UnsupportedCheckpointError(
            f"{self.label} is restored by model.load_weights, which reads a Keras HDF5 file "
            "or a TF2 checkpoint; this one has neither Keras layers nor an object graph (a "
            "TF1 checkpoint: check it against a .meta graph or a template; Hugging Face's "
            "sharded weights, which transformers loads by name, not load_weights)",
            path=ckpt.prefix,
        )

    def _want(self, key: str | None, tensor: str, *, exact_dtype: bool, why=None) -> Wanted:
        info = self.h5.info(tensor)
        dtype = info.dtype if exact_dtype else None
        return Wanted(key, tensor, dtype, tuple(info.shape), why=why)

    # -- another Keras HDF5 file: load_weights pairs by position

    def _by_order(self, ckpt) -> Expectation:
        theirs = [(n, ts) for n, ts in ckpt.keras_layers if ts and n != TOP_LEVEL]
        top: list[str] = next((ts for n, ts in ckpt.keras_layers if n == TOP_LEVEL), [])
        wanted: list[Wanted] = []
        problems: list[Finding] = []
        if len(theirs) != len(self.layers):
            problems.append(
                _count_problem(
                    f"the checkpoint lists {len(theirs)} layers with weights, the target "
                    f"{len(self.layers)}: load_weights pairs layers in order and refuses "
                    "another count"
                )
            )
        pairs = [(mine, other) for mine, other in zip(self.layers, theirs)]
        if self.top or top:
            pairs.append(((TOP_LEVEL, self.top), (TOP_LEVEL, top)))
        for (name, mine), (other_name, other) in pairs:
            if len(mine) != len(other):
                problems.append(
                    _count_problem(
                        f"layer {name!r} has {len(mine)} weights, the checkpoint's layer "
                        f"{other_name!r} in its place {len(other)}: load_weights refuses it"
                    )
                )
                continue
            for tensor, key in zip(mine, other):
                wanted.append(self._want(key, tensor, exact_dtype=False))
                problems.extend(self._cast(ckpt, key, tensor))
        if len(theirs) != len(self.layers):
            # Refused before any value is read: the checkpoint's surplus is no mere extra.
            for _, ts in theirs[len(self.layers) :]:
                problems.extend(
                    Finding("unused", t, None, f"{t}: in a layer the target lacks", fails=True)
                    for t in ts
                )
        note = "Keras HDF5 into Keras HDF5: layers paired in order, dtypes cast by numpy"
        return Expectation(wanted, notes=[note], problems=problems)

    def _cast(self, ckpt, key: str, tensor: str) -> list[Finding]:
        have, want = ckpt.info(key), self.h5.info(tensor)
        if have.dtype == want.dtype:
            return []
        castable = _dt.lookup(have.dtype).is_floating and _dt.lookup(want.dtype).is_floating
        return [
            Finding(
                "dtype",
                key,
                tensor,
                f"{key}: {have.dtype} in the checkpoint, {want.dtype} in {tensor!r}; "
                "load_weights casts it",
                fails=False,
                checkpoint_dtype=have.dtype,
                checkpoint_shape=list(have.shape),
                target_dtype=want.dtype,
                target_shape=list(want.shape),
                castable=castable,
            )
        ]

    # -- a TF2 checkpoint: restored through its object graph

    def _by_objects(self, ckpt) -> Expectation:
        graph = ObjectGraph.of(ckpt)
        names = [n for n, _ in self.layers]
        model, where = _model_node(graph, names)
        layers = _layer_nodes(graph, model, names)
        wanted: list[Wanted] = []
        for k, (name, mine) in enumerate(self.layers):
            node, edge = layers[k] if k < len(layers) else (None, None)
            if node is None:
                why = (
                    f"layer {name!r} (layer with weights {k}) has no object in the "
                    f"checkpoint's model {where or 'root'!r}"
                )
                wanted.extend(self._want(None, t, exact_dtype=True, why=why) for t in mine)
                continue
            found = _variables(graph, node)
            wanted.extend(self._pair(found, mine, f"{where}/{edge}".lstrip("/")))
        if self.top:
            own = _variables(graph, model, own_only=True)
            wanted.extend(self._pair(own, self.top, where))
        consumable = {a.checkpoint_key for n in graph.nodes for a in n.attributes}
        return Expectation(wanted, consumable)

    def _pair(self, found: list[tuple[str, str, str]], tensors: list[str], where: str):
        """Each weight (``tensors``) with the variable of ``found`` (``(attribute name,
        full name, key)``) that restores into it: the same full name, the same below the
        model's scope, else the same attribute name, in order."""
        by_full = {full: key for _, full, key in found}
        by_scope = {_below_scope(full): key for _, full, key in found}
        by_name: dict[str, list[str]] = {}
        for name, _, k in found:
            by_name.setdefault(name, []).append(k)
        taken: set[str] = set()
        out = []
        for tensor in tensors:
            key: str | None = by_full.get(tensor) or by_scope.get(_below_scope(tensor))
            if key is None or key in taken:
                leaf = tensor.rsplit("/", 1)[-1]
                left = [c for c in by_name.get(leaf, []) if c not in taken]
                key = left[0] if left else None
            why = None if key else f"no variable {tensor.rsplit('/', 1)[-1]!r} under {where!r}"
            if key:
                taken.add(key)
            out.append(self._want(key, tensor, exact_dtype=True, why=why))
        return out


def _count_problem(detail: str) -> Finding:
    return Finding("missing", None, None, detail, fails=True)


def _below_scope(name: str) -> str:
    return name.split("/", 1)[1] if "/" in name else name


def _children(graph: ObjectGraph, node: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in graph.nodes[node].children:
        out.setdefault(c.local_name, c.node_id)
    return out


def _layer_nodes(graph: ObjectGraph, node: int, names: list[str]):
    """The objects of a model's layers with weights, with their edges: its
    ``layer_with_weights-N`` in order (a Sequential or functional model); else (a
    subclassed model, whose layers are attributes) the children named as the layers."""
    children = _children(graph, node)
    numbered = sorted(
        (int(m[1]), c, n) for n, c in children.items() if (m := _LAYER_WITH_WEIGHTS.match(n))
    )
    if numbered:
        return [(c, n) for _, c, n in numbered]
    return [(children.get(n), n) for n in names]


def _model_node(graph: ObjectGraph, names: list[str]) -> tuple[int, str]:
    """The node of the Keras model: the root (``save_weights``) or the root's ``model``
    (``tf.train.Checkpoint(model=...)``)."""
    for node, where in ((0, ""), (_children(graph, 0).get("model"), "model")):
        if node is not None and any(c is not None for c, _ in _layer_nodes(graph, node, names)):
            return node, where
    raise UnsupportedCheckpointError(
        "the checkpoint's object graph holds no Keras model with the target's layers (no "
        "layer_with_weights-N, nor objects named as its layers, at its root or under "
        "'model'): not what load_weights reads",
        path=graph.path,
    )


def _variables(graph: ObjectGraph, node: int, own_only: bool = False):
    """``(attribute name, full name, key)`` of each variable below ``node``, depth first
    in the order of the children, each once; ``own_only``: the node's own variables (its
    direct children that are no layers)."""
    out: list[tuple[str, str, str]] = []
    seen = {node}
    stack = [(node, "", 0)]
    while stack:
        i, name, depth = stack.pop()
        for a in graph.nodes[i].attributes:
            if a.name == "VARIABLE_VALUE" and i != node:
                out.append((name.lstrip("_"), a.full_name, a.checkpoint_key))
        if own_only and depth == 1:
            continue
        todo = []
        for c in graph.nodes[i].children:
            if c.node_id in seen or _NOT_WEIGHTS.match(c.local_name):
                continue
            if own_only and (c.local_name.startswith("layer") or c.local_name == "keras_api"):
                continue
            seen.add(c.node_id)
            todo.append((c.node_id, c.local_name, depth + 1))
        stack.extend(reversed(todo))
    return out


def keras_h5_target(store: Storage, path: str) -> KerasH5Target | None:
    """A Keras 2 HDF5 weights file (or a group in one) as a target; None for any other
    path."""
    if find_hdf5(store, path) is None:
        # A directory or an archive holding one Keras file (and no TF checkpoint) is it.
        within = keras_file_within(store, path)
        if within is None:
            return None
        store, path = within
    h5 = open_in(store, path)
    if getattr(h5, "keras_layers", None) is None:
        h5.close()
        return None
    version = getattr(h5, "keras_version", None)
    written = f", Keras {version}" if version else ""
    return KerasH5Target(h5, f"{h5.prefix} (Keras HDF5: the model that wrote it{written})")
