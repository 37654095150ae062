"""Coming back to TensorFlow: safetensors (one file or a sharded index) and npz into a
V2 checkpoint, tensor by tensor in bounded chunks, with the engine's shard writer and
commit. Every name from a file's contents is checked before it is used (see
:func:`tfckpt.tensorfiles.safetensors_index_shards`).
"""

from __future__ import annotations

import io
import time
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from tfckpt.checkpoint.writer import ShardWriter
from tfckpt.errors import (
    CastOverflowError,
    CheckpointError,
    CheckpointWriteError,
    CorruptCheckpointError,
)
from tfckpt.format import dtypes as _dt
from tfckpt.format import tensorfiles as tfiles
from tfckpt.interop.export import ExportSummary
from tfckpt.io import paths
from tfckpt.io.commit import commit_shards, data_files, discard, free_shard_count
from tfckpt.io.storage import (
    ReaderFile,
    StorageOptions,
    normalize,
    storage_for,
    takes_storage_options,
)
from tfckpt.io.temporaries import remove_stale_temporaries, temporary_base
from tfckpt.rewrite.cast import Caster
from tfckpt.rewrite.options import Options
from tfckpt.rewrite.permute import Permuter, Permutes, tiles
from tfckpt.rewrite.pipeline import BufferRing
from tfckpt.rewrite.planner import DtypePolicy, compile_patterns, compile_rules, new_name


@dataclass(slots=True)
class _In:
    entry: tfiles.Entry
    file: str
    offset: int  # where the elements start (unless member)
    member: str | None = None  # a compressed npz member, read from its start
    # A stored npz member's CRC-32 of its .npy header, and that of all its bytes.
    crc: tuple[int, int] | None = None


def _import_entries(src: str) -> list[_In]:
    """The tensors ``src`` holds, in the order they are read: the shards of an index
    (each a plain file name beside it, read as safetensors), an npz's members, or one
    safetensors file's tensors."""
    store = storage_for(src)
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
        return [i for name in shards for i in _safetensors_entries(store.join(directory, name))]
    if src.endswith(".npz"):
        npz = store.open_reader(src)
        try:
            members = tfiles.npz_members(io.BufferedReader(ReaderFile(npz)), src)
        finally:
            npz.close()
        # Members stored uncompressed are read by offset like safetensors' tensors.
        return [
            _In(m.entry, src, m.start, None, (m.header_crc, m.crc))
            if m.start is not None
            else _In(m.entry, src, 0, m.member)
            for m in members
        ]
    return _safetensors_entries(src)


def _safetensors_entries(src: str) -> list[_In]:
    reader = storage_for(src).open_reader(src)
    try:
        first = bytearray(min(reader.size, 8))
        read_exactly(reader, memoryview(first), 0, src)
        n = tfiles.safetensors_header_size(first, reader.size, src)
        text = bytearray(n)  # at most the package's limit, parsed once
        read_exactly(reader, memoryview(text), 8, src)
        _, entries, _ = tfiles.parse_safetensors_header(text, n, reader.size, src)
    finally:
        reader.close()
    return [_In(e, src, off) for e, off in entries]


def read_exactly(reader, buf: memoryview, offset: int, path: str, tensor: str | None = None):
    """Fill ``buf`` from ``reader`` at ``offset``; a file that ends first is corrupt."""
    done = 0
    while done < len(buf):
        k = reader.readinto(buf[done:], offset + done)
        if not k:
            raise CorruptCheckpointError("unexpected end of file", path=path, tensor=tensor)
        done += k


def _file_reader(src: str):
    """``read(offset, nbytes, tensor, buffers=None) -> uint8 array`` over one file, into
    ``buffers(nbytes)`` (a ring) if given."""
    reader = storage_for(src).open_reader(src)

    def read(offset: int, nbytes: int, tensor: str, buffers=None) -> np.ndarray:
        buf = buffers(nbytes) if buffers is not None else np.empty(nbytes, dtype=np.uint8)
        read_exactly(reader, buf.data, offset, src, tensor)
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
    includes, excludes = compile_patterns(options.include), compile_patterns(options.exclude)
    rules, exact = compile_rules(options.rename), dict(options.rename_exact or {})
    policy = DtypePolicy.of(options)
    permuter = Permuter(permute)
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
        new = new_name(name, exact, rules)
        if new in seen:
            raise CheckpointError(
                f"{seen[new]!r} and {name!r} would both be named {new!r}",
                path=i.file,
                tensor=name,
            )
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
    summary.cast_counts = _write_import(store, prefix, chosen, options, progress)
    summary.seconds = time.perf_counter() - start
    return summary


_Chosen = list[tuple[_In, str, str, tuple[int, ...] | None, str | None]]


