"""``tfckpt dump``: every tensor's record (name, dtype, shape, bytes, shard), as dicts or
as the very JSON text the command line prints, and the TF2 object graph."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from itertools import groupby, repeat
from json.encoder import encode_basestring_ascii
from operator import itemgetter

from tfckpt.checkpoint.reader import Checkpoint
from tfckpt.errors import UnsupportedCheckpointError
from tfckpt.format.bundle import TensorTable
from tfckpt.format.natural import in_natural_order
from tfckpt.format.objectgraph import OBJECT_GRAPH_KEY, ObjectGraph, attribute_tensors
from tfckpt.inspection.reading import match_names


def dump(ckpt: Checkpoint, *, filter: str | None = None) -> dict:
    """Header facts, one record per tensor and bytes per top-level scope.

    Reads only the index. Field names are stable:
    ``{"prefix", "num_shards", "endianness", "version": {...}, "tensor_count",
    "total_bytes", "tensors": [{"name", "dtype", "shape", "bytes", "shard",
    "offset", "crc32c", "slices", "elements", "stored_elements"}], "scopes": [{"scope",
    "bytes", "tensors"}]}``. ``slices`` lists ``[[start, length_or_null], ...]`` per
    stored slice; ``shard``, ``offset`` and ``crc32c`` are null for partitioned
    tensors. ``stored_elements`` is below ``elements`` for a pre-sliced tensor, of
    which only some slices are stored.
    """
    data, table = _dump(ckpt, filter)
    data["tensors"] = [_record(table, i) for i in range(len(table))]
    return data


def dump_json(ckpt: Checkpoint, *, filter: str | None = None) -> str:
    """``json.dumps(dump(ckpt, filter=filter))``, the same text, built without a dict per
    tensor: an index of hundreds of thousands of tensors is listed in a fraction of the
    time."""
    return "".join(dump_json_parts(ckpt, filter=filter))


def dump_json_parts(ckpt: Checkpoint, *, filter: str | None = None) -> Iterator[str]:
    """The text of :func:`dump_json` in consecutive parts, made as they are taken (to
    print without holding it all: the records come some thousands at a time)."""
    data, table = _dump(ckpt, filter)
    data["tensors"] = []
    head, tail = json.dumps(data).split('"tensors": []', 1)
    yield head
    yield '"tensors": ['
    for start in range(0, len(table), _RECORDS_AT_ONCE):
        if start:
            yield ", "
        yield _records_json(table, start, start + _RECORDS_AT_ONCE)
    yield "]"
    yield tail


_RECORDS_AT_ONCE = 8192  # records made into one part of dump_json_parts


def _dump(ckpt: Checkpoint, filter: str | None) -> tuple[dict, TensorTable]:
    """``dump``'s data without its ``tensors``, and the table they come from."""
    # In natural order (_variables/2 before _variables/10), as people read them.
    names = in_natural_order(match_names(ckpt.keys(), filter))
    table = ckpt.table(names)
    # A tensor's scope is its name up to the first "/" (model of model/dense/kernel).
    # Sorted names keep a scope's tensors together, nearly always: one sum per run.
    row_scopes = list(map(itemgetter(0), map(str.partition, table.names, repeat("/"))))
    counts = Counter(row_scopes)
    sizes = dict.fromkeys(counts, 0)
    for scope, rows in groupby(zip(row_scopes, table.nbytes), itemgetter(0)):
        sizes[scope] += sum(map(itemgetter(1), rows))
    h = ckpt.header
    v1 = {"format": ckpt.format} if ckpt.format != Checkpoint.format else {}
    data = {
        "prefix": ckpt.prefix,
        **v1,
        "num_shards": h.num_shards,
        "endianness": h.endianness,
        "version": {
            "producer": h.version.producer,
            "min_consumer": h.version.min_consumer,
            "bad_consumers": list(h.version.bad_consumers),
        },
        "tensor_count": len(table),
        "total_bytes": sum(table.nbytes),
        "tensors": None,
        "scopes": [
            {"scope": s, "bytes": sizes[s], "tensors": counts[s]}
            for s in sorted(sizes, key=lambda s: (-sizes[s], s))
        ],
    }
    return data, table


def _record(table: TensorTable, i: int) -> dict:
    """Row ``i`` of ``table`` as a record of ``dump``: the one place its layout is written."""
    slices = table.slices[i]
    return {
        "name": table.names[i],
        "dtype": table.dtypes[i],
        "shape": list(table.shapes[i]),
        "bytes": table.nbytes[i],
        "shard": table.shards[i],
        "offset": table.offsets[i],
        "crc32c": table.crc32c[i],
        "slices": [[list(e) for e in s] for s in slices] if slices else [],
        "elements": table.elements[i],
        "stored_elements": table.stored_elements[i],
    }


