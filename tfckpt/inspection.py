"""What is in a checkpoint, as plain data: the library side of ``tfckpt dump``.

Functions here return dicts and lists of JSON-ready values; printing them is the
CLI's job.

It runs past 600 lines because it holds the four read-only verbs (dump, diff, stats,
verify) and the checkpoint listing, which share the readers' chunked comparisons and
the record format, and the command line reaches them all through this one module.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from itertools import groupby, repeat
from json.encoder import encode_basestring_ascii
from operator import itemgetter

import numpy as np

from tfckpt.checkpoint.opening import open_checkpoint, open_in
from tfckpt.checkpoint.reader import DEFAULT_CHUNK_BYTES, Checkpoint
from tfckpt.errors import CheckpointError, CheckpointNotFoundError, UnsupportedCheckpointError
from tfckpt.format import dtypes as _dt
from tfckpt.format.bundle import TensorTable
from tfckpt.format.objectgraph import OBJECT_GRAPH_KEY, ObjectGraph, attribute_tensors
from tfckpt.format.slices import format_slice
from tfckpt.io import paths
from tfckpt.io.storage import Storage, StorageOptions, normalize, storage_for
from tfckpt.rewrite.cast import Caster


def _match(names: Iterable[str], pattern: str | None) -> list[str]:
    if pattern is None:
        return list(names)
    rx = re.compile(pattern)
    return [n for n in names if rx.search(n)]


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


def dump_json_parts(ckpt: Checkpoint, *, filter: str | None = None) -> list[str]:
    """The text of :func:`dump_json` in consecutive parts (to print without joining)."""
    data, table = _dump(ckpt, filter)
    data["tensors"] = []
    head, tail = json.dumps(data).split('"tensors": []', 1)
    return [head, '"tensors": [', _records_json(table), "]", tail]


def _dump(ckpt: Checkpoint, filter: str | None) -> tuple[dict, TensorTable]:
    """``dump``'s data without its ``tensors``, and the table they come from."""
    names = ckpt.keys()
    table = ckpt.table(None if filter is None else _match(names, filter))
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


def _records_json(table: TensorTable) -> str:
    """``", ".join`` of ``json.dumps(_record(table, i))`` for every row, built in bulk.

    A whole tensor's record is written as json.dumps writes ``_record``'s dict (keys
    in order, default separators) from pieces: rows mostly share their dtype, shape
    and size, so each distinct middle and end is formatted once and rows are joined
    from them at C speed.
    """
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


def _stored_chunks(ckpt: Checkpoint, name: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES):
    """A tensor's elements in chunks; of a pre-sliced tensor, those of its stored slices.

    A pre-sliced tensor's slices come in the order of their extents, so two
    checkpoints holding the same slices give the same sequence.
    """
    info = ckpt.info(name)
    if not info.partial:
        return ckpt.iter_chunks(name, chunk_bytes)
    # slice_info checks that slices do not overlap (overlaps are corrupt)
    stored = [part.extents for part in ckpt.slice_info(name) if part.extents is not None]
    order = sorted(stored, key=lambda ext: [(s, -1 if n is None else n) for s, n in ext])
    return (chunk for extents in order for chunk in ckpt.iter_chunks(name, chunk_bytes, extents))


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


# --- diff --------------------------------------------------------------------


def _paired_chunks(a: Iterator[np.ndarray], b: Iterator[np.ndarray]):
    """Re-cut two streams of 1-D chunks of equal total length into aligned pairs."""
    buf_a: np.ndarray | None = None
    buf_b: np.ndarray | None = None
    for chunk_a in a:
        buf_a = chunk_a if buf_a is None or not len(buf_a) else np.concatenate([buf_a, chunk_a])
        while buf_b is None or len(buf_b) < len(buf_a):
            nxt = next(b, None)
            if nxt is None:
                break
            buf_b = nxt if buf_b is None or not len(buf_b) else np.concatenate([buf_b, nxt])
        n = min(len(buf_a), len(buf_b) if buf_b is not None else 0)
        if n and buf_b is not None:
            yield buf_a[:n], buf_b[:n]
            buf_a, buf_b = buf_a[n:], buf_b[n:]


