"""An export's files: what each holds (:class:`ExportFiles`, the output of an export's
plan), their names, writing them and their index through the one commit
(:class:`~tfckpt.io.commit.Commit`: temporaries renamed into place, the index or the
single file last), and which files of a replaced or killed export are to be removed.

:func:`tfckpt.export` plans (:mod:`tfckpt.interop.export`: which tensors, their names,
how the files are cut); :func:`~tfckpt.execute` then writes the plan's
:class:`ExportFiles` through :class:`ExportWriting`.
"""

from __future__ import annotations

import bisect
import itertools
import json
import operator
import re
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tfckpt.errors import CheckpointError, CheckpointWriteError
from tfckpt.format import tensorfiles as tfiles
from tfckpt.io.commit import Commit
from tfckpt.io.storage import Storage
from tfckpt.io.temporaries import TMP_MARK, stale_temporaries
from tfckpt.rewrite.cast import CastCountTable, check_overflow
from tfckpt.rewrite.engine import Records, Summary
from tfckpt.rewrite.options import Options
from tfckpt.rewrite.plans import Plan, PlannedTensor, PlannedTensors
from tfckpt.rewrite.rules import bookkeeping_kept
from tfckpt.rewrite.streaming import ProgressSink, TaskItem, stream_items
from tfckpt.rewrite.tasks import task_item
from tfckpt.version import __version__


@dataclass(slots=True)  # one per tensor: 200 000 of them in a big export
class ExportTensor:
    """One planned output tensor of an export (its value transforms the plan's): row
    ``row`` of the plan's ``tensors``, read anew each time (a row object kept per
    tensor would keep what it has read)."""

    tensors: PlannedTensors
    row: int

    @property
    def pt(self) -> PlannedTensor:
        return self.tensors[self.row]

    @property
    def perm(self) -> tuple[int, ...] | None:
        return self.pt.perm

    @property
    def shape(self) -> tuple[int, ...]:
        return self.pt.out_shape

    @property
    def new_name(self) -> str:
        return self.tensors.new_name[self.row]

    @property
    def bytes_out(self) -> int:
        return self.tensors.bytes_out[self.row]

    @property
    def entry(self) -> tfiles.Entry:
        t, r = self.tensors, self.row
        extras = t.extras.get(r)
        shape = extras.get("shape") if extras else None
        return tfiles.Entry(
            t.new_name[r], t.new_dtype[r], t.infos.shapes[r] if shape is None else shape
        )

    @property
    def item(self) -> TaskItem:
        """What the engine's pipeline streams for this tensor."""
        pt = self.pt
        return task_item(pt, None, pt.info.nbytes, pt.bytes_out)


class ExportRows(Sequence[ExportTensor]):
    """Output tensors of an export as rows of the plan's ``tensors`` (8 bytes each):
    an :class:`ExportTensor` is made for a row when asked for, not held per tensor.

    >>> outs = ExportRows(p.tensors, array("q", [0, 2])); outs[1].new_name
    """

    def __init__(self, tensors: PlannedTensors, rows: array):
        self.tensors, self.rows = tensors, rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return ExportRows(self.tensors, self.rows[i])
        return ExportTensor(self.tensors, self.rows[i])

    def __iter__(self) -> Iterator[ExportTensor]:
        t = self.tensors
        return (ExportTensor(t, r) for r in self.rows)

    def new_names(self) -> Sequence[str]:
        """The rows' output names (a column of the plan), read when asked for."""
        return _Made(self, _new_name)

    def bytes_out(self) -> int:
        """What the rows take written."""
        out = self.tensors.bytes_out
        return sum(out[r] for r in self.rows)


class _Made(Sequence):
    """What ``make`` makes of each of ``outs``, made when asked for: a file's entries and
    the pipeline's items are not held for every tensor at once."""

    def __init__(self, outs: Sequence[ExportTensor], make: Callable[[ExportTensor], Any]):
        self._outs, self._make = outs, make

    def __len__(self) -> int:
        return len(self._outs)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._make(o) for o in self._outs[i]]
        return self._make(self._outs[i])

    def __iter__(self) -> Iterator:
        return map(self._make, self._outs)


