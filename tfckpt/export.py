"""Leaving TensorFlow and coming back: checkpoints to safetensors / npz, and back.

:func:`export` plans with :func:`~tfckpt.plan` (so selection, renaming and casts
work as for every transform), then streams each tensor chunk by chunk through
the cast into the writers of :mod:`tfckpt.tensorfiles`; ``permute`` reorders
axes tile by tile. Files are written under temporary names and renamed into
place at the end, the index of a sharded export last. :func:`import_` reads
such files into a V2 checkpoint with the engine's shard writer and commit.
"""

from __future__ import annotations

import functools
import io
import json
import operator
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from . import dtypes as _dt
from . import paths
from . import tensorfiles as tfiles
from .cast import Caster
from .commit import (
    commit_shards,
    data_files,
    discard,
    free_shard_count,
    remove_stale_temporaries,
    temporary_base,
)
from .errors import CastOverflowError, CheckpointError, CheckpointWriteError
from .objectgraph import OBJECT_GRAPH_KEY, ObjectGraph, attribute_tensors
from .options import Options
from .pipeline import prefetch
from .planner import DtypePolicy, Plan, PlannedTensor, _compile_rules, _new_name, _patterns, plan
from .reader import Checkpoint
from .storage import (
    ReaderFile,
    StorageOptions,
    normalize,
    storage_for,
    takes_storage_options,
)
from .writer import ShardWriter

# TF2 keys end in this for a variable's value; the rest is the object path.
VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
# The edges to an optimizer (tf.train.Checkpoint(optimizer=...), a Keras model's).
OPTIMIZER_EDGES = frozenset({"optimizer"})

Permutes = Sequence[tuple[str, Sequence[int]]]


@dataclass
class ExportSummary:
    """What an export or import wrote (or, dry, would write)."""

    out: str
    files: list[str]
    tensors: list[dict]  # name, new_name, dtype, new_dtype, shape, file, permute
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (name, why)
    dropped: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    cast_counts: dict[str, int] = field(default_factory=dict)  # overflows per tensor

    def to_dict(self) -> dict:
        return {
            "out": self.out,
            "files": self.files,
            "tensors": self.tensors,
            "skipped": [{"name": n, "reason": r} for n, r in self.skipped],
            "dropped": self.dropped,
            "bytes_out": self.bytes_out,
            "seconds": self.seconds,
            "overflow": self.cast_counts,
        }


def parse_permutes(items: Iterable[str]) -> list[tuple[str, tuple[int, ...]]]:
    """``REGEX=AXES`` strings (``'kernel$=1,0'``) as (regex, axes) pairs."""
    out = []
    for item in items:
        rx, sep, axes = item.rpartition("=")
        try:
            perm = tuple(int(a) for a in axes.split(","))
        except ValueError:
            perm = ()
        if not sep or not perm:
            raise CheckpointError(f"--permute takes REGEX=AXES (e.g. 'kernel$=1,0'), not {item!r}")
        out.append((rx, perm))
    return out


class _Permuter:
    """Which permutation, if any, applies to a tensor: the first rule whose regex
    (``re.search``) matches its new name."""

    def __init__(self, rules: Permutes):
        self.rules = []
        for rx, perm in rules:
            try:
                self.rules.append((re.compile(rx), tuple(operator.index(a) for a in perm)))
            except re.error as e:
                raise CheckpointError(f"bad --permute pattern {rx!r}: {e}") from None
            except TypeError:
                raise CheckpointError(
                    f"--permute {rx!r}: the axes must be whole numbers, not {perm!r}"
                ) from None

    def __call__(
        self, name: str, shape: tuple[int, ...], *, path: str | None = None
    ) -> tuple[int, ...] | None:
        for rx, perm in self.rules:
            if rx.search(name):
                if sorted(perm) != list(range(len(shape))):
                    raise CheckpointError(
                        f"permutation {list(perm)} does not fit shape {list(shape)}",
                        tensor=name,
                        path=path,
                    )
                return None if perm == tuple(range(len(shape))) else perm
        return None