def _write_import(store, prefix: str, chosen: _Chosen, options: Options, progress):
    """Stream ``chosen`` into one shard and commit it; on any failure (an interrupt
    too) the shard and the directories this run made are removed. The overflows."""
    remove_stale_temporaries(prefix)
    if store.atomic_rename:
        shard_paths = [f"{temporary_base(prefix)}.data-0"]
    else:
        # Objects are written under their final names, with a shard count no committed
        # index uses (the extra shards stay empty), as the engine does.
        count = free_shard_count(data_files(prefix), 1)
        shard_paths = [paths.data_filename(prefix, k, count) for k in range(count)]
    try:
        made = store.makedirs(store.dirname(prefix))  # innermost first
    except OSError as e:
        raise CheckpointWriteError(
            f"cannot create directory: {e.strerror or e}", path=prefix
        ) from None
    sources = _Sources()
    try:
        w = ShardWriter.create(shard_paths[0], durable=options.durable)
        try:
            overflow = _stream_import(w, chosen, options, progress, sources)
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
            sources.close()
        commit_shards(
            prefix, shard_paths, entries, durable=options.durable, overwrite=options.overwrite
        )
    except BaseException:
        store.remove_dirs(made)  # only those still empty
        raise
    return overflow


class _Sources:
    """The files an import reads, opened once each, and the two rings its pieces and
    their casts go into: the loop holds one piece while the next is read."""

    def __init__(self):
        self.readers: dict[str, tuple] = {}  # path -> (read, close)
        self.zips: dict[str, zipfile.ZipFile] = {}
        self.closers: list[Callable[[], None]] = []
        self.read_ring = BufferRing(2)
        self.cast_ring = BufferRing(2)

    def reader(self, path: str):
        if path not in self.readers:
            self.readers[path] = _file_reader(path)
            self.closers.append(self.readers[path][1])
        return self.readers[path][0]

    def zip(self, path: str) -> zipfile.ZipFile:
        if path not in self.zips:
            reader = storage_for(path).open_reader(path)
            self.closers.append(reader.close)
            self.zips[path] = zipfile.ZipFile(io.BufferedReader(ReaderFile(reader)))
            self.closers.append(self.zips[path].close)
        return self.zips[path]

    def close(self) -> None:
        for close in reversed(self.closers):
            close()


def _stream_import(w: ShardWriter, chosen: _Chosen, options: Options, progress, sources):
    overflow: dict[str, int] = {}
    for i, new, new_dtype, perm, _ in chosen:
        e = i.entry
        caster = None
        if new_dtype != e.dtype:
            caster = Caster(
                _dt.lookup(e.dtype),
                _dt.lookup(new_dtype),
                options.overflow,
                buffers=sources.cast_ring,
            )
        shape = e.shape if perm is None else tuple(e.shape[p] for p in perm)
        with w.stream(new, new_dtype, shape) as stream:
            for chunk in _import_chunks(i, perm, options.chunk_bytes, sources):
                if chunk.dtype == np.bool_ and chunk.size and chunk.view(np.uint8).max() > 1:
                    raise CorruptCheckpointError(
                        "bool tensor holds bytes other than 0 and 1", path=i.file, tensor=e.name
                    )
                out = caster(chunk) if caster is not None else chunk
                stream.write(out)
                if progress:
                    progress(out.nbytes)
        if caster is not None and caster.counts.overflow:
            overflow[new] = caster.counts.overflow
    return overflow


def _import_chunks(
    i: _In, perm: tuple[int, ...] | None, chunk_bytes: int, sources: _Sources
) -> Iterator[np.ndarray]:
    """A tensor's elements in pieces: an eighth of the budget each, as the engine reads
    (two pieces and their casts stay within it), or tiles when permuted."""
    e = i.entry
    dt = tfiles.little_dtype(e.dtype)
    piece = max(1, chunk_bytes // 8 // dt.itemsize)
    if i.member is not None:
        chunks = tfiles.npz_chunks(
            sources.zip(i.file), i.member, e, piece * dt.itemsize, path=i.file
        )
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
    read = sources.reader(i.file)

    def elements(start: int, count: int, ring=None) -> np.ndarray:
        return read(i.offset + start * dt.itemsize, count * dt.itemsize, e.name, ring).view(dt)

    if perm is not None:
        yield from tiles(elements, e.shape, perm, dt.itemsize, chunk_bytes)
        return
    total = e.nbytes // dt.itemsize
    crc = None if i.crc is None else i.crc[0]
    for s in range(0, total, piece):
        chunk = elements(s, min(piece, total - s), sources.read_ring)
        if crc is not None:
            crc = zlib.crc32(chunk.data, crc)
        yield chunk
    if i.crc is not None and crc != i.crc[1]:
        # Read in order, a stored member is checked as zipfile would (permuted, it is not).
        raise CorruptCheckpointError("npz member fails its CRC-32", path=i.file, tensor=e.name)