@dataclass
class ExportFiles:
    """The output of an export's :class:`~tfckpt.rewrite.plans.Plan` (its ``output``):
    the files its tensors go to, instead of a checkpoint; :func:`~tfckpt.execute`
    writes them through :meth:`write`.

    >>> p = tfckpt.interop.export.plan_export("bert/bert_model.ckpt", "hf/model.safetensors")
    >>> [path for path, _ in p.output.files], p.output.format
    """

    format: str
    out: str
    files: list[tuple[str, ExportRows]]  # final path, its tensors in order
    index: str | None  # the sharded index's path
    skipped: list[tuple[str, str]]
    protected: frozenset[str] = frozenset()  # the sources' files (real paths)
    # Small files committed with the tensors (a model's config.json): (path, bytes).
    extra: tuple[tuple[str, bytes], ...] = ()
    # The framework whose layouts the tensors are in, for safetensors' "format" metadata:
    # "pt" when a preset laid them out as a PyTorch model holds them; else none is
    # claimed (a plain export keeps TensorFlow's layouts).
    framework: str | None = None

    def summary(self, p: Plan) -> Summary:
        """What the export of ``p`` writes, before it is written (seconds and counts zero).

        Its ``tensors`` records are made when asked for (:class:`~tfckpt.rewrite.engine.Records`).
        """
        ruled = p.dtype_rule_counts() is not None or bool(p.bookkeeping_kept())
        t = p.tensors
        rows = array("q")
        for _, outs in self.files:
            rows.extend(outs.rows)
        ends = list(itertools.accumulate(len(outs) for _, outs in self.files))
        names = [p.storage.basename(path) for path, _ in self.files]

        def record(i: int) -> dict:
            pt = t[rows[i]]
            return {
                "name": pt.name,
                "new_name": pt.new_name,
                "dtype": pt.info.dtype,
                "new_dtype": pt.new_dtype,
                "shape": list(pt.out_shape),
                "permute": list(pt.perm) if pt.perm else None,
                "file": names[bisect.bisect_right(ends, i)],
                **({"dtype_by": pt.dtype_by} if ruled else {}),
            }

        # The totals as columns: every row of the plan, or the rows written.
        at = np.frombuffer(rows, dtype=np.int64) if len(rows) else np.zeros(0, np.int64)
        every = len(rows) == len(t.name) and bool((at == np.arange(len(at))).all())
        pick = (lambda column: column) if every else (lambda column: [column[r] for r in rows])
        nbytes_in = t.infos.nbytes.values()[at]
        return Summary(
            self.out,
            kept=len(rows),
            dropped=len(p.dropped),
            renamed=sum(map(operator.ne, pick(t.name), pick(t.new_name))),
            cast=sum(map(operator.ne, pick(t.infos.dtypes), pick(t.new_dtype))),
            bytes_in=int(nbytes_in[nbytes_in >= 0].sum()),
            bytes_out=int(np.frombuffer(t.bytes_out, dtype=np.int64)[at].sum()),
            seconds=0.0,
            files=[f for f, _ in self.files]
            + [f for f, _ in self.extra]
            + ([self.index] if self.index else []),
            tensors=Records(len(rows), record),
            skipped=self.skipped,
            bookkeeping_kept=bookkeeping_kept(pick(t.dtype_by), pick(t.new_dtype)),
        )

    def write(self, p: Plan, store: Storage, options: Options, progress=None) -> Summary:
        """Write and commit these files on ``store`` from the sources of ``p`` (what
        :func:`~tfckpt.execute` does for an export's plan); the files they replace are
        removed after the commit, this run's files after a failure."""
        start = time.perf_counter()
        summary = self.summary(p)
        summary.cast_counts = _write_files(p, self, store, options, progress)
        summary.seconds = time.perf_counter() - start
        return summary


class TensorFileSink:
    """A safetensors or npz file as the sink of the engine's pipeline
    (:func:`~tfckpt.rewrite.streaming.stream_items`): each tensor begun, written in
    pieces, ended, in the order of the file's header."""

    def __init__(self, writer):
        self._w = writer

    def write(self, op: tuple) -> None:
        kind, t = op[0], op[1]
        if kind == "open":
            self._w.begin(t.new_name)
        elif kind == "write":
            self._w.write(op[2])
        elif kind == "close":
            self._w.end()
        elif kind == "batch":
            names = [item.new_name for item in t]
            if isinstance(self._w, tfiles.NpzWriter):
                self._w.write_whole(names, op[2])
                return
            for name, data in zip(names, op[2]):
                self._w.begin(name)
                self._w.write(data)
                self._w.end()
        else:  # strings and raw tensors are refused or skipped when an export is planned
            raise AssertionError(kind)


def shard_pattern(out: str) -> re.Pattern:
    """The names of the shards of a sharded export to ``out`` (a file name or path):
    ``STEM-NNNNN-of-MMMMM.safetensors``, the count in group 2."""
    name = out.replace("\\", "/").rsplit("/", 1)[-1]
    stem = name[: -len(".safetensors")] if name.endswith(".safetensors") else name
    return re.compile(re.escape(stem) + r"-(\d{5,})-of-(\d{5,})\.safetensors")


