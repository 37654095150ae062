"""Where checkpoint files live: the local file system, or any fsspec URL.

Local paths use positioned reads on file descriptors and atomic renames.
A URL with a scheme (``s3://``, ``gs://``, ``memory://``, ...) goes through
fsspec (installed with ``tfckpt[remote]``) with range reads; object stores have
no rename, so there the index being written last is the commit.
"""

from __future__ import annotations

import mmap
import os
import posixpath

from .errors import CheckpointError


def normalize(path) -> str:
    """A path as tfckpt keeps it: ``file://`` URLs become plain local paths."""
    text = os.fspath(path)
    return text[len("file://"):] if text.startswith("file://") else text


def is_url(path) -> bool:
    text = os.fspath(path)
    return "://" in text and not text.startswith("file://")


def storage_for(path) -> "Storage":
    """The storage that holds ``path``."""
    if is_url(path):
        return RemoteStorage.for_url(os.fspath(path))
    return LOCAL


class Storage:
    """The operations tfckpt needs from where files live."""

    local = True
    sep = os.sep

    def join(self, *parts: str) -> str:
        return os.path.join(*parts)

    def dirname(self, path: str) -> str:
        return os.path.dirname(path)

    def basename(self, path: str) -> str:
        return os.path.basename(path)

    def isabs(self, path: str) -> bool:
        return os.path.isabs(path)

    def isfile(self, path: str) -> bool:
        return os.path.isfile(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def read_bytes(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def write_bytes(self, path: str, data: bytes) -> None:
        with open(path, "wb") as f:
            f.write(data)

    def open_reader(self, path: str) -> "LocalReader":
        return LocalReader(path)

    def remove(self, path: str) -> None:
        os.unlink(path)

    def realpath(self, path: str) -> str:
        return os.path.realpath(path)


class LocalReader:
    """Positioned reads from one local file (thread-safe: no shared file position).

    :meth:`view` maps the file instead: the page cache's own bytes, no copy.
    """

    def __init__(self, path: str):
        self.path = path
        self._fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self._fd).st_size
        self._map = None

    def readinto(self, buf: memoryview, offset: int) -> int:
        return os.preadv(self._fd, [buf], offset)

    def view(self, offset: int, n: int):
        """A read-only numpy view of bytes [offset, offset + n) of the mapped file.

        None when the file no longer holds those bytes (it was truncated since it
        was opened): touching a mapped page past the end of a file raises SIGBUS,
        which kills the process, so the file's current size is checked first.
        """
        import numpy as np
        if os.fstat(self._fd).st_size < offset + n:
            return None
        if self._map is None:
            self._map = mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ)
        if len(self._map) < offset + n:
            return None
        return np.frombuffer(self._map, dtype=np.uint8, count=n, offset=offset)

    def close(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # arrays still view it; it closes when the last one goes
            self._map = None
        os.close(self._fd)


LOCAL = Storage()


class RemoteStorage(Storage):
    """An fsspec file system; paths are full URLs."""

    local = False
    sep = "/"

    def __init__(self, fs, protocol: str):
        self.fs = fs
        self.protocol = protocol

    @classmethod
    def for_url(cls, url: str) -> "RemoteStorage":
        try:
            import fsspec
        except ImportError:
            raise CheckpointError("URLs need fsspec: pip install 'tfckpt[remote]' (and the "
                                  "file system's package, e.g. s3fs or gcsfs)", path=url) \
                from None
        try:
            fs, _ = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError) as e:
            raise CheckpointError(f"cannot open this URL's file system: {e}", path=url) \
                from None
        return cls(fs, url.split("://", 1)[0])

    def _strip(self, url: str) -> str:
        return self.fs._strip_protocol(url)

    def join(self, *parts: str) -> str:
        head, *rest = parts
        return posixpath.join(head, *rest) if rest else head

    def dirname(self, path: str) -> str:
        scheme, sep, rest = path.rpartition("://")
        return f"{scheme}{sep}{posixpath.dirname(rest)}"

    def basename(self, path: str) -> str:
        return posixpath.basename(path.rpartition("://")[2])

    def isabs(self, path: str) -> bool:
        return "://" in path

    def isfile(self, path: str) -> bool:
        try:
            return self.fs.isfile(self._strip(path))
        except (OSError, ValueError):
            return False

    def isdir(self, path: str) -> bool:
        try:
            return self.fs.isdir(self._strip(path))
        except (OSError, ValueError):
            return False

    def listdir(self, path: str) -> list[str]:
        return [posixpath.basename(p.rstrip("/"))
                for p in self.fs.ls(self._strip(path), detail=False)]

    def read_bytes(self, path: str) -> bytes:
        return self.fs.cat_file(self._strip(path))

    def write_bytes(self, path: str, data: bytes) -> None:
        with self.fs.open(self._strip(path), "wb") as f:
            f.write(data)

    def open_writer(self, path: str):
        return self.fs.open(self._strip(path), "wb")

    def open_reader(self, path: str) -> "RemoteReader":
        return RemoteReader(self, path)

    def remove(self, path: str) -> None:
        self.fs.rm_file(self._strip(path))

    def move(self, src: str, dst: str) -> None:
        self.fs.mv(self._strip(src), self._strip(dst))

    def realpath(self, path: str) -> str:
        """One spelling per object (``memory:///a`` and ``memory://a`` are the same)."""
        return f"{self.protocol}://{self._strip(path).lstrip('/')}"


class RemoteReader:
    """Range reads of one object: only the bytes asked for are fetched."""

    def __init__(self, store: RemoteStorage, path: str):
        self.path = path
        self._store = store
        self._key = store._strip(path)
        try:
            self.size = int(store.fs.size(self._key))
        except FileNotFoundError:
            raise
        except (OSError, ValueError) as e:
            raise FileNotFoundError(str(e)) from None

    def readinto(self, buf: memoryview, offset: int) -> int:
        n = min(len(buf), max(self.size - offset, 0))
        if n == 0:
            return 0
        data = self._store.fs.cat_file(self._key, start=offset, end=offset + n)
        buf[:len(data)] = data
        return len(data)

    def close(self) -> None:
        pass