def _records_json(table: TensorTable, start: int, stop: int) -> str:
    """``", ".join`` of ``json.dumps(_record(table, i))`` for rows ``start`` to ``stop``
    (at most), built in bulk.

    A whole tensor's record is written as json.dumps writes ``_record``'s dict (keys
    in order, default separators) from pieces: rows mostly share their dtype, shape
    and size, so each distinct middle and end is formatted once and rows are joined
    from them at C speed.
    """
    if start or stop < len(table):
        table = table.part(start, stop)
    if any(table.slices) or None in table.offsets or None in table.crc32c:
        # partitioned tensors, or a format without those fields: records one by one
        return ", ".join(json.dumps(_record(table, i)) for i in range(len(table)))
    middles = dict.fromkeys(zip(table.dtypes, table.shapes, table.nbytes, table.shards), "")
    for dtype, shape, nbytes, shard in middles:
        middles[dtype, shape, nbytes, shard] = (
            f', "dtype": "{dtype}", "shape": [{", ".join(map(str, shape))}], '
            f'"bytes": {nbytes}, "shard": {shard}, "offset": '
        )
    ends = dict.fromkeys(zip(table.elements, table.stored_elements), "")
    for elements, stored in ends:
        ends[elements, stored] = (
            f', "slices": [], "elements": {elements}, "stored_elements": {stored}}}'
        )
    rows = zip(
        repeat('{"name": '),
        map(encode_basestring_ascii, table.names),
        map(middles.__getitem__, zip(table.dtypes, table.shapes, table.nbytes, table.shards)),
        map(str, table.offsets),
        repeat(', "crc32c": '),
        map(str, table.crc32c),
        map(ends.__getitem__, zip(table.elements, table.stored_elements)),
    )
    return ", ".join(map("".join, rows))


# --- object graph ------------------------------------------------------------


def object_graph(ckpt: Checkpoint) -> dict:
    """The TF2 object graph as data: one record per node, reachable ones with their path.

    ``{"nodes": [{"id", "path", "children": [{"name", "node_id"}], "attributes":
    [{"name", "checkpoint_key", "dtype", "shape", "tensors": [{"name", "dtype",
    "shape"}]}], "slot_variables": [{"slot_name", "original_variable_node_id",
    "slot_variable_node_id"}]}]}``. ``tensors`` lists what TensorFlow reads for
    the attribute: its key, or for a saveable stored as several tensors the key
    plus each suffix (``dtype`` and ``shape`` then stay null); a missing tensor
    has a null ``dtype``. A path longer than ``objectgraph.PATH_CHARS`` keeps
    only its end, after a ``…``.
    """
    if OBJECT_GRAPH_KEY not in ckpt:
        raise UnsupportedCheckpointError(
            f"no {OBJECT_GRAPH_KEY}: a name-based (TF1) checkpoint has no object graph",
            path=ckpt.prefix,
        )
    graph = ObjectGraph.of(ckpt)
    node_paths = graph.paths()
    nodes = []
    for i, node in enumerate(graph.nodes):
        attrs = []
        for a in node.attributes:
            rec = {
                "name": a.name,
                "checkpoint_key": a.checkpoint_key,
                "dtype": None,
                "shape": None,
                "tensors": [],
            }
            for t in attribute_tensors(a.checkpoint_key, ckpt):
                info = ckpt.info(t) if t in ckpt else None
                rec["tensors"].append(
                    {
                        "name": t,
                        "dtype": None if info is None else info.dtype,
                        "shape": None if info is None else list(info.shape),
                    }
                )
            if rec["tensors"][0]["name"] == a.checkpoint_key:
                rec["dtype"], rec["shape"] = rec["tensors"][0]["dtype"], rec["tensors"][0]["shape"]
            attrs.append(rec)
        nodes.append(
            {
                "id": i,
                "path": node_paths.get(i),
                "children": [{"name": c.local_name, "node_id": c.node_id} for c in node.children],
                "attributes": attrs,
                "slot_variables": [
                    {
                        "slot_name": s.slot_name,
                        "original_variable_node_id": s.original_variable_node_id,
                        "slot_variable_node_id": s.slot_variable_node_id,
                    }
                    for s in node.slot_variables
                ],
            }
        )
    return {"prefix": ckpt.prefix, "nodes": nodes}
