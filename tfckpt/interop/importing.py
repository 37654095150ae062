"""Coming back to TensorFlow: safetensors (one file or a sharded index) and npz into a
V2 checkpoint, tensor by tensor in bounded chunks, with the engine's shard writer and
commit. Every name from a file's contents is checked before it is used (see
:func:`tfckpt.tensorfiles.safetensors_index_shards`).
"""

from __future__ import annotations

import functools
import io
import math
import time
import zipfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from tfckpt.checkpoint.writer import ShardWriter
from tfckpt.errors import (
    CheckpointError,
    CorruptCheckpointError,
    UnsupportedCheckpointError,
    option,
)
from tfckpt.format import dtypes as _dt
from tfckpt.format import tensorfiles as tfiles
from tfckpt.format.bookkeeping import tf1_bookkeeping
from tfckpt.format.bundle import MAX_RANK
from tfckpt.io import paths
from tfckpt.io.commit import bundle_commit, commit_shards, new_shard_paths
from tfckpt.io.storage import ReaderFile, Storage, StorageOptions, normalize, storage_for
from tfckpt.io.temporaries import remove_stale_temporaries
from tfckpt.rewrite.cast import CastCountTable, check_overflow
from tfckpt.rewrite.engine import Records, Summary
from tfckpt.rewrite.options import Options, Permutes
from tfckpt.rewrite.rules import (
    ALLOW_UNMATCHED,
    DtypePolicy,
    NameRules,
    ShapeRules,
    bookkeeping_kept,
    unmatched_error,
)
from tfckpt.rewrite.streaming import BundleSink, ProgressSink, TaskItem, stream_items


@dataclass(slots=True)  # one per tensor: its entry's fields held here, not in an Entry
class _In:
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str
    offset: int  # where the elements start (unless member)
    member: str | None = None  # a compressed npz member, read from its start
    # A stored npz member's CRC-32 of its .npy header, and that of all its bytes.
    crc: tuple[int, int] | None = None

    @classmethod
    def of(cls, e: tfiles.Entry, file: str, offset: int, member=None, crc=None) -> _In:
        return cls(e.name, e.dtype, e.shape, file, offset, member, crc)

    @property
    def entry(self) -> tfiles.Entry:
        return tfiles.Entry(self.name, self.dtype, self.shape)

    @property
    def nbytes(self) -> int:
        return _nbytes(self.shape, self.dtype)


def stored_tensors(store: Storage, src: str) -> list[_In]:
    """The tensors ``src`` (on ``store``) holds, in the order they are read: the shards of
    an index (each a plain file name beside it, read as safetensors), an npz's members, or
    one safetensors file's tensors."""
    if src.endswith(".index.json"):
        reader = store.open_reader(src)
        try:
            if reader.size > tfiles.SAFETENSORS_HEADER_LIMIT:
                raise CorruptCheckpointError(
                    f"safetensors index of {reader.size} bytes is over the limit of "
                    f"{tfiles.SAFETENSORS_HEADER_LIMIT}",
                    path=src,
                )
            data = bytearray(reader.size)
            read_exactly(reader, memoryview(data), 0, src)
        finally:
            reader.close()
        shards = tfiles.safetensors_index_shards(data, src)
        del data
        directory = store.dirname(src)
        return [
            i for name in shards for i in _safetensors_entries(store, store.join(directory, name))
        ]
    if src.endswith(".npz"):
        npz = store.open_reader(src)
        try:
            members = tfiles.npz_members(io.BufferedReader(ReaderFile(npz)), src)
        finally:
            npz.close()
        # Members stored uncompressed are read by offset like safetensors' tensors.
        return [
            _In.of(m.entry, src, m.start, None, (m.header_crc, m.crc))
            if m.start is not None
            else _In.of(m.entry, src, 0, m.member)
            for m in members
        ]
    return _safetensors_entries(store, src)


def tensor_file_entries(
    src, *, storage_options: StorageOptions | None = None
) -> list[tfiles.Entry]:
    """The tensors of a safetensors file, the ``.index.json`` of sharded ones, or an npz
    (names, dtypes, shapes), from their headers alone, in the order they are stored.

    >>> [e.name for e in tensor_file_entries("hf/model.safetensors.index.json")][:1]
    ['bert.embeddings.LayerNorm.bias']
    """
    src = normalize(src)
    return [i.entry for i in stored_tensors(storage_for(src, storage_options), src)]