def tiles(
    read: Callable[[int, int], np.ndarray] | None,
    shape: tuple[int, ...],
    perm: tuple[int, ...],
    itemsize: int,
    chunk_bytes: int,
    *,
    band: Callable[[int, int], np.ndarray] | None = None,
) -> Iterator[np.ndarray]:
    """The tensor ``read(start, count)`` gives (row-major elements) with axes
    permuted, as consecutive flat pieces of the result in bounded memory.

    Each piece is a band of the result's first axis, which is one axis ``a`` of
    the source: a band reads one run of elements per index of the axes before
    ``a``. A piece holds about ``chunk_bytes / 2`` (so the band and its reordered
    copy hold ``chunk_bytes``), or one row of the result if that is larger.
    ``band(j0, j1)``, if given, is used instead of ``read``: the source's indices
    ``[j0, j1)`` of axis ``a``, all of the other axes.
    """
    a = perm[0]
    out_row = int(np.prod([shape[p] for p in perm[1:]], dtype=np.int64)) * itemsize
    rows = max(1, (chunk_bytes // 2) // max(out_row, 1))
    for j0 in range(0, shape[a], rows):
        j1 = min(j0 + rows, shape[a])
        if band is not None:
            box = band(j0, j1)
        else:
            assert read is not None
            box = read_band(read, shape, a, j0, j1)
        yield np.ascontiguousarray(box.transpose(perm)).reshape(-1)


def read_band(
    read: Callable[[int, int], np.ndarray],
    shape: tuple[int, ...],
    a: int,
    j0: int,
    j1: int,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Indices ``[j0, j1)`` of axis ``a`` of the row-major tensor ``read(start,
    count)`` gives: one run of elements per index of the axes before ``a``,
    into ``out`` (of that band's shape) if given."""
    outer = int(np.prod(shape[:a], dtype=np.int64))
    inner = int(np.prod(shape[a + 1 :], dtype=np.int64))
    count = (j1 - j0) * inner
    run_shape = (j1 - j0,) + shape[a + 1 :]
    for o in range(outer):
        run = read((o * shape[a] + j0) * inner, count)
        if out is None:
            out = np.empty(shape[:a] + run_shape, dtype=run.dtype)
        # ``out`` may be a strided view: runs go in by index, never through a reshape.
        out[np.unravel_index(o, shape[:a]) if a else ()] = run.reshape(run_shape)
    if out is None:  # no elements
        out = read(0, 0).reshape(shape[:a] + run_shape)
    return out


def _read_slice_elements(ckpt: Checkpoint, name: str, extents, start: int, count: int):
    return ckpt.read_elements(name, start, count, extents)


def _partitioned_band(ckpt: Checkpoint, name: str, info, a: int, j0: int, j1: int) -> np.ndarray:
    """Indices ``[j0, j1)`` of axis ``a`` of a partitioned tensor, from the part of
    each slice that falls in them."""
    shape = info.shape
    box = np.empty(shape[:a] + (j1 - j0,) + shape[a + 1 :], dtype=_dt.lookup(info.dtype).numpy)
    for extents in info.slices:
        bounds = [(0, n) if ln is None else (s, s + ln) for (s, ln), n in zip(extents, shape)]
        lo, hi = max(bounds[a][0], j0), min(bounds[a][1], j1)
        if lo >= hi:
            continue
        part_shape = tuple(e - s for s, e in bounds)
        index = tuple(
            slice(lo - j0, hi - j0) if k == a else slice(s, e) for k, (s, e) in enumerate(bounds)
        )
        read_band(
            functools.partial(_read_slice_elements, ckpt, name, extents),
            part_shape,
            a,
            lo - bounds[a][0],
            hi - bounds[a][0],
            out=box[index],
        )
    return box


# -- export


@dataclass
class _Out:
    """One planned output tensor of an export."""

    pt: PlannedTensor
    perm: tuple[int, ...] | None

    @property
    def shape(self) -> tuple[int, ...]:
        s = self.pt.info.shape
        return s if self.perm is None else tuple(s[p] for p in self.perm)

    @property
    def entry(self) -> tfiles.Entry:
        return tfiles.Entry(self.pt.new_name, self.pt.new_dtype, self.shape)


def _format_of(out: str, fmt: str | None) -> str:
    if fmt is None:
        fmt = next((f for f in tfiles.FORMATS if out.endswith("." + f)), None)
        if fmt is None:
            raise CheckpointError(
                "cannot tell the format from the name: end it in .safetensors or .npz, "
                "or give format",
                path=out,
            )
    if fmt not in tfiles.FORMATS:
        raise CheckpointError(f"format must be one of {', '.join(tfiles.FORMATS)}, not {fmt!r}")
    return fmt


def _tf2_names(ckpt: Checkpoint, keep_keys: bool) -> tuple[dict[str, str], set[str]]:
    """A TF2 checkpoint's readable names, and the tensors of the optimizer's state.

    A variable's key is its first path from the root, which for a Keras model
    often runs through the optimizer (``optimizer/_trainable_variables/0``).
    Paths are therefore taken with every ``optimizer`` edge cut (Keras models
    hold their optimizer too): what is
    still reachable is the model, named by its own path; what is not is the
    optimizer's state (its own variables and the slots it keeps).
    """
    graph = ObjectGraph.parse(ckpt[OBJECT_GRAPH_KEY].item(), path=ckpt.prefix)
    present = set(ckpt.keys())
    for node in graph.nodes:
        kept_edges = [c for c in node.children if c.local_name not in OPTIMIZER_EDGES]
        if len(kept_edges) != len(node.children):
            del node.children[:]
            node.children.extend(kept_edges)
    found = graph.full_paths(i for i, node in enumerate(graph.nodes) if node.attributes)
    names: dict[str, str] = {}
    optimizer: set[str] = set()
    for i, node in enumerate(graph.nodes):
        for a in node.attributes:
            tensors = attribute_tensors(a.checkpoint_key, present)
            if i not in found:
                optimizer.update(tensors)
            stem = a.checkpoint_key
            if not keep_keys and i in found:
                stem = found[i] + ("" if a.name == "VARIABLE_VALUE" else "/" + a.name)
            elif not keep_keys and stem.endswith(VALUE_SUFFIX):
                stem = stem[: -len(VALUE_SUFFIX)]
            for t in tensors:
                names[t] = stem + t[len(a.checkpoint_key) :]
    return names, optimizer


def _export_names(sources, options: Options, keep_keys: bool, with_optimizer: bool) -> Options:
    """Options whose renames first make TF2 keys readable, then apply the user's rules
    and exact map to the readable names (one exact map, for the planner), and which
    leave the optimizer's state out unless asked to keep it."""
    srcs = [sources] if isinstance(sources, str) or not isinstance(sources, Sequence) else sources
    rules = _compile_rules(options.rename)
    exact = dict(options.rename_exact or {})
    composed: dict[str, str] = {}
    drop = list(options.drop_objects)
    for src in srcs:
        given = isinstance(src, Checkpoint)
        ckpt: Checkpoint = src if isinstance(src, Checkpoint) else Checkpoint(src, mmap=False)
        try:
            readable: dict[str, str] = {}
            if OBJECT_GRAPH_KEY in ckpt:
                readable, optimizer = _tf2_names(ckpt, keep_keys)
                if optimizer and not with_optimizer:
                    # The planner cuts the optimizer edges and prunes what only they
                    # reach, with its tensors: the same cut as the names above.
                    drop += [e for e in sorted(OPTIMIZER_EDGES) if e not in drop]
            for key in ckpt.keys():
                composed[key] = _new_name(readable.get(key, key), exact, rules)
        finally:
            if not given:
                ckpt.close()
    return Options.of(options, rename=None, rename_exact=composed, drop_objects=tuple(drop))


@dataclass
class ExportPlan:
    """What :func:`export` writes: the transform plan, then files of tensors."""

    plan: Plan
    format: str
    out: str
    files: list[tuple[str, list[_Out]]]  # final path, its tensors in order
    index: str | None  # the sharded index's path
    skipped: list[tuple[str, str]]

    def summary(self) -> ExportSummary:
        ruled = self.plan.dtype_rule_counts() is not None
        return ExportSummary(
            self.out,
            [f for f, _ in self.files] + ([self.index] if self.index else []),
            [
                {
                    "name": o.pt.name,
                    "new_name": o.pt.new_name,
                    "dtype": o.pt.info.dtype,
                    "new_dtype": o.pt.new_dtype,
                    "shape": list(o.shape),
                    "permute": list(o.perm) if o.perm else None,
                    "file": storage_for(path).basename(path),
                    **({"dtype_by": o.pt.dtype_by} if ruled else {}),
                }
                for path, outs in self.files
                for o in outs
            ],
            self.skipped,
            dropped=len(self.plan.dropped),
            bytes_out=sum(o.pt.bytes_out for _, outs in self.files for o in outs),
        )


def plan_export(
    sources,
    out,
    options: Options | None = None,
    *,
    format: str | None = None,
    permute: Permutes = (),
    keep_keys: bool = False,
    with_optimizer: bool = False,
    skip_unsupported: bool = False,
    **changes,
) -> ExportPlan:
    """Decide an export from the indexes alone (see :func:`export`)."""
    options = Options.of(options, **changes)
    out = normalize(out)
    fmt = _format_of(out, format)
    if fmt == tfiles.NPZ and options.max_shard_bytes is not None:
        raise CheckpointError("npz output is one file; max_shard_bytes is for safetensors")
    options = _export_names(sources, options, keep_keys, with_optimizer)
    store = storage_for(out)
    # The planner's destination is a checkpoint prefix; an export's is its file.
    p = plan(sources, out, Options.of(options, max_shard_bytes=None))
    permuter = _Permuter(permute)
    outs, skipped = [], []
    for pt in p.tensors:
        if not tfiles.supports(fmt, pt.new_dtype):
            skipped.append((pt.new_name, f"{pt.new_dtype} tensors cannot be stored in {fmt}"))
            continue
        perm = permuter(pt.new_name, pt.info.shape, path=p.sources[pt.source].label)
        outs.append(_Out(pt, perm))
    if skipped and not skip_unsupported:
        listed = ", ".join(f"{n} ({r.split(' ')[0]})" for n, r in skipped)
        raise CheckpointError(
            f"{len(skipped)} tensor(s) cannot be stored in {fmt} (use skip_unsupported "
            f"to leave them out): {listed}",
            path=p.sources[0].label,
        )
    limit = options.max_shard_bytes
    groups: list[list[_Out]] = [[]]
    size = 0
    for o in outs:
        if limit is not None and groups[-1] and size + o.pt.bytes_out > limit:
            groups.append([])
            size = 0
        groups[-1].append(o)
        size += o.pt.bytes_out
    index = None
    if len(groups) == 1:
        files = [(out, groups[0])]
    else:
        directory, name = store.dirname(out), store.basename(out)
        stem = name[: -len(".safetensors")] if name.endswith(".safetensors") else name
        n = len(groups)
        files = [
            (store.join(directory, f"{stem}-{k + 1:05d}-of-{n:05d}.safetensors"), g)
            for k, g in enumerate(groups)
        ]
        index = out + ".index.json"
    if not options.overwrite:
        # A single file and a sharded index at the same name: loaders prefer one of
        # them, so either there counts as the output.
        for path in [f for f, _ in files] + [out, out + ".index.json"]:
            if store.exists(path):
                raise CheckpointError("the output already exists (use overwrite)", path=path)
    return ExportPlan(p, fmt, out, files, index, skipped)


def _export_chunks(
    ckpt: Checkpoint, o: _Out, caster: Caster | None, chunk_bytes: int
) -> Iterator[np.ndarray]:
    name, info = o.pt.name, o.pt.info
    if o.perm is None:
        chunks: Iterator[np.ndarray] = prefetch(ckpt.iter_chunks(name, chunk_bytes))
    elif info.nbytes <= chunk_bytes // 2:
        chunks = iter([np.ascontiguousarray(ckpt[name].transpose(o.perm)).reshape(-1)])
    else:
        for _ in ckpt.iter_chunks(name, chunk_bytes):  # the checksums, before reading in tiles
            pass
        itemsize = _dt.lookup(info.dtype).fixed_itemsize
        a = o.perm[0]
        chunks = tiles(
            lambda start, count: ckpt.read_elements(name, start, count),
            info.shape,
            o.perm,
            itemsize,
            chunk_bytes,
            band=(lambda j0, j1: _partitioned_band(ckpt, name, info, a, j0, j1))
            if info.slices
            else None,
        )
    for chunk in chunks:
        yield caster(chunk) if caster is not None else chunk


@takes_storage_options()
def export(
    sources,
    out,
    options: Options | None = None,
    *,
    storage_options: StorageOptions | None = None,
    format: str | None = None,
    permute: Permutes = (),
    keep_keys: bool = False,
    with_optimizer: bool = False,
    skip_unsupported: bool = False,
    dry_run: bool = False,
    progress: Callable[[int], None] | None = None,
    **changes,
) -> ExportSummary:
    """Write a checkpoint's tensors to safetensors or npz, streaming, in bounded memory.

    ``out`` ends in ``.safetensors`` or ``.npz`` (or ``format`` says which). Every
    transform option applies (``include``, ``exclude``, ``drop_objects``,
    ``rename``/``rename_exact`` — on the readable names —, ``cast`` with
    ``overflow``, ``chunk_bytes``, ``overwrite``). TF2 keys lose their
    ``/.ATTRIBUTES/VARIABLE_VALUE`` unless ``keep_keys``; the object graph is never
    written and the optimizer's state only with ``with_optimizer``. Partitioned
    tensors are written whole. ``permute``: ``[(regex, axes)]``, the first whose
    regex matches a new name reorders that tensor's axes (``('kernel$', (1, 0))``),
    tile by tile when it exceeds the chunk budget. ``progress(n)`` is called as
    each ``n`` bytes are written (``bytes_out`` in all). Tensors the format cannot
    hold are an error listing them, or with ``skip_unsupported`` left out (listed
    in ``skipped``). With ``max_shard_bytes`` (safetensors), files
    ``model-00001-of-0000N.safetensors`` and ``model.safetensors.index.json``
    beside ``out`` as Hugging Face writes them.

    >>> tfckpt.export("bert/bert_model.ckpt", "hf/model.safetensors", rename_exact=m,
    ...               permute=[("dense/kernel$", (1, 0))], max_shard_bytes=2 << 30)
    """
    start = time.perf_counter()
    options = Options.of(options, **changes)
    ep = plan_export(
        sources,
        out,
        options,
        format=format,
        permute=permute,
        keep_keys=keep_keys,
        with_optimizer=with_optimizer,
        skip_unsupported=skip_unsupported,
    )
    summary = ep.summary()
    if dry_run:
        return summary
    from . import __version__

    store = storage_for(ep.out)
    label = ep.plan.sources[0].ckpt.prefix
    metadata = {
        "format": "pt" if ep.format == tfiles.SAFETENSORS else "np",
        "source": store.basename(label),
        "source_format": "tensorflow checkpoint (tensor bundle v2)",
        "producer": f"tfckpt {__version__}",
    }
    ckpts = {i: s.ckpt for i, s in enumerate(ep.plan.sources)}
    overflow: dict[str, int] = {}
    written: list[tuple[str, str]] = []  # (temporary, final)
    made = []
    try:
        made = store.makedirs(store.dirname(ep.out))
        for path, outs in ep.files:
            remove_stale_temporaries(path)
            tmp = temporary_base(path)
            written.append((tmp, path))
            f = store.open_writer(tmp)
            try:
                w: tfiles.SafetensorsWriter | tfiles.NpzWriter
                if ep.format == tfiles.SAFETENSORS:
                    w = tfiles.SafetensorsWriter(f, [o.entry for o in outs], metadata)
                else:
                    w = tfiles.NpzWriter(f, [o.entry for o in outs])
                for o in outs:
                    caster = None
                    if o.pt.cast:
                        caster = Caster(
                            _dt.lookup(o.pt.info.dtype),
                            _dt.lookup(o.pt.new_dtype),
                            options.overflow,
                        )
                    w.begin(o.pt.new_name)
                    for chunk in _export_chunks(ckpts[o.pt.source], o, caster, options.chunk_bytes):
                        w.write(chunk)
                        if progress:
                            progress(chunk.nbytes)
                    w.end()
                    if caster is not None and caster.counts.overflow:
                        overflow[o.pt.new_name] = caster.counts.overflow
                w.close()
                f.flush()
                if options.durable:
                    store.fsync(f)
            finally:
                f.close()
        if options.overflow == "error" and overflow:
            raise CastOverflowError(overflow, ep.out)
        if ep.index is not None:
            index = {
                "metadata": {"total_size": summary.bytes_out, **metadata},
                "weight_map": {
                    o.pt.new_name: store.basename(path) for path, outs in ep.files for o in outs
                },
            }
            tmp = temporary_base(ep.index)
            written.append((tmp, ep.index))
            store.write_new(tmp, json.dumps(index, indent=2).encode(), durable=options.durable)
        replaced = _replaced_files(store, ep)
        for tmp, final in written:  # the index (if any) last
            store.replace(tmp, final)
    except OSError as e:
        _discard(store, written, made)
        raise CheckpointWriteError(f"cannot write: {e.strerror or e}", path=ep.out) from None
    except BaseException:
        _discard(store, written, made)
        raise
    finally:
        given = sources if isinstance(sources, (list, tuple)) else [sources]
        for s in ep.plan.sources:
            if not any(s.ckpt is g for g in given):
                s.ckpt.close()
    for stale in replaced:  # what the export replaced and no longer uses
        try:
            store.remove(stale)
        except (OSError, CheckpointError):
            pass
    if options.durable:
        store.fsync_dir(store.dirname(ep.out) or ".")
    summary.seconds = time.perf_counter() - start
    summary.cast_counts = overflow
    return summary


def _replaced_files(store, ep: ExportPlan) -> list[str]:
    """The files of an earlier export at the same name that this one does not rewrite:
    a single file now sharded, or an index and shards now fewer or a single file."""
    mine = {f for f, _ in ep.files} | ({ep.index} if ep.index else set())
    old = [ep.out, ep.out + ".index.json"]
    if store.isfile(ep.out + ".index.json"):
        try:
            weight_map = json.loads(store.read_bytes(ep.out + ".index.json"))["weight_map"]
            directory = store.dirname(ep.out)
            old += [store.join(directory, store.basename(f)) for f in set(weight_map.values())]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # not an index this export can read: its shards stay
    return [f for f in dict.fromkeys(old) if f not in mine and store.isfile(f)]


def _discard(store, written: list[tuple[str, str]], made: list[str]) -> None:
    for tmp, _ in written:
        try:
            store.remove(tmp)
        except (OSError, CheckpointError):
            pass
    store.remove_dirs(made)


# -- import


@dataclass
class _In:
    entry: tfiles.Entry
    file: str
    offset: int  # where the elements start (unless member)
    member: str | None = None  # a compressed npz member, read from its start


def _import_entries(src: str) -> list[_In]:
    store = storage_for(src)
    if src.endswith(".index.json"):
        try:
            weight_map = json.loads(store.read_bytes(src))["weight_map"]
            files = sorted(set(weight_map.values()), key=list(weight_map.values()).index)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"bad safetensors index: {e}", path=src) from None
        directory = store.dirname(src)
        out = []
        for name in files:
            out += _import_entries(store.join(directory, name))
        return out
    if src.endswith(".npz"):
        npz = store.open_reader(src)
        try:
            members = tfiles.npz_members(io.BufferedReader(ReaderFile(npz)), src)
        finally:
            npz.close()
        # Members stored uncompressed are read by offset like safetensors' tensors.
        return [_In(e, src, start or 0, m if start is None else None) for e, m, start in members]
    reader = store.open_reader(src)
    try:
        head = np.empty(min(reader.size, 8), dtype=np.uint8)
        reader.readinto(head.data, 0)
        n = int.from_bytes(head.tobytes(), "little") if len(head) == 8 else 0
        full = np.empty(min(reader.size, 8 + n), dtype=np.uint8)
        reader.readinto(full.data, 0)
        _, entries, _ = tfiles.read_safetensors_header(full.tobytes(), reader.size, src)
    finally:
        reader.close()
    return [_In(e, src, off) for e, off in entries]


def _file_reader(src: str):
    """``read(offset, nbytes) -> bytes`` over one file."""
    reader = storage_for(src).open_reader(src)

    def read(offset: int, nbytes: int) -> np.ndarray:
        buf = np.empty(nbytes, dtype=np.uint8)
        done = 0
        while done < nbytes:
            k = reader.readinto(buf.data[done:], offset + done)
            if not k:
                raise CheckpointError("unexpected end of file", path=src)
            done += k
        return buf

    return read, reader.close


@takes_storage_options()
def import_(
    src,
    out_prefix,
    options: Options | None = None,
    *,
    storage_options: StorageOptions | None = None,
    permute: Permutes = (),
    dry_run: bool = False,
    progress: Callable[[int], None] | None = None,
    **changes,
) -> ExportSummary:
    """Read safetensors (one file, or the ``.index.json`` of sharded files) or npz into
    a V2 checkpoint at ``out_prefix``, tensor by tensor in bounded chunks.

    ``include``/``exclude``, ``rename``/``rename_exact``, ``cast`` (with
    ``overflow``), ``permute``, ``overwrite`` and ``progress`` apply as in :func:`export`.

    >>> tfckpt.import_("hf/model.safetensors.index.json", "ckpt/model")
    """
    start = time.perf_counter()
    options = Options.of(options, **changes)
    src = normalize(src)
    prefix = normalize(out_prefix)
    ins = _import_entries(src)
    includes, excludes = _patterns(options.include), _patterns(options.exclude)
    rules, exact = _compile_rules(options.rename), dict(options.rename_exact or {})
    policy = DtypePolicy.of(options)
    permuter = _Permuter(permute)
    ruled = bool(policy.labels)
    chosen: list[tuple[_In, str, str, tuple[int, ...] | None, str | None]] = []
    seen: dict[str, str] = {}
    dropped = 0
    for i in ins:
        name = i.entry.name
        if (includes and not any(rx.search(name) for rx in includes)) or any(
            rx.search(name) for rx in excludes
        ):
            dropped += 1
            continue
        new = _new_name(name, exact, rules)
        if new in seen:
            raise CheckpointError(f"{seen[new]!r} and {name!r} would both be named {new!r}")
        seen[new] = name
        to, by = policy.decide(name, _dt.lookup(i.entry.dtype))
        perm = permuter(new, i.entry.shape, path=i.file)
        chosen.append((i, new, to.name, perm, by))
    store = storage_for(prefix)
    index_filename = paths.index_filename
    if store.isfile(index_filename(prefix)) and not options.overwrite:
        raise CheckpointError(
            "the destination already exists (use overwrite)", path=index_filename(prefix)
        )
    summary = ExportSummary(
        prefix,
        [index_filename(prefix)],
        [
            {
                "name": i.entry.name,
                "new_name": new,
                "dtype": i.entry.dtype,
                "new_dtype": nd,
                "shape": list(i.entry.shape if perm is None else [i.entry.shape[p] for p in perm]),
                "permute": list(perm) if perm else None,
                "file": store.basename(i.file),
                **({"dtype_by": by} if ruled else {}),
            }
            for i, new, nd, perm, by in chosen
        ],
        dropped=dropped,
        bytes_out=sum(
            int(np.prod(i.entry.shape, dtype=np.int64)) * _dt.lookup(nd).fixed_itemsize
            for i, _, nd, _, _ in chosen
        ),
    )
    if dry_run:
        return summary
    remove_stale_temporaries(prefix)
    if store.atomic_rename:
        shard_paths = [f"{temporary_base(prefix)}.data-0"]
    else:
        # Objects are written under their final names, with a shard count no committed
        # index uses (the extra shards stay empty), as the engine does.
        count = free_shard_count(data_files(prefix), 1)
        shard_paths = [paths.data_filename(prefix, k, count) for k in range(count)]
    path = shard_paths[0]
    overflow: dict[str, int] = {}
    readers: dict[str, tuple] = {}
    zips: dict[str, object] = {}
    w = ShardWriter.create(path, durable=options.durable)
    try:
        for i, new, new_dtype, perm, _ in chosen:
            e = i.entry
            caster = None
            if new_dtype != e.dtype:
                caster = Caster(_dt.lookup(e.dtype), _dt.lookup(new_dtype), options.overflow)
            shape = e.shape if perm is None else tuple(e.shape[p] for p in perm)
            with w.stream(new, new_dtype, shape) as stream:
                for chunk in _import_chunks(i, perm, options.chunk_bytes, readers, zips):
                    out = caster(chunk) if caster is not None else chunk
                    stream.write(out)
                    if progress:
                        progress(out.nbytes)
            if caster is not None and caster.counts.overflow:
                overflow[new] = caster.counts.overflow
        if options.overflow == "error" and overflow:
            raise CastOverflowError(overflow, prefix)
        entries = w.finish()
        for extra in shard_paths[1:]:
            ShardWriter.create(extra, durable=options.durable).finish()
    except BaseException:
        w.abort()
        discard(shard_paths[1:])
        raise
    finally:
        for _, close in readers.values():
            close()
        for zf in zips.values():
            zf.close()  # type: ignore[attr-defined]
    commit_shards(
        prefix, shard_paths, entries, durable=options.durable, overwrite=options.overwrite
    )
    summary.seconds = time.perf_counter() - start
    summary.cast_counts = overflow
    return summary


def _import_chunks(
    i: _In, perm: tuple[int, ...] | None, chunk_bytes: int, readers: dict, zips: dict
) -> Iterator[np.ndarray]:
    e = i.entry
    dt = tfiles.little_dtype(e.dtype)
    if i.member is not None:
        import zipfile

        if i.file not in zips:
            reader = storage_for(i.file).open_reader(i.file)
            zips[i.file] = zipfile.ZipFile(io.BufferedReader(ReaderFile(reader)))
            readers[i.file + "\0zip"] = (None, reader.close)
        chunks = tfiles.npz_chunks(zips[i.file], i.member, e, chunk_bytes)
        if perm is None:
            yield from chunks
            return
        if e.nbytes > chunk_bytes // 2:
            raise CheckpointError(
                "a compressed npz member larger than half the chunk budget cannot be "
                "permuted; raise chunk_bytes",
                path=i.file,
                tensor=e.name,
            )
        whole = np.concatenate(list(chunks)) if e.nbytes else np.empty(0, dt)
        yield np.ascontiguousarray(whole.reshape(e.shape).transpose(perm)).reshape(-1)
        return
    if i.file not in readers:
        readers[i.file] = _file_reader(i.file)
    read = readers[i.file][0]

    def elements(start: int, count: int) -> np.ndarray:
        return read(i.offset + start * dt.itemsize, count * dt.itemsize).view(dt)

    if perm is not None:
        yield from tiles(elements, e.shape, perm, dt.itemsize, chunk_bytes)
        return
    total = e.nbytes // dt.itemsize
    step = max(1, chunk_bytes // dt.itemsize)
    for s in range(0, total, step):
        yield elements(s, min(step, total - s))
