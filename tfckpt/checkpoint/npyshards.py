"""The original OpenAI GPT release (``openai/finetune-transformer-lm``'s ``model/``
directory: ``params_shapes.json`` and ``params_0.npy`` ... ``params_9.npy``) read
through the :class:`~tfckpt.checkpoint.reader.Checkpoint` API: :class:`NpyShardsCheckpoint`.

What the files hold and how the parameters are named is
:mod:`tfckpt.format.npyshards`. Opening reads the shapes file and each shard's ``.npy``
header only (every file is checked then: a missing shard, a truncated one, an array of
Python objects or a shapes file whose sizes are not what the shards hold is an error
naming the file); a tensor's values are read on demand with positioned reads of the
shards it lies in (a parameter may begin in one shard and end in the next), or with
``mmap`` mapped, zero-copy, when it lies in one local shard. Nothing is unpickled.

>>> with tfckpt.open("finetune-transformer-lm/model") as ckpt:
...     ckpt.info("model/we/tokens").shape
(40478, 768)
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from tfckpt.checkpoint.reader import DEFAULT_CHUNK_BYTES, Checkpoint
from tfckpt.checkpoint.slicing import Region, region_counts, region_index
from tfckpt.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    TensorNotFoundError,
    UnsupportedCheckpointError,
)
from tfckpt.format.bundle import Header, TensorInfo, TensorTable, Version
from tfckpt.format.npyshards import (
    HEAD_BYTES,
    MAX_SHAPES_BYTES,
    SHAPES_NAME,
    SHARD_RE,
    NpyHeader,
    npy_header,
    parameters,
    parse_shapes,
    shard_name,
)
from tfckpt.format.slices import Slice, num_elements
from tfckpt.io.storage import Reader, Storage, StorageOptions, normalize, storage_for

FORMAT_NAME = "OpenAI GPT numpy shards"


def find_npy_shards(store: Storage, path) -> str | None:
    """The release directory ``path`` designates: the directory holding
    ``params_shapes.json``, that file itself, or one of its ``params_K.npy`` shards;
    else None."""
    p = normalize(path)
    try:
        if store.isdir(p):
            directory = store.dir_path(p)
            return directory if store.isfile(store.join(directory, SHAPES_NAME)) else None
        base = store.basename(p)
        if base != SHAPES_NAME and not SHARD_RE.match(base):
            return None
        directory = store.dirname(p) or "."
        return directory if store.isfile(store.join(directory, SHAPES_NAME)) else None
    except (OSError, CheckpointError):
        return None
    return None


class NpyShardsCheckpoint(Checkpoint):
    """The OpenAI GPT release's ``model/`` directory, read as a checkpoint (see the
    module's text). ``prefix`` is the directory; ``files`` the shapes file and the
    shards, in order; :meth:`info`'s ``shard`` the shard a tensor begins in and
    ``offset`` where, in bytes from the file's start."""

    format = FORMAT_NAME

    def __init__(
        self,
        path,
        *,
        verify: bool = True,
        mmap: bool = True,
        storage_options: StorageOptions | None = None,
        storage: Storage | None = None,
        resolved: str | None = None,
    ):
        # ``resolved``: the directory open_checkpoint found for ``path``.
        self.storage = storage or storage_for(normalize(path), storage_options)
        directory = resolved or find_npy_shards(self.storage, path)
        if directory is None:
            raise CheckpointNotFoundError(f"no {SHAPES_NAME} here", path=normalize(path))
        self.prefix = directory
        self.index_path = self.storage.join(directory, SHAPES_NAME)
        self.verify, self.mmap = verify, mmap
        self._readers = {}
        self._shards: list[tuple[str, Reader, NpyHeader]] = []
        self._closed = False
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        store = self.storage
        shapes = parse_shapes(self._shapes_bytes(), self.index_path)
        names = parameters(shapes, self.index_path)
        numbers = sorted(
            int(m[1]) for m in map(SHARD_RE.match, store.listdir(self.prefix)) if m is not None
        )
        if not numbers:
            raise CheckpointNotFoundError(
                f"no shard beside {SHAPES_NAME}", path=self._path(shard_name(0))
            )
        for k in range(numbers[-1] + 1):
            if k >= len(numbers) or numbers[k] != k:
                raise CheckpointNotFoundError(
                    f"the shard is missing (params_0.npy to params_{numbers[-1]}.npy are "
                    "the release's parameters, in order)",
                    path=self._path(shard_name(k)),
                )
        first: NpyHeader | None = None
        for k in numbers:
            path = self._path(shard_name(k))
            reader = self._open_reader(path)
            self._shards.append((path, reader, npy_header(self._head(reader), reader.size, path)))
            header = self._shards[-1][2]
            if first is None:
                first = header
            elif (header.dtype, header.order) != (first.dtype, first.order):
                raise UnsupportedCheckpointError(
                    f"its elements are {header.order}-endian {header.dtype.name}, params_0.npy's "
                    f"{first.order}-endian {first.dtype.name}: the shards are pieces of one array",
                    path=path,
                )
        assert first is not None
        self.dtype = first.dtype
        self.header = Header(len(self._shards), first.order, Version(0, 0))
        self._starts = [0]  # element k of the concatenation is in shard bisect(starts, k) - 1
        for _, _, h in self._shards:
            self._starts.append(self._starts[-1] + h.count)
        held, wanted = self._starts[-1], sum(num_elements(s) for s in shapes)
        if held != wanted:
            more = "more" if held > wanted else "fewer"
            raise CorruptCheckpointError(
                f"its shapes take {wanted} values; the {len(self._shards)} shards hold "
                f"{held}, {abs(held - wanted)} {more}: a shard or the shapes are not the "
                "release's",
                path=self.index_path,
            )
        self._params: dict[str, tuple[int, tuple[int, ...]]] = {}
        at = 0
        for name, shape in zip(names, shapes):
            self._params[name] = (at, shape)
            at += num_elements(shape)
        self._names = names
        self.files = [self.index_path, *(p for p, _, _ in self._shards)]

    def _path(self, name: str) -> str:
        return self.storage.join(self.prefix, name)

    def _open_reader(self, path: str) -> Reader:
        try:
            return self.storage.open_reader(path)
        except (OSError, CheckpointError) as e:
            detail = e.strerror if isinstance(e, OSError) else e.detail
            raise CheckpointNotFoundError(f"cannot read: {detail or e}", path=path) from None

    def _head(self, reader: Reader, limit: int = HEAD_BYTES) -> bytes:
        """The file's first ``limit`` bytes (fewer where it is shorter)."""
        buf = bytearray(min(limit, reader.size))
        done = 0
        while done < len(buf):
            try:
                n = reader.readinto(memoryview(buf)[done:], done)
            except OSError as e:
                raise CorruptCheckpointError(
                    f"read failed: {e.strerror or e}", path=reader.path
                ) from None
            if n <= 0:
                break
            done += n
        return bytes(buf[:done])

    def _shapes_bytes(self) -> bytes:
        reader = self._open_reader(self.index_path)
        try:
            if reader.size > MAX_SHAPES_BYTES:
                raise CorruptCheckpointError(
                    f"{reader.size} bytes: more than a list of shapes takes", path=self.index_path
                )
            data = self._head(reader, reader.size)
        finally:
            reader.close()
        if len(data) < reader.size:
            raise CorruptCheckpointError("the file ended early", path=self.index_path)
        return data

    def __repr__(self) -> str:
        return (
            f"<tfckpt.Checkpoint {self.prefix!r} ({FORMAT_NAME}, {len(self._shards)} shards): "
            f"{len(self)} tensors>"
        )

    def __contains__(self, name) -> bool:
        return isinstance(name, str) and name in self._params

    @property
    def stem(self) -> str:
        """The directory's name (``model``): an output directory's checkpoint name."""
        base = self.storage.basename(self.prefix.rstrip("/"))
        return base if base and base != "." else "model"

    @property
    def tf_path(self) -> str:
        return self.prefix

    @property
    def data_files(self) -> list[str]:
        return [p for p, _, _ in self._shards]

    def check_shard_files(self, shard_ids) -> None:
        pass  # every shard was opened and checked

    def close(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        shards, self._shards = self._shards, []
        for _, reader, _ in shards:
            reader.close()

    # -- metadata

    def _param(self, name: str) -> tuple[int, tuple[int, ...]]:
        found = self._params.get(name) if isinstance(name, str) else None
        if found is None:
            raise TensorNotFoundError(
                f"no tensor {name!r} in checkpoint", path=self.prefix, tensor=name
            )
        if self._closed:
            raise CheckpointError("the checkpoint is closed", path=self.prefix, tensor=name)
        return found

    def info(self, name: str) -> TensorInfo:
        start, shape = self._param(name)
        k = bisect.bisect_right(self._starts, start) - 1
        k = min(k, len(self._shards) - 1)
        offset = self._shards[k][2].offset + (start - self._starts[k]) * self.dtype.fixed_itemsize
        n = num_elements(shape)
        return TensorInfo(
            name,
            self.dtype.name,
            shape,
            n * self.dtype.fixed_itemsize,
            k,
            offset,
            None,
            stored_elements=n,
        )

    def table(self, names: Sequence[str] | None = None) -> TensorTable:
        return TensorTable.of([self.info(n) for n in (self.keys() if names is None else names)])

    def shard_path(self, name: str) -> str:
        """The shard file tensor ``name`` begins in."""
        return self._shards[self.info(name).shard or 0][0]

    def slice_info(self, name: str) -> list[TensorInfo]:
        self._param(name)
        return []

    def orphan_slice_keys(self) -> list[bytes]:
        return []

    # -- values

    def _flat(self, name: str, start: int, count: int, buf: np.ndarray | None = None) -> np.ndarray:
        """Elements ``[start, start + count)`` of tensor ``name``'s, as bytes (into
        ``buf`` when given), read from every shard they lie in."""
        at, _ = self._param(name)
        itemsize = self.dtype.fixed_itemsize
        out = np.empty(count * itemsize, np.uint8) if buf is None else buf
        first, end = at + start, at + start + count
        k = bisect.bisect_right(self._starts, first) - 1
        done = 0
        while first + done < end:
            path, reader, header = self._shards[k]
            lo = first + done - self._starts[k]
            n = min(end, self._starts[k + 1]) - (first + done)
            self._pread(
                reader, out[done * itemsize : (done + n) * itemsize], header, lo, path, name
            )
            done += n
            k += 1
        return out

    def _pread(
        self, reader: Reader, buf: np.ndarray, header: NpyHeader, element: int, path, name
    ) -> None:
        offset = header.offset + element * self.dtype.fixed_itemsize
        view, done = buf.data, 0
        while done < len(buf):
            try:
                n = reader.readinto(view[done:], offset + done)
            except OSError as e:
                raise CorruptCheckpointError(
                    f"read failed: {e.strerror or e}", path=path, tensor=name
                ) from None
            if n <= 0:
                raise CorruptCheckpointError(
                    "unexpected end of file (the file was truncated since it was opened)",
                    path=path,
                    tensor=name,
                )
            done += n

    def read(self, name: str) -> np.ndarray:
        start, shape = self._param(name)
        n = num_elements(shape)
        if self.mmap and n:
            k = bisect.bisect_right(self._starts, start) - 1
            if start + n <= self._starts[k + 1]:
                _, reader, header = self._shards[k]
                view = getattr(reader, "view", None)
                itemsize = self.dtype.fixed_itemsize
                buf = None
                if view is not None:
                    buf = view(header.offset + (start - self._starts[k]) * itemsize, n * itemsize)
                if buf is not None:
                    return self._to_array(buf, self.dtype, shape)
        return self._to_array(self._flat(name, 0, n), self.dtype, shape)

    def read_bytes(self, name: str, extents: Slice | None = None) -> bytes:
        """The tensor's bytes as a bundle stores them (little-endian)."""
        self._no_slices(name, extents)
        value = self.read(name)
        return np.ascontiguousarray(value).astype(value.dtype.newbyteorder("<")).tobytes()

    def read_slice(self, name: str, extents: Slice) -> np.ndarray:
        self._param(name)
        raise TensorNotFoundError(
            "a parameter of the release is stored whole, in no slices",
            path=self.prefix,
            tensor=name,
        )

    def _no_slices(self, name: str, extents: Slice | None) -> None:
        self._param(name)
        if extents is not None:
            self.read_slice(name, extents)

    def variant_elements(self, name: str, extents: Slice | None = None) -> list[bytes]:
        self._param(name)
        raise UnsupportedCheckpointError(
            f"a {self.dtype.name} tensor, not a variant", path=self.prefix, tensor=name
        )

    def read_elements(
        self, name: str, start: int, count: int, extents: Slice | None = None
    ) -> np.ndarray:
        """Elements ``[start, start + count)`` (row-major) of tensor ``name``."""
        self._no_slices(name, extents)
        _, shape = self._param(name)
        if start < 0 or count < 0 or start + count > num_elements(shape):
            raise ValueError(f"elements [{start}, {start + count}) lie outside {name!r}")
        return self._to_array(self._flat(name, start, count), self.dtype, (count,))

    def read_region(self, name: str, region: Region) -> np.ndarray:
        """A region of a tensor, read a band of rows at a time (at most about a chunk)."""
        _, shape = self._param(name)
        if not shape:
            return self.read(name)[region_index(region)]
        out = np.empty(region_counts(region), dtype=self.dtype.array_dtype)
        if not out.size:
            return out
        itemsize = self.dtype.fixed_itemsize
        row = num_elements(shape[1:])
        start, count, step = region[0]
        per_band = max(1, DEFAULT_CHUNK_BYTES // max(1, step * row * itemsize))
        inner = region_index(region[1:])
        for k0 in range(0, count, per_band):
            k1 = min(count, k0 + per_band)
            r0, r1 = start + k0 * step, start + (k1 - 1) * step + 1
            raw = self._flat(name, r0 * row, (r1 - r0) * row)
            rows = self._to_array(raw, self.dtype, (r1 - r0,) + shape[1:])
            out[k0:k1] = rows[(slice(None, None, step),) + inner]
        return out

    def read_together(self, names, *, buffers=None) -> list[np.ndarray]:
        """Whole tensors as 1-D arrays, in one buffer (``buffers``, as for
        :meth:`iter_chunks`)."""
        sizes = [num_elements(self._param(n)[1]) for n in names]
        itemsize = self.dtype.fixed_itemsize
        total = sum(sizes) * itemsize
        buf = np.empty(total, dtype=np.uint8) if buffers is None else buffers(total)
        out, pos = [], 0
        for name, n in zip(names, sizes):
            part = buf[pos : pos + n * itemsize]
            self._flat(name, 0, n, part)
            out.append(self._to_array(part, self.dtype, (n,)))
            pos += n * itemsize
        return out

    def iter_chunks(
        self,
        name: str,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        extents: Slice | None = None,
        *,
        buffers: Callable[[int], np.ndarray] | None = None,
    ) -> Iterator[np.ndarray]:
        """Tensor ``name`` as 1-D arrays of about ``chunk_bytes``, in order."""
        self._no_slices(name, extents)
        _, shape = self._param(name)
        size, itemsize = num_elements(shape), self.dtype.fixed_itemsize
        if not size:
            yield np.empty(0, dtype=self.dtype.array_dtype)
            return
        step = max(1, chunk_bytes // itemsize)
        for start in range(0, size, step):
            count = min(step, size - start)
            buf = None if buffers is None else buffers(count * itemsize)
            yield self._to_array(self._flat(name, start, count, buf), self.dtype, (count,))

    def iter_string_parts(
        self, name: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES, extents: Slice | None = None
    ) -> Iterator[tuple[str, np.ndarray, int]]:
        self._param(name)
        raise TypeError(f"{name!r} is a {self.dtype.name} tensor, not strings")
