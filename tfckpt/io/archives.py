"""Archives as sources: a tar (plain, gzip, bzip2 or xz) or zip file read as a directory.

``ARCHIVE#MEMBER`` names a member of an archive (a prefix, a file or a directory in
it, as on a file system); a path ending in ``.tar``, ``.tar.gz``/``.tgz``,
``.tar.bz2``/``.tbz2``, ``.tar.xz``/``.txz`` or ``.zip`` that is a file names the
archive itself (its root). :func:`storage_within` is how :func:`~tfckpt.io.storage.storage_for`
finds them; :func:`archive_at` opens a file that is an archive by its content whatever
its name. The archive is read through the storage it is on (a local path or any fsspec
URL), and nothing is ever extracted: :class:`ArchiveStorage` is a read-only
:class:`~tfckpt.io.storage.Storage` over an :class:`~tfckpt.io.members.Index` of the
members, built on first use.

What each kind costs (``members.py`` checks names and sizes; ``compressed.py`` reads
compressed bytes at any offset):

- **tar, zip with stored members**: indexing reads the headers only (a tar's, one per
  member; a zip's central directory); a read is a read of the same bytes of the
  archive (a range request on object storage, a mapping of the file locally).
- **tar.gz**: indexing decompresses the archive once, keeping restart points every few
  MiB; a read then decompresses at most one span more than it reads.
- **deflated zip members**: each member is its own stream with its own restart points.
- **tar.bz2, tar.xz**: indexing decompresses once; reads in archive order cost one more
  pass, and each read before the last one goes back to the start of the archive.
  Small members (up to 1 MiB each, 16 MiB in all) and the last bytes of every other
  file are kept as they pass, so a state file, most indexes, and telling which files
  are V1 tables, cost nothing more.

Memory stays bounded whatever the archive declares: see both modules.
"""

from __future__ import annotations

import errno
import posixpath
import re
import threading
import weakref

from tfckpt.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointWriteError,
    CorruptCheckpointError,
    UnsupportedCheckpointError,
)
from tfckpt.io import members as _m
from tfckpt.io.compressed import Cursor, Stream
from tfckpt.io.storage import (
    ARCHIVE_SUFFIXES,
    LOCAL,
    Reader,
    RemoteStorage,
    Storage,
    StorageOptions,
    is_url,
)

MARK = "#"
# Zip files that are something else, and said so where opening fails (opening.py).
NOT_ARCHIVES = (".keras", ".npz", ".h5")
WHOLE_MAX = 64 << 20
_ROOTED = re.compile(r"^(?:[/\\]|[A-Za-z]:[/\\])")


def has_archive_suffix(path: str) -> bool:
    return path.lower().endswith(ARCHIVE_SUFFIXES)


def _outer(path: str, storage_options: StorageOptions | None) -> Storage:
    """The storage ``path`` (an archive) is on: an archive's, for one inside another."""
    if MARK in path:
        within = storage_within(path, storage_options)
        if within is not None:
            return within
    return RemoteStorage.for_url(path, storage_options) if is_url(path) else LOCAL


def storage_within(path: str, storage_options: StorageOptions | None) -> Storage | None:
    """The storage of the archive ``path`` names or addresses a member of; None when it
    names none. ``ARCHIVE#MEMBER`` counts when ARCHIVE has an archive's suffix or is a
    file (the last such ``#`` counts: an archive may be a member of another); a bare
    path when it has the suffix, is a file, and is not a checkpoint prefix
    (``PATH.index``)."""
    marks = [i for i, c in enumerate(path) if c == MARK][::-1]
    for i in marks:
        if has_archive_suffix(path[:i]):
            return archive_storage(_outer(path[:i], storage_options), path[:i])
    for i in marks:
        outer = _outer(path[:i], storage_options)
        try:
            if outer.isfile(path[:i]):
                return archive_storage(outer, path[:i])
        except (OSError, CheckpointError):
            pass
    if has_archive_suffix(path):
        outer = _outer(path, storage_options)
        if outer.isfile(path) and not outer.isfile(path + ".index"):
            return archive_storage(outer, path)
    return None


def archive_at(store: Storage, path: str) -> ArchiveStorage | None:
    """``path`` on ``store`` as an archive when it is a file whose content is one (a tar,
    compressed or not, or a zip, but not a Keras or npz file; a member of an archive
    too); else None."""
    if path.lower().endswith(NOT_ARCHIVES):
        return None
    try:
        if not store.isfile(path):
            return None
        reader = store.open_reader(path)
        try:
            buf = bytearray(512)
            n = reader.readinto(memoryview(buf), 0)
        finally:
            reader.close()
    except (OSError, CheckpointError):
        return None
    if _m.sniff(bytes(buf[:n])) is None:
        return None
    return archive_storage(store, path)


_OPEN: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_OPEN_LOCK = threading.Lock()


def archive_storage(outer: Storage, archive: str) -> ArchiveStorage:
    """The storage of the archive ``archive`` on ``outer``: the one already in use in this
    process, if any (its index is built once), else a new one."""
    key = (outer, outer.realpath(archive), archive)
    with _OPEN_LOCK:
        store = _OPEN.get(key)
        if store is None:
            store = ArchiveStorage(outer, archive)
            _OPEN[key] = store
        return store