def _listing(store, directory: str) -> list[str]:
    try:
        return store.listdir(directory or ".")
    except (OSError, CheckpointError):
        return []


def file_names(store, out: str, groups: list[ExportRows]):
    """The files of the export and its index (None for one file).

    Shards are named as Hugging Face names them, ``model-00001-of-00003.safetensors``,
    unless files of that count are there already (those of a live export): then the
    count in the names is the least larger one no file there has. So new shards never
    replace the files a live index names, whatever the index says, until the new
    index replaces it.
    """
    if len(groups) == 1:
        return [(out, groups[0])], None
    directory, name = store.dirname(out), store.basename(out)
    rx = shard_pattern(name)
    matches = (rx.fullmatch(n) for n in _listing(store, directory))
    taken = {int(m[2]) for m in matches if m}
    n = len(groups)
    count = n
    while count in taken:
        count += 1
    stem = name[: -len(".safetensors")] if name.endswith(".safetensors") else name
    files = [
        (store.join(directory, f"{stem}-{k + 1:05d}-of-{count:05d}.safetensors"), g)
        for k, g in enumerate(groups)
    ]
    return files, out + ".index.json"


def _indexed_shards(store, index: str, out: str) -> list[str]:
    """The shards of an export to ``out`` that the index file ``index`` names: names of
    the shard pattern (:func:`shard_pattern`), in the directory of ``out``; none when
    ``index`` is not a well-formed index."""
    try:
        names = set(json.loads(store.read_bytes(index))["weight_map"].values())
    except (OSError, CheckpointError, ValueError, KeyError, TypeError, AttributeError):
        return []
    rx = shard_pattern(out)
    directory = store.dirname(out)
    return [
        store.join(directory, n)
        for n in sorted(names, key=str)
        if isinstance(n, str) and rx.fullmatch(n)
    ]


def _remove_killed_runs(store, ep: ExportFiles) -> None:
    """Delete what exports to this name killed part-way left (locally): their temporaries,
    and the shards an index temporary of theirs names (moved into place before a commit
    that never came) that the live index does not name."""
    stale = stale_temporaries(store, store.dirname(ep.out), _owned_names(ep.out))
    if not stale:
        return
    index = ep.out + ".index.json"
    live = set(_indexed_shards(store, index, ep.out))
    mine = {f for f, _ in ep.files}
    orphans = []
    for path in stale:
        if store.basename(path).startswith(store.basename(index) + TMP_MARK):
            orphans += [f for f in _indexed_shards(store, path, ep.out) if f not in live | mine]
    for path in orphans + stale:
        if store.realpath(path) in ep.protected:
            continue
        try:
            store.remove(path)
        except OSError:
            pass


def _owned_names(out: str) -> Callable[[str], bool]:
    """Whether a file name (in the export's directory) is one an export to ``out`` writes."""
    name = out.replace("\\", "/").rsplit("/", 1)[-1]
    rx = shard_pattern(name)
    return lambda n: n in (name, name + ".index.json") or rx.fullmatch(n) is not None


