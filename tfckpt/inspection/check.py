"""``tfckpt check CKPT --against TARGET``: would restoring CKPT into TARGET succeed?

TARGET is read by the first of :data:`TARGET_READERS` that knows it: a TF1 graph file
(``.meta``: what its Saver restores), a SavedModel directory (the object graph of its
``variables/variables`` when it is a TF2 one, else the Saver of its MetaGraph), or a
checkpoint standing for the program that wrote it (a template: a TF2 checkpoint's object
graph, a TF1 checkpoint's names, with their dtypes and shapes); a Keras 2 HDF5 file
(what ``model.load_weights`` does in the model that wrote it) is read by
:func:`tfckpt.checkpoint.h5target.keras_h5_target`, registered first. Each reader returns a
:class:`Target`, which says what a restore reads from a given checkpoint; a new kind of
target is one more reader (:func:`register_target_reader`). What is compared, and how,
is :func:`tfckpt.checkpoint.restoring.check_restore`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from tfckpt.checkpoint.h5target import keras_h5_target
from tfckpt.checkpoint.opening import open_checkpoint, open_in
from tfckpt.checkpoint.restoring import (
    Expectation,
    RestoreCheck,
    Restorer,
    Wanted,
    check_restore,
)
from tfckpt.errors import CheckpointError, UnsupportedCheckpointError
from tfckpt.format.metagraph import MetaGraph, parse_meta_graph, parse_saved_model, saver_version
from tfckpt.format.objectgraph import OBJECT_GRAPH_KEY, ObjectGraph, attribute_tensors
from tfckpt.format.objectmatch import match_graphs
from tfckpt.format.slices import format_slice
from tfckpt.format.tf2names import VALUE_SUFFIX
from tfckpt.inspection.meta import META_SUFFIX, SAVED_MODEL_PB, read_capped
from tfckpt.io.storage import Storage, StorageOptions, normalize, storage_for

SERVING_TAG = "serve"


class Target(Protocol):
    """Something a checkpoint is restored into, read from a file."""

    label: str  # what it is, for the report

    def expect(self, ckpt) -> Expectation: ...

    def close(self) -> None: ...


TargetReader = Callable[[Storage, str], "Target | None"]


# --- TF1 graphs: what the Saver restores --------------------------------------------------


class SaverTarget:
    """The Saver of a TF1 graph (a ``.meta`` file, a TF1 SavedModel's MetaGraph); of a
    graph without a ``saver_def``, the default Saver ``import_meta_graph`` builds."""

    def __init__(self, graph: MetaGraph, label: str):
        self.graph = graph
        saver = graph.saver()
        if saver is None:
            raise UnsupportedCheckpointError(
                "the graph has no saver_def, and import_meta_graph builds no Saver for it: "
                f"{graph.no_saver()}",
                path=graph.path,
            )
        kind = "default Saver" if graph.default_saver else "Saver"
        self.label = f"{label} ({kind} {saver_version(saver)})"

    def close(self) -> None:
        pass

    def expect(self, ckpt) -> Expectation:
        restored = self.graph.restored()
        keys = {r.key for r in restored}
        notes = []
        aliases: dict[str, str] = {}
        if OBJECT_GRAPH_KEY in ckpt and not all(k in ckpt for k in keys):
            # Saver.restore falls back to a TF2 checkpoint's object graph: its
            # attributes' full names are the variables' names.
            graph = ObjectGraph.of(ckpt)
            aliases = {a.full_name: a.checkpoint_key for n in graph.nodes for a in n.attributes}
            notes.append("names looked up by the full names the checkpoint's object graph records")
        wanted = []
        for r in restored:
            label = r.variable or r.key
            wanted.append(
                Wanted(
                    key=r.key if r.key in ckpt else aliases.get(r.key, r.key),
                    variable=label,
                    dtype=r.dtype or None,
                    shape=r.full_shape if r.slice is not None else r.shape,
                    slice=r.slice,
                    validate_shape=r.validate_shape,
                    exact_shape=r.variable is not None,
                )
            )
        return Expectation(wanted, notes=notes)


def meta_graph_target(store: Storage, path: str) -> Target | None:
    if not path.lower().endswith(META_SUFFIX) or not store.isfile(path):
        return None
    return SaverTarget(parse_meta_graph(read_capped(store, path), path), path)


# --- TF2: a template's object graph ----------------------------------------------------------


class TemplateTarget:
    """A checkpoint standing for the program that wrote it: its objects (TF2) or names
    (TF1), with their dtypes and shapes, are what that program restores."""

    def __init__(self, template, label: str):
        self.template = template
        self.label = label

    def close(self) -> None:
        self.template.close()

    def expect(self, ckpt) -> Expectation:
        if OBJECT_GRAPH_KEY in self.template:
            return self._objects(ckpt)
        return self._names()

    def _names(self) -> Expectation:
        wanted = []
        for name in self.template.keys():
            info = self.template.info(name)
            if not info.slices:
                wanted.append(Wanted(name, name, info.dtype, tuple(info.shape)))
            for extents in info.slices:  # a TF1 partitioned variable reads its partitions
                label = f"{name}[{format_slice(extents)}]"
                wanted.append(Wanted(name, label, info.dtype, tuple(info.shape), extents))
        return Expectation(wanted)

    def _objects(self, ckpt) -> Expectation:
        live = ObjectGraph.of(self.template)
        if OBJECT_GRAPH_KEY not in ckpt:
            raise UnsupportedCheckpointError(
                f"{self.label} restores objects, and this checkpoint has no object graph: "
                "a TF2 program restores only TF2 checkpoints (graft makes one)",
                path=ckpt.prefix,
            )
        saved = ObjectGraph.of(ckpt)
        pairs = match_graphs(live, saved)
        paths = live.paths()
        wanted = []
        for i, node in enumerate(live.nodes):
            if not node.attributes or i not in paths:
                continue
            theirs = (
                {a.name: a.checkpoint_key for a in saved.nodes[pairs[i]].attributes}
                if (i in pairs)
                else {}
            )
            for a in node.attributes:
                label = a.checkpoint_key.removesuffix(VALUE_SUFFIX)
                names = attribute_tensors(a.checkpoint_key, self.template)
                info = self.template.info(names[0]) if names == (a.checkpoint_key,) else None
                key = theirs.get(a.name)
                why = None
                if key is None:
                    why = (
                        f"the checkpoint's object graph has no object at {paths[i]!r}"
                        if i not in pairs
                        else f"its object {paths[i]!r} has no attribute {a.name!r}"
                    )
                wanted.append(
                    Wanted(
                        key,
                        label,
                        None if info is None else info.dtype,
                        None if info is None else tuple(info.shape),
                        exact_shape=a.name == "VARIABLE_VALUE",
                        why=why,
                    )
                )
        consumable = {
            t
            for n in saved.nodes
            for a in n.attributes
            for t in attribute_tensors(a.checkpoint_key, ckpt)
        }
        return Expectation(wanted, consumable)


def checkpoint_target(store: Storage, path: str) -> Target | None:
    try:
        template = open_in(store, path)
    except CheckpointError:
        return None
    kind = "TF2 object graph" if OBJECT_GRAPH_KEY in template else "TF1 names"
    return TemplateTarget(template, f"{template.prefix} (template: its {kind})")


# --- SavedModels ------------------------------------------------------------------------------


def saved_model_target(store: Storage, path: str) -> Target | None:
    directory = path
    if store.basename(path) == SAVED_MODEL_PB and store.isfile(path):
        directory = store.dirname(path)
    pb = store.join(directory, SAVED_MODEL_PB)
    if not store.isdir(directory) or not store.isfile(pb):
        return None
    variables = store.join(directory, "variables", "variables")
    if store.isfile(variables + ".index"):
        values = open_in(store, variables)
        if OBJECT_GRAPH_KEY in values:
            return TemplateTarget(values, f"{directory} (TF2 SavedModel: its object graph)")
        values.close()
    graphs = parse_saved_model(read_capped(store, pb), pb)
    chosen = next((g for g in graphs if SERVING_TAG in g.tags), graphs[0])
    tags = ",".join(chosen.tags) or "no tags"
    return SaverTarget(chosen, f"{directory} (SavedModel MetaGraph {tags})")


TARGET_READERS: list[TargetReader] = [saved_model_target, meta_graph_target, checkpoint_target]


def register_target_reader(reader: TargetReader) -> None:
    """Try ``reader`` before the others: it returns a :class:`Target` for a path it
    knows, None for any other."""
    TARGET_READERS.insert(0, reader)


# A Keras HDF5 file stands for the model that wrote it; tried before the template reader,
# which would take it as a checkpoint of names.
register_target_reader(keras_h5_target)


def read_target(path, storage_options: StorageOptions | None = None) -> Target:
    """The :class:`Target` ``path`` designates; an error when no reader knows it."""
    p = normalize(path)
    store = storage_for(p, storage_options)
    for reader in TARGET_READERS:
        target = reader(store, p)
        if target is not None:
            return target
    raise UnsupportedCheckpointError(
        "not a target to check against: a .meta graph, a SavedModel directory, a Keras .h5 "
        "file or a checkpoint is",
        path=p,
    )


def check_target(
    ckpt,
    target: Target,
    *,
    restorer: Restorer = "tensorflow",
    allow_missing: bool = False,
    assert_consumed: bool = False,
) -> RestoreCheck:
    """:func:`check_restore` of the open checkpoint ``ckpt`` against ``target``."""
    expected = target.expect(ckpt)
    result = check_restore(
        ckpt,
        expected.wanted,
        target=target.label,
        restorer=restorer,
        allow_missing=allow_missing,
        assert_consumed=assert_consumed,
        consumable=expected.consumable,
    )
    result.notes.extend(expected.notes)
    if expected.problems:
        named = {f.tensor for f in expected.problems}
        result.findings = [
            f for f in result.findings if not (f.kind == "unused" and f.tensor in named)
        ] + expected.problems
    return result


def check(
    checkpoint,
    against,
    *,
    restorer: Restorer = "tensorflow",
    allow_missing: bool = False,
    assert_consumed: bool = False,
    storage_options: StorageOptions | None = None,
) -> RestoreCheck:
    """Would restoring ``checkpoint`` into ``against`` succeed? Decided from the files,
    before TensorFlow runs. ``restorer="tfckpt"``: as :func:`tfckpt.restore` restores
    (casting floating-point values); ``allow_missing``: as ``expect_partial()``;
    ``assert_consumed``: as ``assert_consumed()``, every tensor must be read.

    >>> result = tfckpt.check("train/model.ckpt-900", "export/model.meta")
    >>> result.ok, [f.detail for f in result.failures()]
    """
    target = read_target(against, storage_options)
    try:
        with open_checkpoint(checkpoint, storage_options=storage_options) as ckpt:
            return check_target(
                ckpt,
                target,
                restorer=restorer,
                allow_missing=allow_missing,
                assert_consumed=assert_consumed,
            )
    finally:
        target.close()