def _safetensors_entries(store: Storage, src: str) -> list[_In]:
    reader = store.open_reader(src)
    try:
        first = bytearray(min(reader.size, 8))
        read_exactly(reader, memoryview(first), 0, src)
        n = tfiles.safetensors_header_size(first, reader.size, src)
        text = bytearray(n)  # at most the package's limit, parsed once
        read_exactly(reader, memoryview(text), 8, src)
        _, entries, _ = tfiles.parse_safetensors_header(text, n, reader.size, src)
    finally:
        reader.close()
    return [_In.of(e, src, off) for e, off in entries]


def read_exactly(reader, buf: memoryview, offset: int, path: str, tensor: str | None = None):
    """Fill ``buf`` from ``reader`` at ``offset``; a file that ends first is corrupt."""
    done = 0
    while done < len(buf):
        k = reader.readinto(buf[done:], offset + done)
        if not k:
            raise CorruptCheckpointError("unexpected end of file", path=path, tensor=tensor)
        done += k


def _file_reader(src: str, reader):
    """``read(offset, nbytes, tensor, buffers=None) -> uint8 array`` over ``reader`` (of
    file ``src``), into ``buffers(nbytes)`` (a ring) if given."""

    def read(offset: int, nbytes: int, tensor: str, buffers=None) -> np.ndarray:
        buf = buffers(nbytes) if buffers is not None else np.empty(nbytes, dtype=np.uint8)
        read_exactly(reader, buf.data, offset, src, tensor)
        return buf

    return read


def import_(
    src,
    out_prefix,
    options: Options | None = None,
    *,
    storage_options: StorageOptions | None = None,
    permute: Permutes = (),
    dry_run: bool = False,
    progress: Callable[[int], None] | None = None,
    on_total: Callable[[int], None] | None = None,
    **changes,
) -> Summary:
    """Read safetensors (one file, or the ``.index.json`` of sharded files) or npz into
    a V2 checkpoint at ``out_prefix``, tensor by tensor in bounded chunks.

    ``include``/``exclude``, ``rename``/``rename_exact``, ``cast`` (with
    ``overflow``), ``permute`` (also ``reshape`` and ``squeeze``), ``overwrite`` and
    ``progress`` and ``on_total`` apply as in :func:`export`;
    ``storage_options`` go to fsspec with both URLs.

    >>> tfckpt.import_("hf/model.safetensors.index.json", "ckpt/model")
    """
    start = time.perf_counter()
    options = Options.of(options, **changes)
    if options.split or options.concat:
        raise CheckpointError(
            "import takes no split or concat: import, then convert the checkpoint with them"
        )
    src = normalize(src)
    prefix = paths.output_prefix(normalize(out_prefix))
    src_store = storage_for(src, storage_options)
    ins = stored_tensors(src_store, src)
    naming = NameRules.of(options)
    policy = DtypePolicy.of(options)
    if permute:
        options = Options.of(options, permute=[*permute, *options.permute])
    chosen, dropped = _chosen(ins, naming, policy, ShapeRules.of(options))
    if not options.allow_unmatched:
        names = [(i.name, None) for i in ins]
        unmatched = naming.unmatched(names) + policy.unmatched(names)
        if unmatched:
            raise unmatched_error(unmatched, lambda: (i.name for i in ins), path=src)
        if not chosen and ins:
            raise CheckpointError(
                f"nothing to write: none of the {len(ins)} tensors is kept (use "
                f"{ALLOW_UNMATCHED} to write it empty)",
                path=src,
            )
    kept = bookkeeping_kept(chosen.column(4), chosen.column(2))
    ruled = bool(policy.labels or kept)  # each record says what decided its dtype
    store = storage_for(prefix, storage_options)
    store.check_writable(prefix)
    index_filename = paths.index_filename
    if store.isfile(index_filename(prefix)) and not options.overwrite:
        raise CheckpointError(
            f"the destination already exists (use {option('overwrite=True', '--overwrite')})",
            path=index_filename(prefix),
        )
    summary = Summary(
        prefix,
        kept=len(chosen),
        dropped=dropped,
        renamed=sum(i.name != new for i, new, *_ in chosen),
        cast=sum(i.dtype != nd for i, _, nd, *_ in chosen),
        bytes_in=sum(_nbytes(i.shape, i.dtype) for i, *_ in chosen),
        bytes_out=sum(_nbytes(i.shape, nd) for i, _, nd, *_ in chosen),
        seconds=0.0,
        files=[index_filename(prefix)],
        tensors=Records(len(chosen), lambda k: _record(chosen[k], src_store, ruled)),
        bookkeeping_kept=kept,
    )
    if dry_run:
        return summary
    if on_total is not None:
        on_total(summary.bytes_out)
    summary.cast_counts = _write_import(store, prefix, src_store, chosen, options, progress)
    summary.seconds = time.perf_counter() - start
    return summary