class ExportWriting:
    """One export's files written through a :class:`~tfckpt.io.commit.Commit` (``commit``),
    which names where each goes and makes them appear, the index (or the single file)
    last.

    Locally every file is written under a temporary name beside its final one; shards
    move into place first, under names no file has (see :func:`file_names`; linked, so
    a name taken meanwhile is an error), then the index or the single file: replacing
    with ``overwrite`` (the replaced index kept under a temporary name until its files
    are removed, see :func:`_remove_killed_runs`), else linked too, so an export
    another run committed meanwhile is refused, never replaced. On an object store,
    where an upload appears whole or not at all, files are uploaded under their final
    names; the single file's upload, or the index's after the shards, is the commit.
    """

    def __init__(self, store, ep: ExportFiles, options: Options, ckpts, metadata, progress):
        self.store, self.ep, self.options = store, ep, options
        self.ckpts, self.metadata, self.progress = ckpts, metadata, progress
        self.counts = CastCountTable()  # what the casts did, per tensor
        self.commit = Commit(
            store,
            ep.index or ep.out,
            overwrite=bool(options.overwrite),
            durable=options.durable,
            what="an export",
        )

    def write_all(self) -> None:
        """Write every file of the export (not yet visible), the index's bytes last."""
        store, ep, commit = self.store, self.ep, self.commit
        _remove_killed_runs(store, ep)
        commit.make_directory(store.dirname(ep.out))
        for path, outs in ep.files:
            self._write_file(commit.new_file(path) if ep.index else commit.last_file(), outs)
        for path, data in ep.extra:
            store.write_new(commit.new_file(path), data, durable=self.options.durable)
        if ep.index is not None:
            commit.write_last(self._index_bytes())

    def publish(self) -> None:
        """The commit: the shards into place, then the index or the single file."""
        # A file beside the tensors (config.json) replaces its old self with overwrite;
        # shards have names no file has.
        self.commit.publish(
            replace_data=bool(self.options.overwrite), retire=self.ep.out + ".index.json"
        )

    def _index_bytes(self) -> bytes:
        ep, store = self.ep, self.store
        index = {
            "metadata": {
                "total_size": sum(outs.bytes_out() for _, outs in ep.files),
                **self.metadata,
            },
            "weight_map": {
                o.new_name: store.basename(path) for path, outs in ep.files for o in outs
            },
        }
        return json.dumps(index, indent=2).encode()

    def _write_file(self, where: str, outs: ExportRows) -> None:
        store, options = self.store, self.options
        f = store.open_writer(where)
        w: tfiles.SafetensorsWriter | tfiles.NpzWriter | None = None
        try:
            entries = _Made(outs, _entry)
            if self.ep.format == tfiles.SAFETENSORS:
                w = tfiles.SafetensorsWriter(f, entries, self.metadata)
            else:
                w = tfiles.NpzWriter(f, entries, names=outs.new_names())
            # Through the engine's pipeline: read ahead, cast, write behind, small
            # tensors in batches, permuted ones in tiles.
            counts = CastCountTable()
            stream_items(
                _Made(outs, _item),
                self.ckpts,
                ProgressSink(TensorFileSink(w), self.progress),
                overflow=options.overflow,
                chunk_bytes=options.chunk_bytes,
                endianness="little",  # unused: raw (no numpy) tensors are never exported
                counts=counts,
            )
            self.counts = self.counts.merged([counts])
            if where == self.commit.last:  # an object store's single file: closing commits
                check_overflow(self.counts, options.overflow, self.ep.out)
            w.close()
            f.flush()
            if options.durable:
                store.fsync(f)
        except BaseException:
            if isinstance(w, tfiles.NpzWriter):
                w.abandon()
            if hasattr(f, "discard"):
                f.discard()  # an upload: store nothing
            else:
                try:
                    f.close()
                except OSError:
                    pass
            raise
        f.close()


def _new_name(o: ExportTensor) -> str:
    return o.new_name


def _entry(o: ExportTensor) -> tfiles.Entry:
    return o.entry


def _item(o: ExportTensor) -> TaskItem:
    return o.item


def replaced_files(store, ep: ExportFiles) -> list[str]:
    """The files of the export at ``ep.out`` this one replaces and does not rewrite, to
    remove after the commit: the single file, the index and the shards it names.

    Only files an export writes: the single file and the index by their names; a
    shard only when a well-formed index at ``out`` names it, with the name of a
    shard of ``out`` (``STEM-NNNNN-of-NNNNN.safetensors``) in the same directory.
    Never a source's file, nor one this export writes.
    """
    index = ep.out + ".index.json"
    old = [ep.out] if ep.index is not None else [index]  # the index is replaced itself
    old += _indexed_shards(store, index, ep.out)
    mine = {f for f, _ in ep.files} | ({ep.index} if ep.index else set())
    return [
        f
        for f in old
        if f not in mine and store.isfile(f) and store.realpath(f) not in ep.protected
    ]


def _write_files(
    p: Plan, ep: ExportFiles, store: Storage, options: Options, progress
) -> CastCountTable:
    """Write and commit the files of the export ``p`` on ``store``, then remove the files
    they replace; on a failure, this run's files. What the casts did, per tensor."""
    label = p.sources[0].ckpt.prefix
    framework = ep.framework if ep.format == tfiles.SAFETENSORS else "np"
    metadata = {
        **({"format": framework} if framework is not None else {}),
        "source": store.basename(label),
        "source_format": "tensorflow checkpoint (tensor bundle v2)",
        "producer": f"tfckpt {__version__}",
    }
    ckpts = {i: s.ckpt for i, s in enumerate(p.sources)}
    w = ExportWriting(store, ep, options, ckpts, metadata, progress)
    try:
        replaced = replaced_files(store, ep) if options.overwrite else []
        w.write_all()
        check_overflow(w.counts, options.overflow, ep.out)
        w.publish()
    except OSError as e:
        w.commit.discard()
        raise CheckpointWriteError(f"cannot write: {e.strerror or e}", path=ep.out) from None
    except BaseException:
        w.commit.discard()
        raise
    w.commit.remove_replaced(replaced)
    return w.counts
