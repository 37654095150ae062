"""The tensor-slice checkpoint format (TensorFlow's ``SaverDef.V1``), read through the
:class:`~tfckpt.checkpoint.reader.Checkpoint` API.

A V1 checkpoint is one or more table files (the table of :mod:`tfckpt.format.table`).
In each, the empty key holds the meta: every tensor's name, shape, dtype and the slices
that file stores; every other key is the slice key of (name, slice) whose value holds
that slice's values as typed repeated fields. A tensor may be stored in several slices,
spread over several files (a sharded save writes ``PREFIX-00000-of-00002`` ...).
Opening walks every block once (checksums, key order) and keeps only where each key
is; a value is read back with its block and parsed one slice at a time.

Which files a path designates is :mod:`~tfckpt.checkpoint.v1files`; the values of a
slice's ``TensorProto`` are decoded by :mod:`tfckpt.format.tensorproto`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from google.protobuf.message import DecodeError

from tfckpt._proto.saved_tensor_slice_pb2 import SavedTensorSlices
from tfckpt.checkpoint.reader import DEFAULT_CHUNK_BYTES, Checkpoint
from tfckpt.checkpoint.slicing import Region, assemble_region, region_index
from tfckpt.checkpoint.v1files import SHARD_RE, resolve_files
from tfckpt.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    TensorNotFoundError,
    UnsupportedCheckpointError,
)
from tfckpt.format import dtypes as _dt
from tfckpt.format import orderedcode
from tfckpt.format.bundle import Header, TensorInfo, TensorTable, Version, slice_from_proto
from tfckpt.format.framing import encode_strings
from tfckpt.format.slices import (
    Slice,
    check_slice_cover,
    coverage,
    extents_fit,
    format_slice,
    is_full_slice,
    num_elements,
    slice_index,
    slice_shape,
)
from tfckpt.format.table import BlockHandle, TableReader
from tfckpt.format.tensorproto import decode_tensor_proto
from tfckpt.io.storage import (
    Reader,
    Storage,
    StorageOptions,
    normalize,
    storage_for,
)

FORMAT_NAME = "V1 (tensor slices)"


class _FileBytes:
    """A file's bytes as the table reader indexes them, read on demand with positioned
    reads: only the blocks looked at are ever in memory."""

    def __init__(self, reader: Reader):
        self._reader = reader
        self._size = reader.size

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index):
        if not isinstance(index, slice):
            return self[index : index + 1][0]
        start, stop, _ = index.indices(self._size)
        buf = bytearray(max(stop - start, 0))
        view, pos = memoryview(buf), 0
        while pos < len(buf):
            n = self._reader.readinto(view[pos:], start + pos)
            if n <= 0:
                break  # the file shrank: the block's checksum reports it
            pos += n
        return bytes(buf[:pos])


@dataclasses.dataclass
class _Tensor:
    name: str
    dtype: _dt.DType
    shape: tuple[int, ...]
    slices: list[Slice]  # in the order the meta lists them
    where: dict[Slice, int]  # slice -> file index


class V1Checkpoint(Checkpoint):
    """A V1 (tensor-slice) checkpoint, read through the same API as a bundle.

    Created by :func:`tfckpt.open` when ``path`` designates a
    V1 checkpoint. ``header.num_shards`` is its number of files; a slice's ``shard`` is
    the file that stores it. ``nbytes`` is what a tensor takes in a bundle.
    """

    format = FORMAT_NAME

    def __init__(
        self,
        path,
        *,
        verify: bool = True,
        mmap: bool = True,
        storage_options: StorageOptions | None = None,
        storage: Storage | None = None,
        resolved: tuple[str, list[str]] | None = None,
    ):
        # ``storage``: where ``path`` is (else made from ``storage_options``); ``resolved``:
        # the files open_checkpoint() found (it warned about a moved state file then).
        self.storage = storage or storage_for(normalize(path), storage_options)
        resolved = resolved or resolve_files(self.storage, path)
        if resolved is None:
            raise CheckpointNotFoundError("no V1 checkpoint found", path=normalize(path))
        self.prefix, self.files = resolved
        self.verify = verify
        self.mmap = mmap
        self.index_path = self.files[0]
        self._readers = {}
        self._tables: list[TableReader] = []
        self._blocks: list[list[BlockHandle]] = []
        # Per file, each key's data block and value size: values stay in the file.
        self._where: list[dict[bytes, tuple[int, int]]] = []
        self._tensors: dict[str, _Tensor] = {}
        self._last_block: tuple[tuple[int, int] | None, dict[bytes, bytes]] = (None, {})
        # The last tensor read_elements read: its name, and its values (whole: None) or
        # those of each stored slice read, flat.
        self._last_values: tuple[str | None, dict[Slice | None, np.ndarray]] = (None, {})
        version: Version | None = None
        for i, f in enumerate(self.files):
            try:
                reader = self.storage.open_reader(f)
            except OSError as e:
                raise CheckpointNotFoundError(f"cannot read: {e.strerror or e}", path=f) from None
            self._readers[i] = reader
            table = TableReader(_FileBytes(reader), f, lazy=True)  # type: ignore[arg-type]
            blocks: list[BlockHandle] = []
            where: dict[bytes, tuple[int, int]] = {}
            meta = None
            for handle, entries in table.iter_blocks():
                for key, value in entries:
                    where[key] = (len(blocks), len(value))
                    if key == b"":
                        meta = value
                blocks.append(handle)
            self._tables.append(table)
            self._blocks.append(blocks)
            self._where.append(where)
            v = self._read_meta(i, f, meta)
            version = version or v
        for t in self._tensors.values():  # files list slices in save order: row-major here
            t.slices.sort(key=lambda ext: [start for start, _ in ext])
        self.header = Header(len(self.files), "little", version or Version(0, 0))
        self._names = sorted(self._tensors)

    def _read_meta(self, index: int, f: str, raw: bytes | None) -> Version:
        if raw is None:
            raise CorruptCheckpointError("no meta entry (empty key): not a V1 checkpoint", path=f)
        try:
            msg = SavedTensorSlices.FromString(raw)
        except DecodeError as e:
            raise CorruptCheckpointError(f"unreadable meta entry: {e}", path=f) from None
        if not msg.HasField("meta"):
            raise CorruptCheckpointError("the empty key holds no meta: not a V1 checkpoint", path=f)
        for m in msg.meta.tensor:
            name = m.name
            try:
                dtype = _dt.lookup(int(m.type))
            except (KeyError, ValueError, TypeError):
                raise UnsupportedCheckpointError(
                    f"unknown dtype {m.type}", path=f, tensor=name
                ) from None
            if m.shape.unknown_rank or any(d.size < 0 for d in m.shape.dim):
                raise CorruptCheckpointError("shape has unknown dimensions", path=f, tensor=name)
            shape = tuple(d.size for d in m.shape.dim)
            t = self._tensors.get(name)
            if t is None:
                t = self._tensors[name] = _Tensor(name, dtype, shape, [], {})
            elif t.dtype is not dtype or t.shape != shape:
                raise CorruptCheckpointError(
                    f"files disagree on the tensor: {t.dtype.name}{list(t.shape)} and "
                    f"{dtype.name}{list(shape)}",
                    path=f,
                    tensor=name,
                )
            for sp in m.slice:
                s = slice_from_proto(sp) or tuple((0, None) for _ in shape)
                if len(s) != len(shape) or not extents_fit(s, shape):
                    raise CorruptCheckpointError(
                        f"slice {format_slice(s)} does not fit shape {list(shape)}",
                        path=f,
                        tensor=name,
                    )
                if s in t.where:
                    raise CorruptCheckpointError(
                        f"slice {format_slice(s)} is stored twice", path=f, tensor=name
                    )
                t.where[s] = index
                t.slices.append(s)
        v = msg.meta.versions
        return Version(v.producer, v.min_consumer, tuple(v.bad_consumers))

    def __repr__(self) -> str:
        return f"<tfckpt.Checkpoint {self.prefix!r} (V1): {len(self)} tensors>"

    def __contains__(self, name) -> bool:
        return isinstance(name, str) and name in self._tensors

    def close(self) -> None:
        self._last_values = (None, {})
        readers, self._readers = self._readers, {}
        for reader in readers.values():
            reader.close()

    # -- metadata

    def _tensor(self, name: str) -> _Tensor:
        t = self._tensors.get(name) if isinstance(name, str) else None
        if t is None:
            raise TensorNotFoundError(
                f"no tensor {name!r} in checkpoint", path=self.prefix, tensor=name
            )
        return t

    def _partitioned(self, t: _Tensor) -> bool:
        return not (len(t.slices) == 1 and is_full_slice(t.shape, t.slices[0]))

    def _nbytes(self, t: _Tensor, extents: Slice) -> int:
        n = num_elements(slice_shape(t.shape, extents))
        if t.dtype is _dt.STRING:
            return self._where[t.where[extents]].get(self._key(t, extents), (0, 0))[1]
        if t.dtype.numpy is None:
            return 0
        return n * t.dtype.fixed_itemsize

    def info(self, name: str) -> TensorInfo:
        t = self._tensor(name)
        if not self._partitioned(t):
            s = t.slices[0]
            return TensorInfo(
                name,
                t.dtype.name,
                t.shape,
                self._nbytes(t, s),
                t.where[s],
                None,
                None,
                (),
                stored_elements=num_elements(t.shape),
            )
        slices = tuple(t.slices)
        stored = coverage(slices, t.shape)[0] if slices else 0
        return TensorInfo(
            name,
            t.dtype.name,
            t.shape,
            sum(self._nbytes(t, s) for s in slices),
            None,
            None,
            None,
            slices,
            stored_elements=stored,
        )

    def table(self, names: Sequence[str] | None = None) -> TensorTable:
        return TensorTable.of([self.info(n) for n in (self.keys() if names is None else names)])

    def slice_info(self, name: str) -> list[TensorInfo]:
        t = self._tensor(name)
        if not self._partitioned(t):
            return []
        self._check_disjoint_v1(t)
        return [
            TensorInfo(
                name,
                t.dtype.name,
                slice_shape(t.shape, s),
                self._nbytes(t, s),
                t.where[s],
                None,
                None,
                (),
                extents=s,
                stored_elements=num_elements(slice_shape(t.shape, s)),
            )
            for s in t.slices
        ]

    def orphan_slice_keys(self) -> list[bytes]:
        """Slice entries that no meta lists."""
        listed = {self._key(t, s) for t in self._tensors.values() for s in t.slices}
        return [k for where in self._where for k in where if k and k not in listed]

    @property
    def tf_path(self) -> str:
        """What TensorFlow opens this checkpoint by: the file of a single-file save; for
        a sharded save the pattern it names it by (``model.ckpt-5-?????-of-00002``),
        which its V1 reader globs (it opens no bare prefix)."""
        m = SHARD_RE.match(self.files[0]) if len(self.files) > 1 else None
        return f"{m['prefix']}-?????-of-{m['num']}" if m else self.files[0]

    @property
    def data_files(self) -> list[str]:
        return list(self.files)

    def check_shard_files(self, shard_ids) -> None:
        pass  # every file was read when opening

    # -- values

    @staticmethod
    def _key(t: _Tensor, extents: Slice) -> bytes:
        return orderedcode.encode_slice_key(t.name, extents)

    def _check_disjoint_v1(self, t: _Tensor) -> None:
        def error(what: str) -> CorruptCheckpointError:
            return CorruptCheckpointError(what, path=self.prefix, tensor=t.name)

        check_slice_cover(t.slices, t.shape, error)

    def _raw_slice(self, t: _Tensor, extents: Slice) -> tuple[int, int]:
        """Where one slice's entry is (block, value size); refused before anything is
        allocated for the slice unless it can hold its values (each takes a byte at least)."""
        i = t.where[extents]
        f, key = self.files[i], self._key(t, extents)
        found = self._where[i].get(key)
        n = num_elements(slice_shape(t.shape, extents))
        if found is None:
            raise CorruptCheckpointError(
                f"slice {format_slice(extents)} is listed but not stored", path=f, tensor=t.name
            )
        if n > found[1]:
            raise CorruptCheckpointError(
                f"{n} values cannot fit in the slice's {found[1]} bytes", path=f, tensor=t.name
            )
        return found

    def _read_raw(self, t: _Tensor, extents: Slice) -> bytes:
        i = t.where[extents]
        block, _ = self._raw_slice(t, extents)
        key = self._key(t, extents)
        cached = self._last_block  # one block kept (its neighbours come next); a local
        if cached[0] != (i, block):  # copy, so that threads reading at once never mix two
            entries = self._tables[i].block_entries(self._blocks[i][block])
            cached = self._last_block = ((i, block), dict(entries))
        value = cached[1].get(key)
        if value is not None:
            return value
        raise CorruptCheckpointError(  # the file changed since it was opened
            f"slice {format_slice(extents)} is no longer in its block",
            path=self.files[i],
            tensor=t.name,
        )

    def _slice_values(self, t: _Tensor, extents: Slice) -> np.ndarray:
        """The values of one stored slice, shaped as the slice."""
        f = self.files[t.where[extents]]
        raw = self._read_raw(t, extents)
        shape = slice_shape(t.shape, extents)
        try:
            msg = SavedTensorSlices.FromString(raw)
        except DecodeError as e:
            raise CorruptCheckpointError(
                f"unreadable slice entry: {e}", path=f, tensor=t.name
            ) from None
        saved = msg.data
        if saved.name != t.name or slice_from_proto(saved.slice) not in (extents, ()):
            raise CorruptCheckpointError(
                f"the entry of slice {format_slice(extents)} holds another slice or tensor",
                path=f,
                tensor=t.name,
            )
        try:
            return decode_tensor_proto(saved.data, t.dtype, shape)
        except ValueError as e:
            raise CorruptCheckpointError(
                f"slice {format_slice(extents)}: {e}", path=f, tensor=t.name
            ) from None

    def read(self, name: str) -> np.ndarray:
        t = self._tensor(name)
        if not self._partitioned(t):
            return self._slice_values(t, t.slices[0])
        self._check_disjoint_v1(t)
        stored = coverage(t.slices, t.shape)[0] if t.slices else 0
        if stored != num_elements(t.shape):
            raise UnsupportedCheckpointError(
                f"only {stored} of {num_elements(t.shape)} elements are stored; read its slices",
                path=self.prefix,
                tensor=name,
            )
        for s in t.slices:
            self._raw_slice(t, s)
        out = np.empty(t.shape, dtype=object if t.dtype is _dt.STRING else t.dtype.numpy)
        for s in t.slices:
            out[slice_index(s)] = self._slice_values(t, s)
        return out

    def read_region(self, name: str, region: Region) -> np.ndarray:
        """A region of a tensor: each stored slice it meets is parsed whole (values are
        protobuf fields, not byte ranges), the others are not read."""
        t = self._tensor(name)
        if not self._partitioned(t):
            return self._slice_values(t, t.slices[0])[region_index(region)]
        self._check_disjoint_v1(t)
        return assemble_region(
            t.shape,
            t.dtype,
            t.slices,
            region,
            lambda extents, local: self._slice_values(t, extents)[region_index(local)],
            path=self.prefix,
            tensor=name,
        )

    def read_together(self, names, *, buffers=None) -> list[np.ndarray]:
        """Whole tensors as 1-D arrays, each read on its own (V1 files hold few)."""
        return [np.ascontiguousarray(self.read(name)).reshape(-1) for name in names]

    def read_slice(self, name: str, extents: Slice) -> np.ndarray:
        t = self._tensor(name)
        return self._slice_values(t, self._stored(t, extents))

    def read_elements(
        self, name: str, start: int, count: int, extents: Slice | None = None
    ) -> np.ndarray:
        """Elements ``[start, start + count)`` (row-major) of a whole, fixed-size tensor,
        or with ``extents`` of one stored slice of a partitioned one.

        A V1 value is a protobuf message, parsed whole: the values of the last tensor
        read here are kept (whole, or each of its slices read), so that reading it in
        tiles parses each slice once, not once a tile.
        """
        t = self._tensor(name)
        itemsize = t.dtype.fixed_itemsize  # refuses strings, as a bundle's reader does
        stored = None if extents is None else self._stored(t, extents)
        shape = t.shape if stored is None else slice_shape(t.shape, stored)
        if start < 0 or count < 0 or (start + count) * itemsize > num_elements(shape) * itemsize:
            raise ValueError(f"elements [{start}, {start + count}) lie outside {name!r}")
        cached = self._last_values  # a local copy, so that threads reading at once never
        if cached[0] != name:  # mix two tensors' values
            cached = self._last_values = (name, {})
        flat = cached[1].get(stored)
        if flat is None:
            flat = np.ascontiguousarray(self._value(name, stored)).reshape(-1)
            cached[1][stored] = flat
        return flat[start : start + count].copy()  # the kept values stay as they were read

    def _stored(self, t: _Tensor, extents: Slice) -> Slice:
        s: Slice = tuple((int(a), None if b is None else int(b)) for a, b in extents)
        if s in t.where:
            return s
        for stored in t.slices:
            if _canonical(stored, t.shape) == _canonical(s, t.shape):
                return stored
        raise TensorNotFoundError(
            f"no stored slice {format_slice(s)}", path=self.prefix, tensor=t.name
        )
        return s

    def _value(self, name: str, extents: Slice | None) -> np.ndarray:
        if extents is None:
            return self.read(name)
        return self.read_slice(name, extents)

    def read_bytes(self, name: str, extents: Slice | None = None) -> bytes:
        """The tensor's (or slice's) bytes as a bundle stores them."""
        value = self._value(name, extents)
        if value.dtype == object:
            return encode_strings(value, "little")[0]
        return np.ascontiguousarray(value).astype(value.dtype.newbyteorder("<")).tobytes()

    def variant_elements(self, name: str, extents: Slice | None = None) -> list[bytes]:
        raise UnsupportedCheckpointError(
            f"a {self._tensor(name).dtype.name} tensor, not a variant",
            path=self.prefix,
            tensor=name,
        )

    def iter_chunks(
        self,
        name: str,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        extents: Slice | None = None,
        *,
        buffers: Callable[[int], np.ndarray] | None = None,
    ) -> Iterator[np.ndarray]:
        """Chunks of about ``chunk_bytes``; one stored slice is parsed whole at a time."""
        flat = self._value(name, extents).reshape(-1)
        if flat.dtype == object or not flat.size:
            yield flat
            return
        step = max(1, chunk_bytes // flat.dtype.itemsize)
        for start in range(0, flat.size, step):
            yield flat[start : start + step]

    def iter_string_parts(
        self, name: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES, extents: Slice | None = None
    ) -> Iterator[tuple[str, np.ndarray, int]]:
        t = self._tensor(name)
        if t.dtype is not _dt.STRING:
            raise TypeError(f"{name!r} is a {t.dtype.name} tensor, not a string tensor")
        return self._string_parts(self._value(name, extents).reshape(-1), chunk_bytes)

    @staticmethod
    def _string_parts(
        values: np.ndarray, chunk_bytes: int
    ) -> Iterator[tuple[str, np.ndarray, int]]:
        lengths = np.fromiter((len(v) for v in values), dtype=np.uint64, count=len(values))
        if len(lengths):
            yield "lengths", lengths, int(lengths.nbytes)
        data = b"".join(values)
        step = max(chunk_bytes, 1)
        for start in range(0, len(data), step):
            piece = np.frombuffer(data[start : start + step], dtype=np.uint8)
            yield "data", piece, len(piece)


def _canonical(extents: Slice, shape: tuple[int, ...]) -> Slice:
    """Extents covering their whole axis as (0, None), to compare slices however written."""
    return tuple(
        (0, None) if (start == 0 and (n is None or n == dim)) else (start, n)
        for (start, n), dim in zip(extents, shape)
    )