def _record(row: tuple, src_store: Storage, ruled: bool) -> dict:
    """The summary's record of one chosen tensor (made when asked for)."""
    i, new, nd, (perm, shape), by = row
    return {
        "name": i.name,
        "new_name": new,
        "dtype": i.dtype,
        "new_dtype": nd,
        "shape": list(i.shape if shape is None else shape),
        "permute": list(perm) if perm else None,
        "file": src_store.basename(i.file),
        **({"dtype_by": by} if ruled else {}),
    }


@functools.lru_cache(maxsize=4096)
def _nbytes(shape: tuple[int, ...], dtype: str) -> int:
    # Cached: 200 000 small tensors have a few shapes and dtypes.
    return math.prod(shape) * _dt.lookup(dtype).fixed_itemsize


# Per imported tensor: it, its new name, new dtype, (permutation, shape written), the
# DtypePolicy label.
_Shaping = tuple[tuple[int, ...] | None, tuple[int, ...] | None]
_Row = tuple[_In, str, str, _Shaping, str | None]


class _Chosen:
    """The chosen tensors' rows (:data:`_Row`) kept as five columns: a list slot per
    field and tensor rather than a tuple per tensor (200 000 of them)."""

    __slots__ = ("_columns",)

    def __init__(self) -> None:
        self._columns: tuple[list, ...] = ([], [], [], [], [])

    def append(self, row: _Row) -> None:
        for column, value in zip(self._columns, row):
            column.append(value)

    def __len__(self) -> int:
        return len(self._columns[0])

    def __getitem__(self, k: int) -> _Row:
        i, new, nd, shaping, by = (column[k] for column in self._columns)
        return i, new, nd, shaping, by

    def __iter__(self) -> Iterator[_Row]:
        return zip(*self._columns)

    def column(self, k: int) -> list:
        """Field ``k`` of every row (2: the new dtypes, 4: the labels)."""
        return self._columns[k]


_UNSHAPED: _Shaping = (None, None)


def _chosen(
    ins: list[_In], naming: NameRules, policy: DtypePolicy, shapes: ShapeRules
) -> tuple[_Chosen, int]:
    """The tensors the patterns keep, each with its new name, dtype and value transforms; and
    how many they leave out. Two tensors given one name are an error."""
    chosen = _Chosen()
    seen: dict[str, str] = {}
    dropped = 0
    # Without patterns a name is kept as it is and a dtype decides alone: 200 000 small
    # tensors then cost a dict look-up each, not every rule tried on every name.
    plain = not (naming.includes or naming.excludes or naming.renames or naming.exact)
    plain = plain and not naming.maps
    by_dtype = not (policy.keep or policy.rules)
    decided: dict[str, tuple[_dt.DType, str | None]] = {}
    # The output is name-based: its bookkeeping is found by name, as a TF1 checkpoint's.
    books = tf1_bookkeeping(i.name for i in ins) if policy.passes_bookkeeping else set()
    for i in ins:
        name = i.name
        why, new = (None, name) if plain else naming.decide(name)
        if why is not None:
            dropped += 1
            continue
        if not new or len(i.shape) > MAX_RANK:
            raise _unstorable(i, new)
        if new in seen:
            raise CheckpointError(
                f"{seen[new]!r} and {name!r} would both be named {new!r}",
                path=i.file,
                tensor=name,
            )
        seen[new] = name
        dtype = i.dtype
        if name in books:
            to, by = policy.decide(name, _dt.lookup(dtype), bookkeeping=True)
        elif not by_dtype:
            to, by = policy.decide(name, _dt.lookup(dtype))
        elif dtype in decided:
            to, by = decided[dtype]
        else:
            to, by = decided[dtype] = policy.decide(name, _dt.lookup(dtype))
        shaping = shapes.decide(new, i.shape, path=i.file) if shapes else _UNSHAPED
        if shaping != _UNSHAPED and _dt.lookup(i.dtype).numpy is None:
            raise CheckpointError(
                f"value transforms take numeric and bool tensors, not {i.dtype}",
                path=i.file,
                tensor=name,
            )
        chosen.append((i, new, to.name, shaping, by))
    return chosen, dropped