class ArchiveStorage(Storage):
    """The members of one archive as a read-only file system; paths are ``ARCHIVE#MEMBER``
    (the archive's own path is its root). Writing anything is refused."""

    local = False
    sep = "/"
    atomic_rename = False

    def __init__(self, outer: Storage, archive: str):
        self.outer = outer
        self.root = archive
        self.options = outer.options
        self._real = outer.realpath(archive)
        self._index: _m.Index | None = None
        self._failed: CheckpointError | None = None
        self._lock = threading.Lock()

    def __reduce__(self):
        return (archive_storage, (self.outer, self.root))

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, ArchiveStorage)
            and self.outer == other.outer
            and self._real == other._real
        )

    def __hash__(self) -> int:
        return hash((self.outer, self._real))

    def __repr__(self) -> str:
        return f"<ArchiveStorage {self.root}>"

    # -- the index

    def index(self) -> _m.Index:
        """The archive's members, read on first use (an error then is kept and raised
        again: the archive is not read twice to fail twice)."""
        with self._lock:
            if self._index is not None:
                return self._index
            if self._failed is not None:
                raise self._failed
            try:
                self._index = _m.index_archive(self._open_archive, self.root)
            except CheckpointError as e:
                self._failed = e
                raise
            return self._index

    def _open_archive(self) -> Reader:
        try:
            return self.outer.open_reader(self.root)
        except FileNotFoundError:
            raise CheckpointNotFoundError("no such archive", path=self.root) from None
        except OSError as e:
            raise CheckpointError(
                f"cannot open archive: {e.strerror or e}", path=self.root
            ) from None

    @property
    def kind(self) -> str:
        """ "tar", "tar.gz", "tar.bz2", "tar.xz" or "zip"."""
        return self.index().kind

    # -- names

    def member(self, path: str) -> str:
        """The member name ``path`` addresses (``""``: the root)."""
        path = str(path)
        if path == self.root:
            return ""
        head = self.root + MARK
        if not path.startswith(head):
            raise CheckpointError(f"not a path inside the archive {self.root}", path=path)
        parts: list[str] = []
        for p in path[len(head) :].split("/"):
            if p == "..":
                if not parts:
                    raise CheckpointNotFoundError("climbs out of the archive", path=path)
                parts.pop()
            elif p not in ("", "."):
                parts.append(p)
        return "/".join(parts)

    def path_of(self, member: str) -> str:
        return f"{self.root}{MARK}{member}" if member else self.root

    def is_root(self, path) -> bool:
        return self.member(path) == ""

    def directories(self) -> list[str]:
        """Every directory in the archive (its root first), as paths."""
        return [self.path_of(d) for d in self.index().directories()]

    def join(self, *parts: str) -> str:
        head, *rest = parts
        return self.path_of(posixpath.join(self.member(head), *rest))

    def dirname(self, path: str) -> str:
        return self.path_of(posixpath.dirname(self.member(path)))

    def basename(self, path: str) -> str:
        member = self.member(path)
        return posixpath.basename(member) if member else self.outer.basename(self.root)

    def isabs(self, path: str) -> bool:
        return bool(_ROOTED.match(path)) or "://" in path or MARK in path

    def may_lead_to(self, directory: str, name: str) -> bool:
        """Only to members of this archive: a relative name that does not climb out."""
        if self.isabs(name):
            return False
        target = posixpath.normpath(posixpath.join(self.member(directory) or ".", name))
        return not (target == ".." or target.startswith("../"))

    def dir_path(self, path: str) -> str:
        return self.path_of(self.member(path))

    def realpath(self, path: str) -> str:
        return f"{self.outer.realpath(self.root)}{MARK}{self.member(path)}"

    # -- looking

    def isfile(self, path: str) -> bool:
        return self.index().file(self.member(path)) is not None

    def isdir(self, path: str) -> bool:
        index = self.index()
        found = index.resolve(self.member(path))
        return found is not None and found in index.children

    def exists(self, path: str) -> bool:
        return self.index().resolve(self.member(path)) is not None

    def irregular(self, path: str) -> bool:
        index = self.index()
        member = self.member(path)
        return index.exists(member) and index.file(member) is None

    def listdir(self, path: str) -> list[str]:
        index = self.index()
        found = index.resolve(self.member(path))
        if found is None or found not in index.children:
            raise FileNotFoundError(errno.ENOTDIR, "no such directory in the archive", path)
        return list(index.children[found])

    def names(self, limit: int) -> list[str]:
        """The first ``limit`` entries of the archive (but directories), as member names."""
        index = self.index()
        return [n for n, m in index.members.items() if m.kind != _m.DIR][:limit]

    # -- reading

    def open_reader(self, path: str) -> Reader:
        index = self.index()
        name = self.member(path)
        found = index.resolve(name)
        if found is None:
            raise FileNotFoundError(errno.ENOENT, "no such file in the archive", path)
        m = index.members.get(found)
        if m is None or m.kind != _m.FILE:
            what = "a directory" if m is None else f"a {m.kind} member"
            raise CorruptCheckpointError(f"not a regular file ({what})", path=path)
        if m.zip is not None:
            return self._zip_reader(index, found, m, path)
        if index.stream is not None:
            cached = index.cached.get(found)
            if cached is not None:
                return BytesReader(path, cached)
            return StreamReader(path, index.stream, m.offset, m.size, index.tails.get(found))
        return SliceReader(path, self._open_archive(), m.offset, m.size)

    def _zip_reader(self, index: _m.Index, name: str, m: _m.Member, path: str) -> Reader:
        start, csize, codec, crc = _m.zip_data(index, self._open_archive, name, m)
        if codec is None:
            return SliceReader(path, self._open_archive(), start, m.size)
        stream = Stream(self._open_archive, start, start + csize, codec, path, size=m.size, crc=crc)
        return StreamReader(path, stream, 0, m.size, None)

    def read_bytes(self, path: str) -> bytes:
        """A member whole (an index, a state file); one in a compressed stream at most
        :data:`WHOLE_MAX` bytes, whatever it declares (a bomb posing as an index)."""
        reader = self.open_reader(path)
        try:
            if isinstance(reader, StreamReader) and reader.size > WHOLE_MAX:
                raise UnsupportedCheckpointError(
                    f"the member is {reader.size} bytes, compressed; tfckpt reads at most "
                    f"{WHOLE_MAX >> 20} MiB of a compressed member whole (an index of about "
                    "a million tensors): extract it",
                    path=path,
                )
            buf = bytearray(reader.size)
            view = memoryview(buf)
            done = 0
            while done < len(buf):
                n = reader.readinto(view[done:], done)
                if n == 0:
                    raise CorruptCheckpointError("the member ends early", path=path)
                done += n
            return bytes(buf)
        finally:
            reader.close()

    # -- writing: never

    def check_writable(self, path: str) -> None:
        raise CheckpointWriteError(
            "cannot write inside an archive (archives are read-only sources); "
            "write to a directory, then pack it with tar or zip if you need an archive",
            path=path,
        )

    def write_bytes(self, path: str, data: bytes) -> None:
        self.check_writable(path)

    def write_new(self, path: str, data, *, durable: bool = False) -> None:
        self.check_writable(path)

    def open_writer(self, path: str, *, exclusive: bool = True):
        self.check_writable(path)

    def replace(self, src: str, dst: str) -> None:
        self.check_writable(dst)

    def rename_noreplace(self, src: str, dst: str) -> None:
        self.check_writable(dst)

    def remove(self, path: str) -> None:
        self.check_writable(path)

    def makedirs(self, path: str) -> list[str]:
        self.check_writable(path)
        return []

    def fsync(self, file) -> None:
        pass

    def fsync_dir(self, directory: str) -> None:
        pass

    def writeback(self, file, start: int, n: int) -> bool:
        return False

    def remove_dirs(self, directories: list[str]) -> None:
        pass


