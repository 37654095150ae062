"""Restoring a checkpoint into live TensorFlow variables, casting each value to its variable.

Values are read and cast by tfckpt (exactly as ``tf.cast`` rounds); TensorFlow
only assigns. Everything is matched and checked before the first assignment, so
a mismatch leaves every variable as it was: :func:`check` (the restore check of
:mod:`tfckpt.checkpoint.restoring`) first, listing every missing value and every
dtype, shape and slice mismatch at once, then the values themselves.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tfckpt.checkpoint.opening import open_checkpoint
from tfckpt.checkpoint.reader import Checkpoint
from tfckpt.checkpoint.restoring import SHOWN, RestoreCheck, Restorer, Wanted, check_restore
from tfckpt.errors import CheckpointError
from tfckpt.format import dtypes as _dt
from tfckpt.format.objectgraph import OBJECT_GRAPH_KEY, ObjectGraph
from tfckpt.io.storage import StorageOptions
from tfckpt.rewrite.cast import Caster, OverflowPolicy
from tfckpt.tf._tf import tensorflow


@dataclass
class Restored:
    checkpoint_name: str
    variable: str
    dtype: str  # in the checkpoint
    new_dtype: str  # of the variable

    @property
    def cast(self) -> bool:
        return self.dtype != self.new_dtype


@dataclass
class RestoreReport:
    """What :func:`restore` did: values restored (with any cast), variables the
    checkpoint had no value for, and checkpoint tensors nothing asked for."""

    restored: list[Restored] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "restored": [vars(r) for r in self.restored],
            "missing": self.missing,
            "unused": self.unused,
        }


def restore(
    target,
    path,
    *,
    session=None,
    assignment_map: Mapping[str, str] | None = None,
    allow_missing: bool = False,
    overflow: OverflowPolicy = "error",
    reshape: bool = False,
    storage_options: StorageOptions | None = None,
) -> RestoreReport:
    """Restore ``path`` into ``target``, casting every value to its variable's dtype.

    - TF1 graph mode: ``target`` is a list of variables (matched by op name;
      partitioned variables by their slices) or a dict ``{checkpoint_name:
      variable or list of partitions}``, as ``tf.compat.v1.train.Saver`` takes;
      ``session`` is required. Eager variables work the same way without a
      session. When names are not in a TF2 checkpoint, they are looked up as
      the object graph recorded them (the variables' full names), as
      ``Saver.restore`` falls back.
    - TF2: ``target`` is a trackable (``tf.train.Checkpoint``, ``tf.Module``, a
      Keras model), matched through the checkpoint's object graph the way
      ``tf.train.Checkpoint.restore`` matches: children by local name from the
      root (``tf.train.Checkpoint(root)`` starts at ``root``).
    - ``assignment_map`` (name-based targets), as in
      ``tf.compat.v1.train.init_from_checkpoint``: ``{"old_scope/": "new_scope/"}``
      or exact ``{"ckpt_name": "var_name"}``; only variables it covers are restored.
      An exact entry naming no given variable, or no tensor of the checkpoint, is
      an error.

    A shape mismatch is an error naming both shapes, unless ``reshape`` (as
    ``Saver(reshape=True)``) and both have the same number of elements; a variable
    without a value in the checkpoint is an error unless ``allow_missing``.
    ``overflow`` is the cast policy (``'error'``, ``'clip'``, ``'inf'``).

    >>> tfckpt.restore(tf.train.Checkpoint(model=float16_model), "train/ckpt-3")
    """
    tf = tensorflow()
    with open_checkpoint(path, storage_options=storage_options) as ckpt:
        if isinstance(target, (list, tuple, dict)):
            pairs, report = _match_by_name(tf, target, ckpt, assignment_map, reshape)
        else:
            if assignment_map:
                raise CheckpointError(
                    "assignment_map applies to name-based targets (a list "
                    "or dict of variables), not to object-based ones"
                )
            pairs, report = _match_objects(tf, target, ckpt)
        result = check_restore(
            ckpt,
            _wanted(tf, pairs, report),
            target=_target_label(target),
            restorer="tfckpt",
            allow_missing=allow_missing,
            reshape=reshape,
        )
        if not result.ok:
            raise _problems(result)
        values = [
            (var, _converted(ckpt, name, var_name, var, value_fn, overflow, reshape))
            for name, var_name, var, value_fn in pairs
        ]
        report.restored = [
            Restored(name, var_name, ckpt.info(name).dtype, _var_dtype(tf, var).name)
            for name, var_name, var, _ in pairs
        ]
    _assign_all(tf, values, session)
    return report


def check(
    target,
    path,
    *,
    assignment_map: Mapping[str, str] | None = None,
    restorer: Restorer = "tfckpt",
    allow_missing: bool = False,
    reshape: bool = False,
    storage_options: StorageOptions | None = None,
) -> RestoreCheck:
    """Would restoring ``path`` into ``target`` succeed? Decided from the checkpoint's
    index and the variables' dtypes and shapes, before any value is read.

    ``target`` and ``assignment_map`` are what :func:`restore` takes. ``restorer``:
    ``"tfckpt"`` predicts :func:`restore` (floating-point values are cast), and
    ``"tensorflow"`` a restore by TensorFlow of the same variables (dtypes must be
    equal). :func:`restore` runs this check first and raises on its failures.

    >>> result = tfckpt.tf.check(tf.train.Checkpoint(model=model), "train/ckpt-3")
    >>> result.ok, [f.detail for f in result.failures()]
    """
    tf = tensorflow()
    with open_checkpoint(path, storage_options=storage_options) as ckpt:
        if isinstance(target, (list, tuple, dict)):
            pairs, report = _match_by_name(tf, target, ckpt, assignment_map, reshape)
        else:
            pairs, report = _match_objects(tf, target, ckpt)
        return check_restore(
            ckpt,
            _wanted(tf, pairs, report),
            target=_target_label(target),
            restorer=restorer,
            allow_missing=allow_missing,
            reshape=reshape,
        )


def _target_label(target) -> str:
    if isinstance(target, (list, tuple, dict)):
        return f"{len(target)} variables"
    return f"the objects of {type(target).__name__}"


def _wanted(tf, pairs, report: RestoreReport) -> list[Wanted]:
    """What :func:`restore` reads, for :func:`check_restore`: each matched variable's
    tensor, dtype and shape (a partition: the whole tensor's, and its part), and each
    variable nothing matched."""
    wanted = []
    for name, label, var, _ in pairs:
        dtype = _dt.lookup(_var_dtype(tf, var).name).name
        shape = tuple(None if d is None else int(d) for d in var.shape)
        info = getattr(var, "_save_slice_info", None)
        if info is not None and list(info.var_shape) != list(info.full_shape):
            extents = tuple((int(o), int(n)) for o, n in zip(info.var_offset, info.var_shape))
            wanted.append(
                Wanted(name, str(label), dtype, tuple(int(d) for d in info.full_shape), extents)
            )
        else:
            wanted.append(Wanted(name, str(label), dtype, shape))
    wanted += [
        Wanted(None, str(label), why="the checkpoint has no value for it")
        for label in report.missing
    ]
    return wanted


def _problems(result: RestoreCheck) -> CheckpointError:
    """The check's failures as one error: values missing first, then mismatches."""
    failures = result.failures()
    missing = [str(f.variable) for f in failures if f.kind == "missing"]
    parts = []
    if missing:
        parts.append(
            f"no value for {len(missing)} variable(s): {', '.join(missing[:SHOWN])}"
            f"{', ...' if len(missing) > SHOWN else ''} (pass allow_missing=True to skip them)"
        )
    others = [f.detail for f in failures if f.kind != "missing"]
    parts += others[:SHOWN] + ([f"{len(others) - SHOWN} more"] if len(others) > SHOWN else [])
    tensor = failures[0].tensor if len(failures) == 1 else None
    return CheckpointError(
        "nothing assigned: " + "; ".join(parts), path=result.checkpoint, tensor=tensor
    )


def _var_dtype(tf, var):
    # Ref variables (TF1, use_resource=False) report 'float32_ref' and the like.
    return tf.as_dtype(var.dtype).base_dtype


def _var_shape(var) -> tuple:
    return tuple(int(d) for d in var.shape)


def _converted(
    ckpt: Checkpoint,
    name: str,
    var_name: str,
    var,
    value_fn,
    overflow: OverflowPolicy,
    reshape: bool = False,
):
    tf = tensorflow()
    value = _fitted(ckpt, name, var_name, value_fn(), _var_shape(var), reshape)
    want = _dt.lookup(_var_dtype(tf, var).name)
    have = _dt.lookup(value.dtype) if value.dtype != object else _dt.STRING
    if have is want:
        return value
    if have.is_floating and want.is_floating:
        caster = Caster(have, want, overflow)
        out = caster(value.reshape(-1)).reshape(value.shape)
        if caster.counts.overflow and overflow == "error":
            raise CheckpointError(
                f"{caster.counts.overflow} values beyond the range of "
                f"{want.name} (use overflow='clip' or 'inf')",
                path=ckpt.prefix,
                tensor=name,
            )
        return out
    if have.kind in ("int", "uint", "bool") and want.kind in ("int", "uint", "bool"):
        out = value.astype(want.numpy)
        if not np.array_equal(out.astype(value.dtype), value):
            raise CheckpointError(f"values do not fit {want.name}", path=ckpt.prefix, tensor=name)
        return out
    raise CheckpointError(
        f"cannot restore {have.name} into {want.name} variable {var_name!r}",
        path=ckpt.prefix,
        tensor=name,
    )


def _fitted(
    ckpt: Checkpoint, name: str, var_name: str, value: np.ndarray, shape: tuple, reshape: bool
) -> np.ndarray:
    """``value`` in ``shape``: as it is, or reshaped when ``reshape`` allows (same size)."""
    if value.shape == shape:
        return value
    if reshape and value.size == math.prod(shape):
        return value.reshape(shape)
    hint = " (pass reshape=True to reshape it)" if value.size == math.prod(shape) else ""
    raise CheckpointError(
        f"shape {list(value.shape)} in the checkpoint, "
        f"{list(shape)} in variable {var_name!r}{hint}",
        path=ckpt.prefix,
        tensor=name,
    )


def _assign_all(tf, values, session) -> None:
    graph_vars = [(v, x) for v, x in values if _in_graph(tf, v)]
    if graph_vars:
        if session is None:
            raise CheckpointError("graph-mode variables need session=")
        with session.graph.as_default():
            feeds, ops = {}, []
            for var, value in graph_vars:
                ph = tf.compat.v1.placeholder(_var_dtype(tf, var).base_dtype, shape=value.shape)
                ops.append(tf.compat.v1.assign(var, ph))
                feeds[ph] = value
            session.run(ops, feed_dict=feeds)
    for var, value in values:
        if not _in_graph(tf, var):
            var.assign(value)


def _in_graph(tf, var) -> bool:
    """True for TF1 graph-mode variables, which are assigned through a session."""
    return bool(getattr(var, "_in_graph_mode", type(var).__name__ == "RefVariable"))


# --- name-based ----------------------------------------------------------------


def _var_name(var) -> str:
    info = getattr(var, "_save_slice_info", None)
    if info is not None:
        return info.full_name
    op = getattr(var, "op", None)
    if op is not None and getattr(op, "name", None) and not callable(op):
        try:
            return op.name
        except Exception:
            pass
    return var.name.split(":")[0]


def _parts(var) -> list:
    """The variables that hold a (possibly partitioned) variable's values."""
    if isinstance(var, (list, tuple)):  # partitions listed one by one, as Saver takes them
        return [p for v in var for p in _parts(v)]
    if type(var).__name__ == "PartitionedVariable" or hasattr(var, "_get_variable_list"):
        return list(var)
    return [var]


def _map_name(var_name: str, assignment_map: Mapping[str, str] | None) -> str | None:
    """The checkpoint name for a variable, or None when the map does not cover it."""
    if assignment_map is None:
        return var_name
    for ckpt_name, current in assignment_map.items():
        if current == var_name and not current.endswith("/"):
            return ckpt_name
    for ckpt_scope, scope in assignment_map.items():
        if scope.endswith("/") and (var_name.startswith(scope) or scope == "/"):
            rest = var_name if scope == "/" else var_name[len(scope) :]
            return rest if ckpt_scope == "/" else ckpt_scope + rest
    return None


def _check_assignment_map(assignment_map: Mapping[str, str], names: set, ckpt: Checkpoint):
    """Exact entries must name a given variable and a checkpoint tensor, as
    ``init_from_checkpoint`` requires (scope entries may cover nothing)."""
    for ckpt_name, var_name in assignment_map.items():
        if var_name.endswith("/"):
            continue
        if var_name not in names:
            raise CheckpointError(
                f"assignment_map maps {ckpt_name!r} to {var_name!r}, which "
                "is none of the variables given",
                path=ckpt.prefix,
                tensor=ckpt_name,
            )
        if ckpt_name not in ckpt:
            raise CheckpointError(
                f"assignment_map maps {ckpt_name!r} to variable "
                f"{var_name!r}, but the checkpoint has no such tensor",
                path=ckpt.prefix,
                tensor=ckpt_name,
            )


def _object_graph_names(ckpt: Checkpoint) -> dict[str, str]:
    """Variable full names -> checkpoint keys, as a TF2 checkpoint's object graph records them."""
    graph = ObjectGraph.of(ckpt)
    return {attr.full_name: attr.checkpoint_key for node in graph.nodes for attr in node.attributes}


def _match_by_name(tf, target, ckpt: Checkpoint, assignment_map, reshape: bool = False):
    items: list[tuple[str, Any]] = []
    if isinstance(target, dict):
        for name, var in target.items():
            items.extend((name, part) for part in _parts(var))
    else:
        parts = [part for var in target for part in _parts(var)]
        if assignment_map is not None:
            _check_assignment_map(assignment_map, {_var_name(p) for p in parts}, ckpt)
        for part in parts:
            mapped = _map_name(_var_name(part), assignment_map)
            if mapped is not None:
                items.append((mapped, part))
    if (
        assignment_map is None
        and OBJECT_GRAPH_KEY in ckpt
        and any(name not in ckpt for name, _ in items)
    ):
        # Names from a TF1 graph against a TF2 checkpoint: Saver.restore then maps
        # every name through the object graph's full names.
        keys = _object_graph_names(ckpt)
        items = [(keys.get(name, name), var) for name, var in items]
    report = RestoreReport()
    pairs: list[tuple[str, str, Any, Callable[..., np.ndarray]]] = []
    cache: dict[str, np.ndarray] = {}

    def full_value(name, label, shape):
        if name not in cache:
            cache[name] = _fitted(ckpt, name, label, ckpt[name], shape, reshape)
        return cache[name]

    used = set()
    for ckpt_name, var in items:
        label = getattr(var, "name", ckpt_name)
        if ckpt_name not in ckpt:
            report.missing.append(label)
            continue
        used.add(ckpt_name)
        info = getattr(var, "_save_slice_info", None)
        if info is not None and list(info.var_shape) != list(info.full_shape):
            index = tuple(slice(o, o + n) for o, n in zip(info.var_offset, info.var_shape))
            pairs.append(
                (
                    ckpt_name,
                    label,
                    var,
                    lambda n=ckpt_name, ix=index, lb=info.full_name, s=tuple(info.full_shape): (
                        full_value(n, lb, s)[ix]
                    ),
                )
            )
        else:
            pairs.append((ckpt_name, label, var, lambda n=ckpt_name: ckpt[n]))
    report.unused = [n for n in ckpt.keys() if n not in used and n != OBJECT_GRAPH_KEY]
    return pairs, report


# --- object-based --------------------------------------------------------------


def _is_variable(obj) -> bool:
    return hasattr(obj, "assign") and hasattr(obj, "dtype") and hasattr(obj, "shape")


def _match_objects(tf, target, ckpt: Checkpoint):
    if OBJECT_GRAPH_KEY not in ckpt:
        raise CheckpointError(
            "an object-based restore needs a TF2 checkpoint (one with an "
            "object graph); pass a list of variables for a name-based one",
            path=ckpt.prefix,
        )
    graph = ObjectGraph.of(ckpt)
    # A tf.train.Checkpoint's own view knows its root: itself, or the object given
    # as tf.train.Checkpoint(root), with the keyword children attached to it.
    view = None
    if isinstance(target, tf.train.Checkpoint):
        view = getattr(getattr(target, "_saver", None), "_graph_view", None)
    if view is None:
        view = tf.train.TrackableView(target)
    matched: dict[int, object] = {0: view.root}
    queue = deque([0])
    pairs = []
    used = set()
    assigned = set()
    while queue:
        node_id = queue.popleft()
        obj = matched[node_id]
        node = graph.nodes[node_id]
        for attr in node.attributes:
            if attr.name == "VARIABLE_VALUE" and _is_variable(obj) and id(obj) not in assigned:
                if attr.checkpoint_key not in ckpt:
                    raise CheckpointError(
                        f"the object graph names {attr.checkpoint_key!r}, "
                        "which the checkpoint lacks",
                        path=ckpt.prefix,
                    )
                assigned.add(id(obj))
                used.add(attr.checkpoint_key)
                label = getattr(obj, "path", None) or getattr(obj, "name", attr.checkpoint_key)
                pairs.append(
                    (attr.checkpoint_key, label, obj, lambda k=attr.checkpoint_key: ckpt[k])
                )
        if not node.children:
            continue
        try:
            children = view.children(obj)
        except Exception:
            continue
        for ref in node.children:
            child = children.get(ref.local_name)
            if child is None or ref.node_id in matched:
                continue
            matched[ref.node_id] = child
            queue.append(ref.node_id)
    report = RestoreReport()
    live = [v for v in view.descendants() if _is_variable(v)]
    seen = set()
    for v in live:
        if id(v) in seen:
            continue
        seen.add(id(v))
        if id(v) not in assigned:
            report.missing.append(str(getattr(v, "path", None) or getattr(v, "name", repr(v))))
    report.unused = [n for n in ckpt.keys() if n not in used and n != OBJECT_GRAPH_KEY]
    return pairs, report