def _unstorable(i: _In, new: str) -> CheckpointError:
    """Why the tensor ``i``, to be named ``new``, cannot be in a TensorFlow checkpoint."""
    if new:
        return UnsupportedCheckpointError(
            f"rank {len(i.shape)}: a TensorFlow checkpoint holds tensors of rank up to {MAX_RANK}",
            path=i.file,
            tensor=i.name,
        )
    why = f"{i.name!r} would be renamed to ''" if i.name else "a tensor of an empty name"
    fix = option("rename={'^$': 'NAME'}", "--map '^$=NAME'")
    return CheckpointError(
        f"{why}: a TensorFlow checkpoint holds no such name (its empty key is the "
        f"header); give it one ({fix})",
        path=i.file,
        tensor=i.name,
    )


def _write_import(
    store: Storage,
    prefix: str,
    src_store: Storage,
    chosen: _Chosen,
    options: Options,
    progress,
):
    """Stream ``chosen`` (files on ``src_store``) into one shard and commit it at
    ``prefix`` on ``store``; on any failure (an interrupt too) the shard and the
    directories this run made are removed. What the casts did, per tensor."""
    remove_stale_temporaries(store, prefix)
    shard_paths = new_shard_paths(store, prefix, 1)
    commit = bundle_commit(
        store, prefix, shard_paths, overwrite=options.overwrite, durable=options.durable
    )
    source = TensorFileSource(src_store, [i for i, *_ in chosen])
    try:
        w = ShardWriter.create(store, shard_paths[0], durable=options.durable)
        try:
            counts = CastCountTable()
            stream_items(
                _Items(chosen),
                {0: source},
                ProgressSink(BundleSink(w), progress),
                overflow=options.overflow,
                chunk_bytes=options.chunk_bytes,
                endianness=w.endianness,
                counts=counts,
            )
            cast_counts = counts
            check_overflow(cast_counts, options.overflow, prefix)
            entries = w.finish()
            for extra in shard_paths[1:]:
                ShardWriter.create(store, extra, durable=options.durable).finish()
        except BaseException:
            w.abort()
            raise
        finally:
            source.close()
        commit_shards(store, prefix, shard_paths, entries, commit=commit)
    except BaseException:
        commit.discard()  # unless committed: the shards, the directories made
        raise
    return cast_counts


class _Items(Sequence):
    """The pipeline's items of the chosen tensors, made as it reads them: not 200 000
    held at once."""

    def __init__(self, chosen: _Chosen):
        self._chosen = chosen

    def __len__(self) -> int:
        return len(self._chosen)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self._make(self._chosen[j]) for j in range(*k.indices(len(self)))]
        return self._make(self._chosen[k])

    def __iter__(self) -> Iterator[TaskItem]:
        return map(self._make, self._chosen)

    @staticmethod
    def _make(row) -> TaskItem:
        i, new, nd, shaping, _ = row
        return _item(i, new, nd, *shaping)


def _item(
    i: _In, new: str, new_dtype: str, perm: tuple[int, ...] | None, shape: tuple[int, ...] | None
) -> TaskItem:
    return TaskItem(
        0,
        i.name,
        new,
        i.dtype,
        new_dtype,
        i.shape,
        False,
        None,
        _nbytes(i.shape, i.dtype),
        _nbytes(i.shape, new_dtype),
        perm=perm,
        reshape=shape,
    )


@dataclass(frozen=True, slots=True)
class _Info:
    """What the engine's reads ask of a tensor (as of a checkpoint's TensorInfo)."""

    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    slices: tuple = ()


