"""Load TensorFlow-format checkpoints into Keras 3 models, on any Keras backend.

Keras 3 reads only its own ``.weights.h5`` files (and not every Keras 2 ``.h5``), so
weights that tf.keras 2.x saved with ``model.save_weights(prefix)`` or in HDF5
(``model.save_weights("w.h5")``, ``model.save("m.h5")``), ``tf.train.Checkpoint(model=...)``
saves, and name-based (TF1) checkpoints are loaded here, from the files alone:

>>> import keras, tfckpt.keras
>>> model = build_model()  # the same architecture, built (its weights exist)
>>> report = tfckpt.keras.load_weights(model, "train/ckpt-12")
>>> report.unused[:1]
['optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE']

Keras is imported when a function here is called (never by ``import tfckpt``)
and TensorFlow is never imported by this module: Keras imports it only when it
is Keras's own backend.

A Keras 2 HDF5 file (``model.save_weights("w.h5")``, ``model.save("m.h5")``, Hugging
Face's ``tf_model.h5``) pairs as Keras pairs it: the model's layers that have weights
with the file's layers that list weights, in order, and within a layer weight by
weight (trainable ones first). Otherwise matching follows the object graph as tf.keras
restores it: a model's layers that have weights pair in order with the checkpoint's
``layer_with_weights-N``
objects (tf.keras 2.x) or with the weight-holding entries of ``_operations``
(Keras 3 on TensorFlow); a nested model recurses; within one layer the
variables pair by name (the last object name, ``_kernel`` as ``kernel``), in
order where a name repeats; a checkpoint without such layer lists (a subclassed
model's) pairs all the model's variables so. Name-based checkpoints map tensor names to
``variable.path`` through ``assignment_map``.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from tfckpt.checkpoint.opening import open_checkpoint
from tfckpt.checkpoint.reader import Checkpoint
from tfckpt.checkpoint.restoring import RestoreCheck, Wanted, check_restore
from tfckpt.errors import CheckpointError, KerasWeightsError
from tfckpt.format import dtypes as _dt
from tfckpt.format.objectgraph import OBJECT_GRAPH_KEY, ObjectGraph, escape_local_name
from tfckpt.format.tf2names import VALUE_SUFFIX
from tfckpt.io.storage import StorageOptions
from tfckpt.rewrite.cast import OVERFLOW_POLICIES, Caster, OverflowPolicy, check_overflow
from tfckpt.rewrite.options import RenameRules
from tfckpt.rewrite.rules import compile_rules, new_name

_SHOWN = 10  # problems named in an error message; the report has them all
_LAYER_WITH_WEIGHTS = re.compile(r"layer_with_weights-(\d+)\Z")
# Edges that never lead to a layer's weights: optimizers (a compiled nested model
# has its own) and Keras 3's seed generators, whose state is a variable but no weight.
_NOT_WEIGHTS = re.compile(r"optimizer\Z|_?seed_generator")


@dataclass
class LoadReport:
    """What :func:`load_weights` did.

    ``loaded`` maps each assigned variable's ``path`` to its tensor; ``missing``
    lists variables no tensor matched; ``mismatched`` maps a variable to
    ``(tensor, checkpoint shape, variable shape)``; ``unused`` lists the
    checkpoint's tensors nothing took (optimizer slots, counters, extra
    layers); ``cast`` maps a variable to ``(checkpoint dtype, variable dtype)``
    where the values were cast.
    """

    path: str
    loaded: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    mismatched: dict[str, tuple[str, tuple[int, ...], tuple[int, ...]]] = field(
        default_factory=dict
    )
    unused: list[str] = field(default_factory=list)
    cast: dict[str, tuple[str, str]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["mismatched"] = {
            k: {"tensor": t, "checkpoint_shape": list(a), "variable_shape": list(b)}
            for k, (t, a, b) in self.mismatched.items()
        }
        out["cast"] = {k: {"from": a, "to": b} for k, (a, b) in self.cast.items()}
        return out

    def __repr__(self) -> str:
        return (
            f"LoadReport({self.path!r}: {len(self.loaded)} loaded, {len(self.missing)} missing, "
            f"{len(self.mismatched)} mismatched, {len(self.unused)} unused, "
            f"{len(self.cast)} cast)"
        )


def load_weights(
    model,
    path,
    *,
    assignment_map: RenameRules | None = None,
    allow_missing: bool = False,
    skip_mismatch: bool = False,
    overflow: OverflowPolicy = "error",
    storage_options: StorageOptions | None = None,
) -> LoadReport:
    """Load a TensorFlow checkpoint into a built Keras 3 ``model``; return a :class:`LoadReport`.

    ``path`` is anything :func:`tfckpt.open` takes, or an open
    :class:`~tfckpt.Checkpoint`. A TF2 checkpoint (tf.keras ``save_weights``
    in TF format, ``tf.train.Checkpoint(model=...)`` of a tf.keras or Keras 3
    model) is matched through its object graph; a Keras 2 HDF5 file (``w.h5``,
    ``m.h5``) layer by layer, as Keras loads it. With ``assignment_map``, or
    for a checkpoint without an object graph (TF1), tensors are matched by
    name instead: ``assignment_map`` is ``{regex: replacement}`` (or pairs),
    matched at the start of each tensor name, the first match applying, as in
    :func:`tfckpt.rename`; a tensor whose new name (without a trailing
    ``/.ATTRIBUTES/VARIABLE_VALUE``) is a variable's ``path``, or its path
    below the model's name, loads into it. A plain prefix is such a regex:
    ``{"bert/encoder/": "encoder/"}``.

    Every variable is checked before any is assigned: a variable without a
    tensor raises :class:`~tfckpt.errors.KerasWeightsError` unless
    ``allow_missing``; a shape that differs raises it unless
    ``skip_mismatch`` (the variable is then left as it is). Values are cast to
    each variable's dtype (a float32 checkpoint into a float16 or bfloat16
    model) as ``tf.cast`` does; ``overflow`` says what values beyond the
    target's range do (``'error'``: :class:`~tfckpt.CastOverflowError`,
    ``'clip'``, ``'inf'``). Partitioned tensors are reassembled.

    >>> report = tfckpt.keras.load_weights(model, "tf1/model.ckpt-900",
    ...                                     assignment_map={"old_scope/": ""})
    """
    if overflow not in OVERFLOW_POLICIES:
        raise CheckpointError(f"overflow must be one of {', '.join(OVERFLOW_POLICIES)}")
    keras = importlib.import_module("keras")
    if isinstance(path, Checkpoint):
        return _load(keras, model, path, assignment_map, allow_missing, skip_mismatch, overflow)
    with open_checkpoint(path, storage_options=storage_options) as ckpt:
        return _load(keras, model, ckpt, assignment_map, allow_missing, skip_mismatch, overflow)


def check(
    model,
    path,
    *,
    assignment_map: RenameRules | None = None,
    allow_missing: bool = False,
    skip_mismatch: bool = False,
    storage_options: StorageOptions | None = None,
) -> RestoreCheck:
    """Would :func:`load_weights` of ``path`` into the Keras 3 ``model`` succeed? Decided
    from the checkpoint's index and the model's variables, before any value is read;
    the arguments are :func:`load_weights`'s, which runs this check first.

    A tf.keras (Keras 2) model is a TensorFlow trackable: :func:`tfckpt.tf.check` checks
    it (``tfckpt.tf.check(model, path, restorer="tensorflow")`` predicts its own
    ``load_weights``).

    >>> result = tfckpt.keras.check(model, "train/ckpt-12")
    >>> result.ok, [f.detail for f in result.failures()]
    """
    keras = importlib.import_module("keras")
    if isinstance(path, Checkpoint):
        return _check(keras, model, path, assignment_map, allow_missing, skip_mismatch)[0]
    with open_checkpoint(path, storage_options=storage_options) as ckpt:
        return _check(keras, model, ckpt, assignment_map, allow_missing, skip_mismatch)[0]


def _check(keras, model, ckpt, assignment_map, allow_missing, skip_mismatch):
    """The restore check of loading ``ckpt`` into ``model``, the :class:`LoadReport` of
    what would be loaded, and the message of each failure."""
    label = ckpt.prefix
    if not isinstance(model, keras.Model) and not hasattr(model, "weights"):
        raise CheckpointError(f"not a Keras model: {type(model).__name__}", path=label)
    weights = list(model.weights)
    if weights and not all(hasattr(v, "path") for v in weights):
        raise CheckpointError(
            "a tf.keras (Keras 2) model: check or restore it with tfckpt.tf.check / "
            "tfckpt.restore, as the TensorFlow trackable it is",
            path=label,
        )
    if not weights:
        raise CheckpointError(
            f"the model {model.name!r} has no weights: build it before loading", path=label
        )
    if assignment_map is None and ckpt.keras_layers is not None:
        pairs, why = _match_layers(model, ckpt.keras_layers)
    elif assignment_map is not None or OBJECT_GRAPH_KEY not in ckpt:
        pairs, why = _match_by_name(model, ckpt, assignment_map, label)
    else:
        graph = ObjectGraph.of(ckpt, path=label)
        pairs, why = _GraphMatcher(keras, graph, ckpt, label).match_model(model)

    report = LoadReport(path=label)
    paired = {id(v): t for v, t in pairs}
    wanted = []
    for var in weights:
        tensor = paired.get(id(var))
        if tensor is not None and tensor not in ckpt:
            why[var.path] = f"the object graph names {tensor!r}, which the checkpoint lacks"
            tensor = None
        dtype = keras.backend.standardize_dtype(var.dtype)
        shape = tuple(int(d) for d in var.shape)
        wanted.append(Wanted(tensor, var.path, dtype, shape, why=why.get(var.path)))
        if tensor is None:
            report.missing.append(var.path)
        elif tuple(ckpt.info(tensor).shape) != shape:
            report.mismatched[var.path] = (tensor, tuple(ckpt.info(tensor).shape), shape)
        else:
            report.loaded[var.path] = tensor
    taken = set(report.loaded.values()) | {t for t, _, _ in report.mismatched.values()}
    report.unused = [k for k in ckpt.keys() if k != OBJECT_GRAPH_KEY and k not in taken]
    result = check_restore(
        ckpt,
        wanted,
        target=f"Keras model {model.name!r}",
        restorer="tfckpt",
        allow_missing=allow_missing,
    )
    if skip_mismatch:  # those variables are left as they are
        result.findings = [
            replace(f, fails=False) if f.kind == "shape" else f for f in result.findings
        ]
    problems = []
    for f in result.failures():
        if f.kind == "missing":
            p = str(f.variable)
            problems.append(f"no tensor for {p}" + (f" ({why[p]})" if p in why else ""))
        elif f.kind == "shape":
            p = str(f.variable)
            t, a, b = report.mismatched[p]
            problems.append(
                f"{p}: the checkpoint's {t!r} has shape {list(a)}, the variable {list(b)}"
            )
        else:
            problems.append(f.detail)
    return result, report, problems


def _load(keras, model, ckpt, assignment_map, allow_missing, skip_mismatch, overflow):
    label = ckpt.prefix
    _, report, problems = _check(keras, model, ckpt, assignment_map, allow_missing, skip_mismatch)
    if problems:
        shown = problems[:_SHOWN] + (
            [f"{len(problems) - _SHOWN} more"] if len(problems) > _SHOWN else []
        )
        raise KerasWeightsError(
            f"cannot load into {model.name!r}, nothing assigned: " + "; ".join(shown),
            report=report,
            path=label,
        )
    variables = {v.path: v for v in model.weights}
    matched = [(variables[p], t) for p, t in report.loaded.items()]
    values = []
    overflows: dict[str, int] = {}
    for var, tensor in matched:
        source = ckpt.info(tensor).dtype
        target = keras.backend.standardize_dtype(var.dtype)
        value, counts = _converted(ckpt[tensor], source, target, overflow, label, tensor)
        if source != target:
            report.cast[var.path] = (source, target)
        overflows[var.path] = counts
        values.append((var, value))
    check_overflow(overflows, overflow, label)
    for var, value in values:
        var.assign(value)
    return report


def _converted(
    array: np.ndarray, source: str, target: str, overflow: OverflowPolicy, path, tensor
) -> tuple[np.ndarray, int]:
    """``array`` as ``target`` and how many values overflowed on the way."""
    if source == target:  # a view of the file until assigned, when it is mapped
        return np.asarray(array), 0
    src, tgt = _dt.lookup(source), _dt.lookup(target)
    if src.is_floating and tgt.is_floating:
        caster = Caster(src, tgt, overflow)
        out = caster(np.asarray(array))
        return out, caster.counts.overflow
    if tgt.numpy is not None and src.kind in ("int", "uint", "bool") and tgt.kind != "float":
        out = np.asarray(array).astype(tgt.numpy)
        if np.array_equal(out.astype(array.dtype), array):
            return out, 0
    raise CheckpointError(
        f"cannot load {source} values into a {target} variable without changing them",
        path=path,
        tensor=tensor,
    )


# -- name-based matching


def _match_by_name(model, ckpt, assignment_map, label):
    rules = compile_rules(assignment_map)
    targets: dict[str, Any] = {}
    prefix = f"{model.name}/"
    for var in model.weights:
        targets.setdefault(var.path, var)
        if var.path.startswith(prefix):
            targets.setdefault(var.path[len(prefix) :], var)
    pairs: dict[int, tuple[Any, str]] = {}
    for name in ckpt.keys():
        if name == OBJECT_GRAPH_KEY:
            continue
        new = new_name(name, {}, rules)
        if new.endswith(VALUE_SUFFIX):
            new = new[: -len(VALUE_SUFFIX)]
        var = targets.get(new)
        if var is None:
            continue
        if id(var) in pairs:
            raise CheckpointError(
                f"both {pairs[id(var)][1]!r} and {name!r} map to the variable {var.path!r}",
                path=label,
            )
        pairs[id(var)] = (var, name)
    how = "after assignment_map" if rules else "(no assignment_map given)"
    why = {
        v.path: f"no tensor's name {how} is {v.path!r} or the path below {model.name!r}"
        for v in model.weights
        if id(v) not in pairs
    }
    return list(pairs.values()), why


# -- layer-list matching (Keras HDF5 files)

_TOP_LEVEL = "top_level_model_weights"


def _legacy_weights(layer) -> list:
    """A layer's weights in the order Keras 2 saved them: trainable, then the others."""
    return list(layer.trainable_weights) + list(layer.non_trainable_weights)