def _wide(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind == "c":
        return x.astype(np.complex128)
    if x.dtype.kind in "biu" and x.dtype.itemsize == 8:
        return x  # int64/uint64 compared exactly, not through float64
    return x.astype(np.float64)


def compare_values(
    a: Checkpoint,
    b: Checkpoint,
    name_a: str,
    name_b: str | None = None,
    *,
    atol: float = 0.0,
    rtol: float = 0.0,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> dict:
    """Element-wise comparison of two tensors of one shape, streamed, in the wider dtype.

    Returns ``{"elements", "differing", "max_abs", "max_rel"}``; NaNs in the same
    place count as equal. Strings are compared element by element. Pre-sliced
    tensors are compared over their stored slices (the same in both).
    """
    name_b = name_b or name_a
    ia, ib = a.info(name_a), b.info(name_b)
    elements = differing = 0
    max_abs = max_rel = 0.0
    if (ia.partial or ib.partial) and set(ia.slices) != set(ib.slices):
        raise UnsupportedCheckpointError(
            f"{name_a!r} stores {ia.stored_elements} of {ia.size} elements in {a.prefix}, "
            f"{ib.stored_elements} in {b.prefix}, in other slices: the values cannot be "
            "compared",
            path=a.prefix,
            tensor=name_a,
        )
    pairs = _paired_chunks(
        _stored_chunks(a, name_a, chunk_bytes), _stored_chunks(b, name_b, chunk_bytes)
    )
    strings = "string" in (ia.dtype, ib.dtype)
    for ca, cb in pairs:
        elements += len(ca)
        if strings:
            differing += sum(1 for x, y in zip(ca.tolist(), cb.tolist()) if x != y)
            continue
        if ca.dtype.fields or cb.dtype.fields:  # quantized: compare the stored integers
            ca = ca.view(ca.dtype[0]) if ca.dtype.fields else ca
            cb = cb.view(cb.dtype[0]) if cb.dtype.fields else cb
        wa, wb = _wide(ca), _wide(cb)
        if wa.dtype.kind in "iu" and wb.dtype.kind in "iu" and wa.dtype != wb.dtype:
            wa, wb = wa.astype(np.float64), wb.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            if wa.dtype.kind in "iu" and wa.dtype == wb.dtype:
                diff = np.abs(wa.astype(np.float64) - wb.astype(np.float64))
                bad = wa != wb
            else:
                diff = np.abs(wa - wb)
                both_nan = np.isnan(wa) & np.isnan(wb)
                same_inf = wa == wb
                diff = np.where(both_nan | same_inf, 0.0, diff)
                bad = ~(both_nan | same_inf)
                bad &= ~(diff <= atol + rtol * np.abs(wb))
            if diff.size:
                finite = diff[np.isfinite(diff)] if not np.isfinite(diff).all() else diff
                if diff.size != finite.size:
                    max_abs = float("inf")
                elif finite.size:
                    max_abs = max(max_abs, float(finite.max()))
                denom = np.abs(wb).astype(np.float64)
                rel = np.divide(
                    diff.astype(np.float64), denom, out=np.zeros(diff.shape), where=denom > 0
                )
                if rel.size:
                    max_rel = max(max_rel, float(np.nanmax(rel)))
        differing += int(np.count_nonzero(bad))
    return {
        "elements": elements,
        "differing": differing,
        "max_abs": None if strings else max_abs,
        "max_rel": None if strings else max_rel,
    }


def diff(
    a: Checkpoint,
    b: Checkpoint,
    *,
    atol: float = 0.0,
    rtol: float = 0.0,
    values: bool = True,
    filter: str | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> dict:
    """What differs between two checkpoints: names, dtypes and shapes, then values.

    ``{"a", "b", "only_in_a", "only_in_b", "changed": [{"name", "dtype_a",
    "dtype_b", "shape_a", "shape_b"}], "values": [{"name", "elements",
    "differing", "max_abs", "max_rel"}], "same": bool}``. ``values`` lists every
    common tensor of equal shape whose elements differ beyond ``atol + rtol*|b|``;
    tensors that only changed dtype (a float16 conversion) are compared too. A
    tensor stored in other slices in A than in B, one of them pre-sliced, is
    ``changed`` with ``stored_a``/``stored_b`` (stored elements) and not compared.
    """
    names_a = set(_match(a.keys(), filter)) - {OBJECT_GRAPH_KEY}
    names_b = set(_match(b.keys(), filter)) - {OBJECT_GRAPH_KEY}
    changed: list[dict[str, object]] = []
    value_diffs: list[dict[str, object]] = []
    for name in sorted(names_a & names_b):
        ia, ib = a.info(name), b.info(name)
        stored_differently = (ia.partial or ib.partial) and set(ia.slices) != set(ib.slices)
        if ia.dtype != ib.dtype or ia.shape != ib.shape or stored_differently:
            changed.append(
                {
                    "name": name,
                    "dtype_a": ia.dtype,
                    "dtype_b": ib.dtype,
                    "shape_a": list(ia.shape),
                    "shape_b": list(ib.shape),
                }
            )
            if stored_differently:
                changed[-1].update(stored_a=ia.stored_elements, stored_b=ib.stored_elements)
                continue
        if values and ia.shape == ib.shape and ia.dtype == ib.dtype == "variant":
            result = _compare_variants(a, b, name, ia)
            if result["differing"]:
                value_diffs.append({"name": name, **result})
            continue
        if not values or ia.shape != ib.shape or not _comparable(ia.dtype, ib.dtype):
            continue
        result = compare_values(a, b, name, atol=atol, rtol=rtol, chunk_bytes=chunk_bytes)
        if result["differing"]:
            value_diffs.append({"name": name, **result})
    only_a, only_b = sorted(names_a - names_b), sorted(names_b - names_a)
    return {
        "a": a.prefix,
        "b": b.prefix,
        "only_in_a": only_a,
        "only_in_b": only_b,
        "changed": changed,
        "values": value_diffs,
        "same": not (only_a or only_b or changed or value_diffs),
    }


def _compare_variants(a: Checkpoint, b: Checkpoint, name: str, info) -> dict:
    """Variant elements compared by their serialized bytes (their only form here)."""
    elements = differing = 0
    for extents in info.slices or [None]:
        ea, eb = a.variant_elements(name, extents), b.variant_elements(name, extents)
        elements += len(ea)
        differing += sum(x != y for x, y in zip(ea, eb)) + abs(len(ea) - len(eb))
    return {"elements": elements, "differing": differing, "max_abs": None, "max_rel": None}


def _comparable(dtype_a: str, dtype_b: str) -> bool:
    kinds = [_dt.lookup(d) for d in (dtype_a, dtype_b)]
    if any(k.kind == "opaque" for k in kinds):
        return False
    return (kinds[0].kind == "string") == (kinds[1].kind == "string")


# --- stats -------------------------------------------------------------------

CAST_CHECK_TARGETS = ("float16", "bfloat16")


def stats(
    ckpt: Checkpoint, *, filter: str | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> dict:
    """Per-tensor statistics, streamed in bounded chunks.

    For each numeric tensor: ``min``, ``max`` (over non-NaN values), ``mean``,
    ``std`` (over finite values), ``nan``, ``inf``, ``zeros`` (fraction), and for
    floating-point tensors ``cast``: for float16 and bfloat16, how many values
    would overflow, become zero or become subnormal if cast. A pre-sliced tensor's
    statistics are over its stored elements, counted in ``stored_elements``.
    """
    out = []
    for name in _match(ckpt.keys(), filter):
        info = ckpt.info(name)
        dt = _dt.lookup(info.dtype)
        rec = {"name": name, "dtype": info.dtype, "shape": list(info.shape), "elements": info.size}
        if info.partial:
            rec["stored_elements"] = info.stored_elements
        if dt.numpy is None or dt.kind == "string":
            out.append(rec)
            continue
        acc = _Moments()
        casters = {
            t: Caster(dt, _dt.lookup(t), "inf")
            for t in CAST_CHECK_TARGETS
            if dt.is_floating and dt.name != t
        }
        for chunk in _stored_chunks(ckpt, name, chunk_bytes):
            if chunk.dtype.fields:
                chunk = chunk.view(chunk.dtype[0])
            with np.errstate(all="ignore"):
                acc.add(chunk)
            for c in casters.values():
                c(chunk)
        rec.update(acc.result())
        if casters:
            rec["cast"] = {
                t: {
                    "overflow": c.counts.overflow,
                    "to_zero": c.counts.to_zero,
                    "subnormal": c.counts.subnormal,
                }
                for t, c in casters.items()
            }
        out.append(rec)
    return {"prefix": ckpt.prefix, "tensors": out}


class _Moments:
    """Streaming min/max/mean/std (Chan et al.'s pairwise update) and counts."""

    def __init__(self):
        self.n = self.count = self.nan = self.inf = self.zeros = 0
        self.mean = self.m2 = 0.0
        self.min = self.max = None

    def add(self, chunk: np.ndarray) -> None:
        self.count += chunk.size
        if chunk.dtype.kind == "c":
            x = chunk.astype(np.complex128)
            self.nan += int(np.count_nonzero(np.isnan(x)))
            self.inf += int(np.count_nonzero(np.isinf(x)))
            self.zeros += int(np.count_nonzero(x == 0))
            return
        x = chunk.astype(np.float64)
        nan = np.isnan(x)
        self.nan += int(np.count_nonzero(nan))
        finite = np.isfinite(x)
        self.inf += int(np.count_nonzero(~finite & ~nan))
        self.zeros += int(np.count_nonzero(x == 0))
        valid = x[~nan]
        if valid.size:
            lo, hi = valid.min(), valid.max()
            if chunk.dtype.kind in "iub":
                lo, hi = chunk[~nan].min(), chunk[~nan].max()
            self.min = lo if self.min is None else min(self.min, lo)
            self.max = hi if self.max is None else max(self.max, hi)
        f = x[finite]
        if f.size:
            n_b, mean_b = f.size, float(f.mean())
            m2_b = float(((f - mean_b) ** 2).sum())
            if self.n == 0:
                self.n, self.mean, self.m2 = n_b, mean_b, m2_b
                return
            delta = mean_b - self.mean
            total = self.n + n_b
            self.mean += delta * (n_b / total)
            self.m2 += m2_b + delta * delta * (self.n / total) * n_b
            self.n = total

    def result(self) -> dict:
        def py(v):
            return None if v is None else (v.item() if hasattr(v, "item") else v)

        return {
            "min": py(self.min),
            "max": py(self.max),
            "mean": self.mean if self.n else None,
            "std": (self.m2 / self.n) ** 0.5 if self.n else None,
            "nan": self.nan,
            "inf": self.inf,
            "zeros": self.zeros / self.count if self.count else 0.0,
        }


# --- every checkpoint of a directory --------------------------------------------


def checkpoints(directory, *, storage_options: StorageOptions | None = None) -> dict:
    """Every checkpoint in a directory: ``{"directory", "state_file", "latest",
    "checkpoints": [{"prefix", "name", "step", "format", "tensors", "bytes",
    "in_state_file", "latest", "error"}]}``.

    Those the ``checkpoint`` state file lists come first, in its order (oldest
    first; their paths found beside the state file when they are from elsewhere,
    with a :class:`~tfckpt.CheckpointPathWarning`), then every other ``.index``
    in the directory, steps in numeric order. ``step`` is the number ending the
    name (``model.ckpt-1000``), ``bytes`` the size of the index and data files
    (of every file, for a V1 checkpoint). Each checkpoint's index is read; one
    that cannot be opened keeps its row, with ``error`` saying why.

    >>> [(c["name"], c["step"]) for c in tfckpt.list_checkpoints("train")["checkpoints"]]
    [('model.ckpt-3', 3), ('model.ckpt-4', 4), ('model.ckpt-5', 5)]
    """
    directory = normalize(directory)
    store = storage_for(directory, storage_options)
    if not store.isdir(directory):
        raise CheckpointNotFoundError("not a directory", path=directory)
    directory = store.dir_path(directory)
    listed = paths.state_file_checkpoints(store, directory)
    in_state, latest = listed if listed is not None else ([], None)
    # A Saver's state file names absolute paths: the directory's own files are the
    # same checkpoints however the directory was named.
    listed_at = {store.realpath(p) for p in in_state}
    others = [
        p for p in paths.bundle_prefixes(store, directory) if store.realpath(p) not in listed_at
    ]
    prefixes = list(dict.fromkeys(in_state + others))
    rows = []
    for prefix in prefixes:
        row: dict = {
            "prefix": prefix,
            "name": store.basename(prefix),
            "step": paths.checkpoint_step(store.basename(prefix)),
            "format": None,
            "tensors": None,
            "bytes": None,
            "in_state_file": prefix in in_state,
            "latest": prefix == latest,
            "error": None,
        }
        try:
            with open_in(store, prefix) as ckpt:
                files = (
                    [ckpt.index_path, *ckpt.data_files]
                    if ckpt.format == Checkpoint.format
                    else list(getattr(ckpt, "files", []))
                )
                row.update(
                    format=ckpt.format, tensors=len(ckpt), bytes=_file_bytes(ckpt.storage, files)
                )
        except (CheckpointError, OSError) as e:
            if isinstance(e, CheckpointError):
                row["error"] = str(e)
            else:  # a data file the index needs, gone or unreadable
                row["error"] = f"{e.filename}: {e.strerror}" if e.filename else str(e)
        rows.append(row)
    return {
        "directory": directory,
        "state_file": listed is not None,
        "latest": latest,
        "checkpoints": rows,
    }


def _file_bytes(store: Storage, files: list[str]) -> int:
    total = 0
    for f in files:
        reader = store.open_reader(f)
        try:
            total += reader.size
        finally:
            reader.close()
    return total


# --- verify ------------------------------------------------------------------


def verify(
    path,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    storage_options: StorageOptions | None = None,
) -> dict:
    """A full integrity check: ``{"prefix", "tensors", "bytes", "problems", "warnings"}``.

    Checks every index block checksum, every tensor's CRC32C, that every entry
    lies inside its shard, the shard files against the header, that slices cover
    each partitioned tensor exactly once, string framing, and that the object
    graph parses and every ``checkpoint_key`` in it exists. Problems are listed,
    one line each, instead of stopping at the first; ``warnings`` lists what is odd
    but harmless (data files of another shard count at the same prefix); ``partial``
    lists, as information, each pre-sliced tensor (slices that leave parts out, as
    TensorFlow writes them on purpose): its stored slices are checked like any other.
    """
    problems: list[str] = []
    try:
        ckpt = open_checkpoint(path, verify=True, storage_options=storage_options)
    except CheckpointNotFoundError:
        raise  # nothing to verify: a usage error, not a finding
    except CheckpointError as e:
        return {
            "prefix": str(path),
            "tensors": 0,
            "bytes": 0,
            "problems": [str(e)],
            "warnings": [],
            "partial": [],
        }
    with ckpt:
        shard_problems, warnings = _check_shard_files(ckpt)
        problems += shard_problems
        checked = nbytes = 0
        partial = []
        for name in ckpt.keys():
            try:
                info = ckpt.info(name)
                if info.dtype == "variant":  # no numpy values: check the framed bytes
                    for extents in info.slices or [None]:
                        ckpt.read_bytes(name, extents)
                else:
                    for _ in _stored_chunks(ckpt, name, chunk_bytes):
                        pass
                if info.partial:
                    partial.append(_partial_note(ckpt, info))
                checked += 1
                nbytes += info.nbytes
            except CheckpointError as e:
                problems.append(str(e))
        for key in ckpt.orphan_slice_keys():
            problems.append(f"{ckpt.index_path}: slice entry {key!r} belongs to no tensor")
        if OBJECT_GRAPH_KEY in ckpt:
            try:
                graph = ObjectGraph.of(ckpt)
                for missing in graph.missing_keys(set(ckpt.keys())):
                    problems.append(
                        f"{ckpt.prefix}: the object graph names {missing!r}, which "
                        "the checkpoint lacks"
                    )
            except CheckpointError as e:
                problems.append(str(e))
        return {
            "prefix": ckpt.prefix,
            "tensors": checked,
            "bytes": nbytes,
            "problems": problems,
            "warnings": warnings,
            "partial": partial,
        }


def _partial_note(ckpt: Checkpoint, info) -> str:
    return (
        f"{ckpt.prefix}: tensor {info.name!r}: pre-sliced, {info.stored_elements} of "
        f"{info.size} elements stored in {len(info.slices)} slice(s) "
        f"({' '.join(format_slice(s) for s in info.slices)})"
    )


def _check_shard_files(ckpt: Checkpoint) -> tuple[list[str], list[str]]:
    """The data files on disk against the header's shard count (one directory listing).

    Missing shards are problems; data files of the same prefix with another shard
    count (left by an earlier checkpoint) are only warnings: nothing reads them.
    """
    if ckpt.format != Checkpoint.format:
        return [], []  # a V1 checkpoint's files were all read when it was opened
    store = ckpt.storage
    directory = store.dirname(ckpt.prefix) or "."
    base = store.basename(ckpt.prefix)
    n = ckpt.header.num_shards
    present, problems, warnings = set(), [], []
    for name in sorted(store.listdir(directory)):
        parsed = paths.parse_data_filename(name)
        if not parsed or parsed[0] != base:
            continue
        if parsed[2] != n:
            warnings.append(
                f"{store.join(directory, name)}: data file of a {parsed[2]}-shard "
                f"checkpoint, but the header says {n}; it is not part of this one"
            )
        elif parsed[1] < n:
            present.add(parsed[1])
            path = store.join(directory, name)
            if store.irregular(path):
                problems.append(f"{path}: data shard is not a regular file")
    missing = [i for i in range(min(n, len(present) + 6)) if i not in present]
    for i in missing[:5]:
        problems.append(f"{paths.data_filename(ckpt.prefix, i, n)}: data shard is missing")
    if n - len(present) > 5:
        problems.append(f"{ckpt.prefix}: {n - len(present)} of {n} data shards are missing")
    return problems, warnings