class TensorFileSource:
    """The tensors of safetensors and npz files, read through the calls the engine's
    pipeline reads a checkpoint with (``info``, ``iter_chunks``, ``read_together``,
    ``read_elements``, ``source[name]``), by their names in the files; each file is
    opened once, on ``store`` (that of the file imported: an index's shards are beside
    it). Stored npz members read in order are checked against their CRC-32; bool tensors
    must hold bytes 0 and 1 only."""

    def __init__(self, store: Storage, ins: list[_In]):
        self._ins = {i.name: i for i in ins}
        self._store = store
        self._readers: dict[str, tuple] = {}  # path -> (read, raw reader)
        self._zips: dict[str, zipfile.ZipFile] = {}
        self._closers: list[Callable[[], None]] = []

    def keys(self) -> list[str]:
        """The tensors' names, in the files' order."""
        return list(self._ins)

    def __contains__(self, name) -> bool:
        return name in self._ins

    def __enter__(self) -> TensorFileSource:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def info(self, name: str) -> _Info:
        i = self._ins[name]
        return _Info(i.dtype, i.shape, i.nbytes)

    def iter_chunks(
        self, name: str, read_bytes: int, extents=None, buffers=None
    ) -> Iterator[np.ndarray]:
        """The tensor's elements in pieces of about ``read_bytes``, into ``buffers``."""
        i = self._ins[name]
        dt = tfiles.little_dtype(i.dtype)
        piece = max(1, read_bytes // dt.itemsize)
        if i.member is not None:
            zf = self._zip(i.file)
            chunks = tfiles.npz_chunks(zf, i.member, i.entry, piece * dt.itemsize, path=i.file)
            for chunk in chunks:
                yield self._checked(i, chunk)
            return
        total = i.nbytes // dt.itemsize
        crc = None if i.crc is None else i.crc[0]
        for s in range(0, total, piece):
            chunk = self._elements(i, s, min(piece, total - s), buffers)
            if crc is not None:
                crc = zlib.crc32(chunk.data, crc)
            yield self._checked(i, chunk)
        if i.crc is not None and crc != i.crc[1]:
            # Read in order, a stored member is checked as zipfile would.
            raise CorruptCheckpointError("npz member fails its CRC-32", path=i.file, tensor=name)

    def read_together(self, names: list[str], buffers=None) -> list[np.ndarray]:
        """Whole small tensors, in one buffer of ``buffers``: tensors that follow each
        other in one file in one read."""
        ins = [self._ins[n] for n in names]
        total = sum(i.nbytes for i in ins)
        buf = buffers(total) if buffers is not None else np.empty(total, dtype=np.uint8)
        pos = 0
        k = 0
        while k < len(ins):
            i = ins[k]
            if i.member is not None or i.crc is not None:  # zip members: one by one
                part = buf[pos : pos + i.nbytes]
                done = 0
                for chunk in self.iter_chunks(i.name, max(i.nbytes, 1)):
                    part[done : done + chunk.nbytes] = chunk.view(np.uint8)
                    done += chunk.nbytes
                pos += i.nbytes
                k += 1
                continue
            end, j = i.offset + i.nbytes, k + 1
            while (
                j < len(ins)
                and ins[j].file == i.file
                and ins[j].member is None
                and ins[j].crc is None
                and ins[j].offset == end
            ):
                end += ins[j].nbytes
                j += 1
            run = end - i.offset
            read_exactly(self._reader(i.file)[1], buf[pos : pos + run].data, i.offset, i.file)
            pos += run
            k = j
        out, pos = [], 0
        for i in ins:
            part = buf[pos : pos + i.nbytes].view(tfiles.little_dtype(i.dtype))
            out.append(self._checked(i, part))
            pos += i.nbytes
        return out

    def __getitem__(self, name: str) -> np.ndarray:
        (whole,) = self.read_together([name])
        return whole.reshape(self._ins[name].shape)

    def read_elements(self, name: str, start: int, count: int) -> np.ndarray:
        """``count`` elements from element ``start`` of a stored tensor (permutes)."""
        i = self._ins[name]
        if i.member is not None:
            raise CheckpointError(
                "a compressed npz member larger than half the chunk budget cannot be "
                "permuted; raise chunk_bytes",
                path=i.file,
                tensor=name,
            )
        return self._elements(i, start, count, None)

    def _elements(self, i: _In, start: int, count: int, buffers) -> np.ndarray:
        dt = tfiles.little_dtype(i.dtype)
        read = self._reader(i.file)[0]
        return read(i.offset + start * dt.itemsize, count * dt.itemsize, i.name, buffers).view(dt)

    @staticmethod
    def _checked(i: _In, chunk: np.ndarray) -> np.ndarray:
        if chunk.dtype == np.bool_ and chunk.size and chunk.view(np.uint8).max() > 1:
            raise CorruptCheckpointError(
                "bool tensor holds bytes other than 0 and 1", path=i.file, tensor=i.name
            )
        return chunk

    def _reader(self, path: str):
        """``(read, raw reader)`` of one file, opened on first use."""
        if path not in self._readers:
            reader = self._store.open_reader(path)
            self._closers.append(reader.close)
            self._readers[path] = (_file_reader(path, reader), reader)
        return self._readers[path]

    def _zip(self, path: str) -> zipfile.ZipFile:
        if path not in self._zips:
            reader = self._store.open_reader(path)
            self._closers.append(reader.close)
            self._zips[path] = zipfile.ZipFile(io.BufferedReader(ReaderFile(reader)))
            self._closers.append(self._zips[path].close)
        return self._zips[path]

    def close(self) -> None:
        for close in reversed(self._closers):
            close()