def _match_layers(model, listed: list[tuple[str, list[str]]]):
    """Keras's own pairing for its HDF5 files: the model's layers that have weights with
    the file's layers that list weights, in order; within a layer, weight by weight in
    order (trainable ones first); the model's own weights (outside every layer) with
    the file's ``top_level_model_weights``."""
    theirs = [(name, tensors) for name, tensors in listed if tensors and name != _TOP_LEVEL]
    top = next((tensors for name, tensors in listed if name == _TOP_LEVEL), [])
    layers = [layer for layer in model.layers if layer.weights]
    pairs: list[tuple[Any, str]] = []
    why: dict[str, str] = {}
    for k, layer in enumerate(layers):
        if k >= len(theirs):
            for var in _legacy_weights(layer):
                why[var.path] = (
                    f"layer {layer.name!r} is layer with weights {k} of {model.name!r}; the "
                    f"file lists {len(theirs)} such layers"
                )
            continue
        name, tensors = theirs[k]
        weights = _legacy_weights(layer)
        for var, tensor in zip(weights, tensors):
            pairs.append((var, tensor))
        for var in weights[len(tensors) :]:
            why[var.path] = (
                f"layer {layer.name!r} has {len(weights)} weights; the file's layer {name!r} "
                f"(layer with weights {k}) lists {len(tensors)}"
            )
    inside = {id(w) for layer in layers for w in layer.weights}
    own = [w for w in model.weights if id(w) not in inside]
    for var, tensor in zip(own, top):
        pairs.append((var, tensor))
    for var in own[len(top) :]:
        why[var.path] = "a weight of the model itself; the file lists no such weight"
    return pairs, why


