"""``tfckpt dump model.meta``: what a TF1 graph file says, without TensorFlow: its
variables, its Saver and what the Saver restores, its collections, signatures and
placeholders, as JSON-ready data; ``tfckpt dump saved_model.pb`` says it of each of a
SavedModel's MetaGraphs.

The file is read whole (a graph is parsed in memory, as protobuf parses it) and refused
above :data:`~tfckpt.format.metagraph.MAX_FILE_BYTES`, protobuf's own limit.
"""

from __future__ import annotations

from tfckpt.errors import CheckpointNotFoundError, CorruptCheckpointError
from tfckpt.format.metagraph import (
    MAX_FILE_BYTES,
    VARIABLE_COLLECTIONS,
    GraphTensor,
    MetaGraph,
    RestoredValue,
    parse_meta_graph,
    parse_saved_model,
    saver_version,
)
from tfckpt.format.slices import format_slice
from tfckpt.io.storage import Storage, StorageOptions, normalize, storage_for

META_SUFFIX = ".meta"
SAVED_MODEL_PB = "saved_model.pb"


def read_capped(store: Storage, path: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the file ``path``, refused (before reading) when larger than ``limit``."""
    if not store.isfile(path):
        raise CheckpointNotFoundError("no such file", path=path)
    reader = store.open_reader(path)
    try:
        if reader.size > limit:
            raise CorruptCheckpointError(
                f"{reader.size} bytes, more than the {limit} a graph file can hold "
                "(protobuf's limit)",
                path=path,
            )
        buf = bytearray(reader.size)
        view = memoryview(buf)
        done = 0
        while done < reader.size:
            n = reader.readinto(view[done:], done)
            if n <= 0:
                raise CorruptCheckpointError(
                    f"the file ended after {done} of {reader.size} bytes", path=path
                )
            done += n
        return bytes(buf)
    finally:
        reader.close()


def is_meta_graph(path, storage_options: StorageOptions | None = None) -> bool:
    """Whether ``path`` names a graph file: one whose name ends in ``.meta``, or a
    SavedModel's ``saved_model.pb``."""
    p = normalize(path)
    store = storage_for(p, storage_options)
    named = p.lower().endswith(META_SUFFIX) or store.basename(p) == SAVED_MODEL_PB
    return named and store.isfile(p)


def read_meta_graph(path, storage_options: StorageOptions | None = None) -> MetaGraph:
    """The MetaGraphDef of the ``.meta`` file ``path``, parsed.

    >>> graph = read_meta_graph("train/model.ckpt-900.meta")
    """
    p = normalize(path)
    return parse_meta_graph(read_capped(storage_for(p, storage_options), p), p)


def meta_graph(path, *, storage_options: StorageOptions | None = None) -> dict:
    """What the graph file ``path`` holds, as ``tfckpt dump`` shows it; of a
    ``saved_model.pb``, ``{"path", "meta_graphs": [...]}`` with one such record each.

    ``{"path", "tensorflow_version", "tags", "nodes", "variables": [{"name", "dtype",
    "shape", "trainable", "resource", "partition": null or {"full_name", "full_shape",
    "offset", "shape"}, "collections"}], "saver": null or {"filename_tensor",
    "save_tensor", "restore_op", "version", "sharded", "max_to_keep",
    "keep_checkpoint_every_n_hours", "default", "restores": [{"key", "dtype",
    "full_shape", "slice", "variable", "shape", "validate_shape"}]}, "no_saver": null or
    why there is none, "collections": [{"name", "kind",
    "count", "items"}], "signatures": [{"key", "method_name", "inputs", "outputs"}],
    "placeholders": [{"name", "dtype", "shape", "with_default"}]}``. A shape is null
    when its rank is unknown, a dimension null when its size is.

    A graph without a ``saver_def`` is restored through the Saver ``import_meta_graph``
    builds then, over the ``variables`` and ``saveable_objects`` collections: its
    record has ``"default": true`` and null tensor names (TensorFlow names them as it
    builds it); ``"saver": null`` and ``"no_saver"`` saying why when it builds none.

    >>> tfckpt.inspection.meta_graph("train/model.ckpt-900.meta")["saver"]["version"]
    'V2'
    """
    p = normalize(path)
    store = storage_for(p, storage_options)
    if store.basename(p) == SAVED_MODEL_PB:
        graphs = parse_saved_model(read_capped(store, p), p)
        return {"path": p, "meta_graphs": [describe(g, p) for g in graphs]}
    return describe(parse_meta_graph(read_capped(store, p), p), p)


def describe(graph: MetaGraph, path: str) -> dict:
    """:func:`meta_graph`'s record of a parsed graph (``path`` names it)."""
    return {
        "path": path,
        "tensorflow_version": graph.tensorflow_version,
        "tags": graph.tags,
        "nodes": len(graph.proto.graph_def.node),
        "variables": [
            {
                "name": v.name,
                "dtype": v.dtype,
                "shape": _shape(v.shape),
                "trainable": v.trainable,
                "resource": v.resource,
                "partition": None
                if v.partition is None
                else {
                    "full_name": v.partition.full_name,
                    "full_shape": list(v.partition.full_shape),
                    "offset": list(v.partition.offset),
                    "shape": list(v.partition.shape),
                },
                "collections": list(v.collections),
            }
            for v in graph.variables()
        ],
        "saver": _saver(graph),
        "no_saver": graph.no_saver(),
        "collections": _collections(graph),
        "signatures": [
            {
                "key": key,
                "method_name": method,
                "inputs": [_tensor(t, k) for k, t in inputs.items()],
                "outputs": [_tensor(t, k) for k, t in outputs.items()],
            }
            for key, (method, inputs, outputs) in graph.signatures().items()
        ],
        "placeholders": [
            {**_tensor(t), "with_default": default} for t, default in graph.placeholders()
        ],
    }


def _shape(shape) -> list | None:
    return None if shape is None else list(shape)


def _tensor(t: GraphTensor, key: str | None = None) -> dict:
    return {
        **({} if key is None else {"key": key}),
        "name": t.name,
        "dtype": t.dtype,
        "shape": _shape(t.shape),
    }


def _saver(graph: MetaGraph) -> dict | None:
    saver = graph.saver()
    if saver is None:
        return None
    # The default Saver's op names are chosen as import_meta_graph builds it.
    named = not graph.default_saver
    return {
        "default": graph.default_saver,
        "filename_tensor": saver.filename_tensor_name if named else None,
        "save_tensor": saver.save_tensor_name if named else None,
        "restore_op": saver.restore_op_name if named else None,
        "version": saver_version(saver),
        "sharded": saver.sharded,
        "max_to_keep": saver.max_to_keep,
        "keep_checkpoint_every_n_hours": saver.keep_checkpoint_every_n_hours,
        "restores": [_restored(r) for r in graph.restored()],
    }


def _restored(r: RestoredValue) -> dict:
    return {
        "key": r.key,
        "dtype": r.dtype,
        "full_shape": None if r.full_shape is None else list(r.full_shape),
        "slice": None if r.slice is None else format_slice(r.slice),
        "variable": r.variable,
        "shape": _shape(r.shape),
        "validate_shape": r.validate_shape,
    }


def _collections(graph: MetaGraph) -> list[dict]:
    variables = graph.collection_variables()
    out = []
    for name in sorted(graph.proto.collection_def):
        c = graph.proto.collection_def[name]
        kind = c.WhichOneof("kind")
        items: list | None
        if kind is None:
            count, items = 0, []
        elif name in variables:
            items = [v.variable_name for v in variables[name]]
            count = len(items)
        elif kind == "bytes_list":
            count, items = len(c.bytes_list.value), None
        elif kind == "any_list":
            items = [a.type_url for a in c.any_list.value]
            count = len(items)
        else:
            items = list(getattr(c, kind).value)
            count = len(items)
        out.append({"name": name, "kind": kind, "count": count, "items": items})
    return out


__all__ = [
    "META_SUFFIX",
    "SAVED_MODEL_PB",
    "VARIABLE_COLLECTIONS",
    "is_meta_graph",
    "meta_graph",
    "read_meta_graph",
]