class SliceReader:
    """A member stored as it is (a plain tar's, a stored zip member): its bytes are a
    range of the archive, read, or mapped, in place."""

    def __init__(self, path: str, archive: Reader, base: int, size: int):
        self.path = path
        self.size = size
        self._archive = archive
        self._base = base

    def readinto(self, buf: memoryview, offset: int) -> int:
        n = min(len(buf), self.size - offset)
        if n <= 0:
            return 0
        return self._archive.readinto(buf[:n], self._base + offset)

    def view(self, offset: int, n: int):
        """A zero-copy view of the bytes, when the archive is a mapped local file."""
        view = getattr(self._archive, "view", None)
        if view is None or offset + n > self.size:
            return None
        return view(self._base + offset, n)

    def close(self) -> None:
        self._archive.close()


class StreamReader:
    """A member inside a compressed stream: reads decompress (see ``compressed.py``),
    except of the last bytes when they were kept as the archive was indexed."""

    def __init__(self, path: str, stream: Stream, base: int, size: int, tail: bytes | None):
        self.path = path
        self.size = size
        self._base = base
        self._tail = tail
        self._cursor: Cursor = stream.cursor()
        self._stream = stream

    def readinto(self, buf: memoryview, offset: int) -> int:
        n = min(len(buf), self.size - offset)
        if n <= 0:
            return 0
        tail = self._tail
        if tail is not None and offset >= self.size - len(tail):
            at = offset - (self.size - len(tail))
            buf[:n] = tail[at : at + n]
            return n
        got = self._cursor.readinto(buf[:n], self._base + offset)
        if got < n:
            raise CorruptCheckpointError(
                f"the member ends at byte {offset + got} of its {self.size}", path=self.path
            )
        return got

    def close(self) -> None:
        self._cursor.close()


class BytesReader:
    """A small member kept in memory as the archive was indexed."""

    def __init__(self, path: str, data: bytes):
        self.path = path
        self.size = len(data)
        self._data = data

    def readinto(self, buf: memoryview, offset: int) -> int:
        chunk = self._data[offset : offset + len(buf)]
        buf[: len(chunk)] = chunk
        return len(chunk)

    def close(self) -> None:
        pass