# -- object-graph matching


class _GraphMatcher:
    """Walks a Keras model's layers and the checkpoint's object graph together."""

    def __init__(self, keras, graph: ObjectGraph, ckpt, label: str):
        self.keras = keras
        self.nodes = graph.nodes
        self.ckpt = ckpt
        self.label = label
        self.pairs: list[tuple[Any, str]] = []
        self.why: dict[str, str] = {}
        self._reaches: set[int] | None = None  # nodes with a variable below
        self._shared: set[int] = set()  # nodes more than one edge reaches
        self._memo: dict[int, list[tuple[str, str]]] = {}  # shared node: variables below
        self._entered: set[int] = set()  # shared nodes whose list is being made

    def match_model(self, model):
        found = self._model_node()
        if found is not None:
            self._match(model, *found)
        else:
            # No layer list (a subclassed model): the variables pair by name, in order.
            children = self._children(0)
            node, where = (children["model"], "model") if "model" in children else (0, "")
            self._leaf(model, node, where)
            for path in self.why:
                self.why[path] += (
                    " (the checkpoint has no layer_with_weights-N or _operations objects: "
                    "variables were matched by name; load by name with assignment_map)"
                )
        return self.pairs, self.why

    # The checkpoint's side.

    def _children(self, node_id: int) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.nodes[node_id].children:
            out.setdefault(c.local_name, c.node_id)
        return out

    def _container(self, node_id: int, where: str) -> tuple[int, str] | None:
        """The node whose children are the model's layers, and its path, if it is a model."""
        seen = set()
        while node_id not in seen:
            seen.add(node_id)
            children = self._children(node_id)
            if any(_LAYER_WITH_WEIGHTS.match(n) for n in children) or "_operations" in children:
                return node_id, where
            if "_functional" not in children:  # Keras 3's Sequential wraps a Functional
                return None
            node_id, where = children["_functional"], _join(where, "_functional")
        return None

    def _model_node(self) -> tuple[int, str] | None:
        if self._container(0, "") is not None:
            return 0, ""
        children = self._children(0)
        if "model" in children and self._container(children["model"], "") is not None:
            return children["model"], "model"
        found = [(i, n) for n, i in children.items() if self._container(i, "") is not None]
        return (found[0][0], escape_local_name(found[0][1])) if len(found) == 1 else None

    def _layers(self, container: int, where: str) -> list[tuple[int, str]]:
        """The model's layers that hold weights, in the model's order, with their paths."""
        children = self._children(container)
        numbered = sorted(
            (int(m[1]), i, n) for n, i in children.items() if (m := _LAYER_WITH_WEIGHTS.match(n))
        )
        if numbered:
            return [(i, _join(where, n)) for _, i, n in numbered]
        where = _join(where, "_operations")
        ops = self._children(children["_operations"])
        ordered = sorted((int(n), i) for n, i in ops.items() if n.isdigit())
        return [(i, _join(where, str(k))) for k, i in ordered if self._has_variables(i)]

    def _index(self) -> None:
        """One pass over the graph: which nodes lead to a variable, which are reached by
        more than one edge (their variables are listed once, then reused)."""
        if self._reaches is not None:
            return
        parents: dict[int, list[int]] = {}
        has_value = []
        for i in range(len(self.nodes)):
            node = self.nodes[i]
            if any(a.name == "VARIABLE_VALUE" for a in node.attributes):
                has_value.append(i)
            for c in node.children:
                if not _NOT_WEIGHTS.match(c.local_name):
                    parents.setdefault(c.node_id, []).append(i)
        self._shared = {i for i, ps in parents.items() if len(ps) > 1}
        reaches = set(has_value)
        todo = list(has_value)
        while todo:
            for p in parents.get(todo.pop(), ()):
                if p not in reaches:
                    reaches.add(p)
                    todo.append(p)
        self._reaches = reaches

    def _has_variables(self, node_id: int) -> bool:
        self._index()
        assert self._reaches is not None
        return node_id in self._reaches

    def _variables(self, node_id: int) -> list[tuple[str, str]]:
        """``(name, tensor)`` of every variable below ``node_id``, depth first, each once.

        What is below a node that more than one edge reaches (a shared object) is
        walked once and reused, so loading is linear in the graph however many
        layers share it."""
        self._index()
        return self._walk(node_id, own=True)

    def _walk(self, root: int, own: bool, frontier: list[int] | None = None):
        """The variables below ``root`` (and its own if ``own``), splicing in the
        memoized lists of shared nodes; with ``frontier``, only collect into it the
        shared nodes met that have no list yet."""
        assert self._reaches is not None
        out: list[tuple[str, str]] = []
        taken: set[str] = set()

        def add(entries) -> None:
            for name, tensor in entries:
                if tensor not in taken:
                    taken.add(tensor)
                    out.append((name, tensor))

        seen = {root}
        stack = [(root, "")]
        while stack:
            i, name = stack.pop()
            node = self.nodes[i]
            if i != root or own:
                add(
                    (name.lstrip("_"), a.checkpoint_key)
                    for a in node.attributes
                    if a.name == "VARIABLE_VALUE"
                )
            if i != root and i in self._shared:
                if i in self._memo:
                    add(self._memo[i])
                    continue
                if i not in self._entered:  # else on the way to it (a cycle): walk it here
                    if frontier is not None:
                        frontier.append(i)
                    else:
                        add(self._below(i))
                    continue
            todo = []
            for c in node.children:
                if c.node_id in seen or c.node_id not in self._reaches:
                    continue
                if _NOT_WEIGHTS.match(c.local_name):
                    continue
                seen.add(c.node_id)
                todo.append((c.node_id, c.local_name))
            stack.extend(reversed(todo))
        return out

    def _below(self, shared: int) -> list[tuple[str, str]]:
        """The memoized variables strictly below a shared node: the shared nodes it
        meets are listed first (deepest first, without recursion), then it."""
        pending = [shared]
        self._entered.add(shared)
        while pending:
            top = pending[-1]
            new: list[int] = []
            self._walk(top, own=False, frontier=new)
            if new:
                self._entered.update(new)
                pending.extend(new)
                continue
            self._memo[top] = self._walk(top, own=False)
            pending.pop()
        return self._memo[shared]

    # Both sides.

    def _is_model(self, layer) -> bool:
        return isinstance(layer, self.keras.Model) and hasattr(layer, "layers")

    def _match(self, layer, node_id: int, where: str) -> None:
        container = self._container(node_id, where) if self._is_model(layer) else None
        if container is not None:
            mine = [sub for sub in layer.layers if sub.weights]
            theirs = self._layers(*container)
            for k, sub in enumerate(mine):
                if k < len(theirs):
                    self._match(sub, *theirs[k])
                else:
                    for var in sub.weights:
                        self.why[var.path] = (
                            f"layer {sub.name!r} is layer with weights {k} of "
                            f"{layer.name!r}; the checkpoint has {len(theirs)} there"
                        )
            return
        self._leaf(layer, node_id, where)

    def _leaf(self, layer, node_id: int, where: str) -> None:
        groups: dict[str, list[str]] = {}
        for name, tensor in self._variables(node_id):
            groups.setdefault(name, []).append(tensor)
        for var in layer.weights:
            found = groups.get(var.name)
            if found:
                self.pairs.append((var, found.pop(0)))
            else:
                self.why[var.path] = f"no variable {var.name!r} under {where or 'the root'!r}"


def _join(a: str, b: str) -> str:
    return f"{a}/{b}" if a else b


__all__ = ["LoadReport", "load_weights", "check", "KerasWeightsError"]
