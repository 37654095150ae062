"""Where checkpoint files live: the local file system, or any fsspec URL.

Local paths use positioned reads on file descriptors and atomic renames.
A URL with a scheme (``s3://``, ``gs://``, ``memory://``, ...) goes through
fsspec (installed with ``tfckpt[remote]``) with range reads; object stores have
no rename, so there the index being written last is the commit.

Both expose the same reading and writing operations; this is the only module that
asks where a path lives or calls the operating system's file operations, so the
rest of tfckpt says what it needs (``atomic_rename`` tells which commit applies).

Remote calls are retried a bounded number of times and time out (see
:func:`remote_options`); whatever still fails leaves this module as a
:class:`CheckpointError` naming the object, never as the client library's own
exception.

Storage options (``storage_options=``: endpoint, credentials, ``anon=True`` ...) go to
fsspec when a URL's file system is made, and are never looked up from a context:
a public function takes them as a keyword argument and resolves each path it is given
to a :class:`Storage` once, with :func:`storage_for` (the edge); everything beneath is
handed that object (a ``store`` parameter, a reader's or writer's ``storage``), and a
path beside another one (a shard beside its index, a state file's target, a temporary
beside its final name) is on the storage of that other path. :class:`RemoteStorage`
pickles to a re-creation from its URL and options, :data:`LOCAL` to itself, so tasks
that run in other processes carry their storage with them. Options checked once
(:func:`check_options`) keep the words that name one in a message: ``storage option``
in the library, ``--storage-option`` on the command line.

Keeping several requests of one object in flight (concurrent range reads, multipart
uploads) is :mod:`tfckpt.io.remote`'s, which this module's remote storage hands its
readers and writers to where the file system allows.

It runs near 900 lines on purpose: being the one module that touches files is the
point, so the local and remote implementations of the same operations, their options,
retries and error translation stay side by side where they can be checked against
each other.
"""

from __future__ import annotations

import errno
import io
import mmap
import os
import posixpath
import re
import shutil
import stat
import sys
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from tfckpt.errors import (
    CheckpointError,
    CheckpointWriteError,
    CorruptCheckpointError,
    install_hint,
)

RETRIES_ENV = "TFCKPT_REMOTE_RETRIES"
TIMEOUT_ENV = "TFCKPT_REMOTE_TIMEOUT"
DEFAULT_RETRIES = 2
DEFAULT_TIMEOUT = 30.0


def normalize(path) -> str:
    """A path as tfckpt keeps it: ``file://`` URLs become plain local paths."""
    text = os.fspath(path)
    return text[len("file://") :] if text.startswith("file://") else text


def is_url(path) -> bool:
    text = os.fspath(path)
    return "://" in text and not text.startswith("file://")


StorageOptions = Mapping[str, Any]
# The names of archives tfckpt reads as sources (see tfckpt.io.archives).
ARCHIVE_SUFFIXES = (
    ".tar",
    ".tar.gz",
    ".tgz",
    ".tar.bz2",
    ".tbz2",
    ".tbz",
    ".tar.xz",
    ".txz",
    ".zip",
)
GIVEN_AS = "storage option"  # how the library names an option in a message


def storage_for(path, storage_options: StorageOptions | None) -> Storage:
    """The storage that holds ``path``: :data:`LOCAL`, or for a URL its fsspec file system
    made with ``storage_options`` (None: fsspec's defaults). Local paths ignore them.

    A path into an archive (``ARCHIVE#MEMBER``, or an archive file itself: see
    :mod:`tfckpt.io.archives`) gets the archive's read-only storage, the archive read
    through the storage it is on.

    Called where a path enters tfckpt (a public function's argument); what is beneath
    is handed the result, never the options.
    """
    text = os.fspath(path)
    if "#" in text or text.lower().endswith(ARCHIVE_SUFFIXES):
        from tfckpt.io.archives import storage_within

        within = storage_within(text, storage_options)
        if within is not None:
            return within
    if is_url(text):
        return RemoteStorage.for_url(text, storage_options)
    return LOCAL


class CheckedOptions(dict):
    """Storage options that passed :func:`check_options`, and how they were given
    (``given_as``: the words naming one of them in a message)."""

    def __init__(self, options: StorageOptions, given_as: str = GIVEN_AS):
        super().__init__(options)
        self.given_as = given_as

    def __reduce__(self):
        return (CheckedOptions, (dict(self), self.given_as))


def check_options(storage_options, what: str | None = None) -> CheckedOptions | None:
    """``storage_options`` as a dict of its own; ``TypeError`` unless a mapping of str keys.

    Options fsspec or s3fs would take but misuse (a negative block size reads nothing;
    ``loop`` replaces the event loop tfckpt calls through) are refused here as a
    :class:`CheckpointError` naming the option, ``what`` saying where it was given
    (``--storage-option`` on the command line; by default, as options checked before
    said, else ``storage option``). The result keeps ``what`` for later messages.
    """
    if storage_options is None:
        return None
    if not isinstance(storage_options, Mapping) or not all(
        isinstance(k, str) for k in storage_options
    ):
        raise TypeError("storage_options must be a mapping of option names (str) to values")
    if what is None:
        what = storage_options.given_as if isinstance(storage_options, CheckedOptions) else GIVEN_AS
    for key, value in storage_options.items():
        problem = _option_problem(key, value)
        if problem:
            raise CheckpointError(f"{what} {key}: {problem}")
    return CheckedOptions(storage_options, what)


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _number_or_none(v) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0)


# The options of fsspec itself and of s3fs whose values tfckpt can check before they are
# used: (the test a value must pass, what it must be). None: tfckpt sets these itself.
_OPTION_RULES: dict[str, tuple[Callable[[Any], bool], str] | None] = {
    "loop": None,
    "asynchronous": None,
    "default_block_size": (_positive_int, "must be a whole number of bytes > 0"),
    "max_concurrency": (_positive_int, "must be a whole number > 0"),
    "listings_expiry_time": (_number_or_none, "must be a number of seconds >= 0 or null"),
    **{
        k: (lambda v: v is None or isinstance(v, bool), "must be true or false")
        for k in (
            "anon",
            "use_ssl",
            "requester_pays",
            "version_aware",
            "skip_instance_cache",
            "use_listings_cache",
            "default_fill_cache",
            "cache_regions",
            "fixed_upload_size",
        )
    },
    **{
        k: (lambda v: v is None or isinstance(v, Mapping), "must be options (a JSON object)")
        for k in ("client_kwargs", "config_kwargs", "s3_additional_kwargs")
    },
    **{
        k: (lambda v: v is None or isinstance(v, str), "must be a string")
        for k in ("endpoint_url", "key", "secret", "token", "profile", "default_cache_type")
    },
}


def _option_problem(key: str, value) -> str | None:
    if key not in _OPTION_RULES:
        return None
    rule = _OPTION_RULES[key]
    if rule is None:
        return "not an option: tfckpt sets it itself"
    test, expected = rule
    return None if test(value) else f"{expected}, not {_shown(value)}"


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Storage:
    """The operations tfckpt needs from where files live: here, the local file system."""

    local = True
    sep = os.sep
    # Renames replace a name in one step and hard links exist: files can be written
    # under temporary names and moved into place, so a commit is one rename.
    atomic_rename = True
    options: CheckedOptions | None = None  # those it was made with

    def __reduce__(self):
        return "LOCAL"  # the module's one local storage, in any process

    def join(self, *parts: str) -> str:
        return os.path.join(*parts)

    def dirname(self, path: str) -> str:
        return os.path.dirname(path)

    def basename(self, path: str) -> str:
        return os.path.basename(path)

    def isabs(self, path: str) -> bool:
        return os.path.isabs(path)

    def may_lead_to(self, directory: str, name: str) -> bool:
        """Whether ``name``, read from a file in ``directory`` (a state file's checkpoint
        path), may be followed where it points. Locally anywhere: TensorFlow writes
        absolute paths, and ``..`` in a relative one."""
        return True

    def isfile(self, path: str) -> bool:
        return os.path.isfile(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def read_bytes(self, path: str) -> bytes:
        with os.fdopen(open_regular(path), "rb") as f:
            return f.read()

    def write_bytes(self, path: str, data: bytes) -> None:
        with open(path, "wb") as f:
            f.write(data)

    def write_new(self, path: str, data, *, durable: bool = False) -> None:
        """Create ``path`` holding ``data``; ``FileExistsError`` when the name is taken."""
        with open(path, "xb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())

    def open_writer(self, path: str, *, exclusive: bool = True):
        """A file to write ``path`` through; ``exclusive``: refuse an existing file."""
        return open(path, "xb" if exclusive else "wb", buffering=1 << 20)

    def fsync(self, file) -> None:
        """Wait until a written file's bytes are on the disk."""
        os.fsync(file.fileno())

    def fsync_dir(self, directory: str) -> None:
        """Make the names last created or renamed in ``directory`` durable (best effort)."""
        try:
            fd = os.open(directory, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    def writeback(self, file, start: int, n: int) -> bool:
        """Start writing bytes [start, start + n) of a file out (Linux); False if not done."""
        sync_file_range = _sync_file_range()
        if sync_file_range is None:
            return False
        file.flush()
        sync_file_range(file.fileno(), start, n, _SYNC_FILE_RANGE_WRITE)
        return True

    def replace(self, src: str, dst: str) -> None:
        """Rename ``src`` to ``dst``, replacing what ``dst`` was, in one step."""
        os.replace(src, dst)

    def rename_noreplace(self, src: str, dst: str) -> None:
        """Rename ``src`` to ``dst`` only if no file has that name: ``FileExistsError``.

        A hard link fails on a taken name, where a rename would replace it. Without
        hard links (some file systems), the name is checked, then renamed: a file
        created in between would be replaced.
        """
        try:
            os.link(src, dst)
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                raise
            if os.path.lexists(dst):
                raise FileExistsError(errno.EEXIST, "exists", dst) from None
            os.replace(src, dst)
            return
        try:
            os.unlink(src)
        except BaseException:
            try:
                os.unlink(dst)
            except OSError:
                pass
            raise

    def rename_dir_noreplace(self, src: str, dst: str) -> None:
        """Rename the directory ``src`` to ``dst`` only if nothing has that name:
        ``FileExistsError`` otherwise (Linux's ``renameat2``; elsewhere the name is
        checked, then renamed: only an empty directory made in between is replaced)."""
        if _renameat2(src, dst, _RENAME_NOREPLACE):
            return
        if os.path.lexists(dst):
            raise FileExistsError(errno.EEXIST, "exists", dst)
        try:
            os.rename(src, dst)
        except OSError as e:
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise FileExistsError(errno.EEXIST, "exists", dst) from None
            raise

    def exchange(self, a: str, b: str) -> None:
        """Swap the names of ``a`` and ``b`` (directories or files), in one step on Linux
        (``renameat2``'s ``RENAME_EXCHANGE``). Elsewhere, or on a file system without it,
        in three renames through a name beside ``b``: ``b`` is missing for a moment, but
        what it held is never lost (put back when the second rename fails)."""
        if _renameat2(a, b, _RENAME_EXCHANGE):
            return
        aside = f"{b}.tfckpt-old-{os.getpid()}-{os.urandom(4).hex()}"
        os.rename(b, aside)
        try:
            os.rename(a, b)
        except BaseException:
            os.rename(aside, b)
            raise
        os.rename(aside, a)

    def remove_tree(self, path: str) -> None:
        """Delete the directory ``path`` and all it holds (best effort: what cannot be
        removed stays)."""
        shutil.rmtree(path, ignore_errors=True)

    def makedirs(self, path: str) -> list[str]:
        """Create directory ``path`` and its missing parents; those created, innermost
        first. On failure, the ones created are removed again."""
        created = []
        missing = path
        while missing and not os.path.isdir(missing):
            created.append(missing)
            missing = os.path.dirname(missing)
        if created:
            try:
                os.makedirs(path, exist_ok=True)
            except BaseException:
                self.remove_dirs(created)
                raise
        return created

    def remove_dirs(self, directories: list[str]) -> None:
        """Remove directories, innermost first, as long as they are empty (best effort)."""
        for directory in directories:
            try:
                os.rmdir(directory)
            except OSError:
                break

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def irregular(self, path: str) -> bool:
        """Something other than a regular file has this name (a directory, a pipe...)."""
        return os.path.lexists(path) and not os.path.isfile(path)

    def dir_path(self, path: str) -> str:
        """A directory's path spelled as :meth:`join` expects it."""
        return path

    def check_writable(self, path: str) -> None:
        """Refuse, before anything is written, a destination nothing can be written to
        (inside an archive); here, anything may be."""

    def open_reader(self, path: str) -> Reader:
        return LocalReader(path)

    def remove(self, path: str) -> None:
        os.unlink(path)

    def same_file_system(self, other: Storage) -> bool:
        """Whether a path of ``other`` names a file of this storage (both local, or one
        object store): then a path written on one means the same on the other."""
        return other.local

    def stat(self, path: str) -> tuple[int, float]:
        """(size in bytes, modification time in seconds since the epoch) of a file."""
        st = os.stat(path)
        return st.st_size, st.st_mtime

    def realpath(self, path: str) -> str:
        return os.path.realpath(path)


_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def open_regular(path: str) -> int:
    """A read-only descriptor of ``path``, refused unless it is a regular file.

    Opening does not block: a named pipe in place of a checkpoint file would
    otherwise wait for a writer forever.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _FILE_KINDS if test(mode)), "not a file")
            raise CorruptCheckpointError(f"not a regular file ({kind})", path=path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


class Reader(Protocol):
    """Positioned reads of one data file or object, as the reader uses them."""

    path: str
    size: int

    def readinto(self, buf: memoryview, offset: int) -> int: ...

    def close(self) -> None: ...


class ReaderFile(io.RawIOBase):
    """A read-only, seekable file over a :class:`Reader` (for libraries that want a
    file, such as ``zipfile``): each read is a positioned read of the bytes asked for."""

    def __init__(self, reader: Reader):
        self._reader = reader
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._reader.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buf) -> int:
        n = self._reader.readinto(memoryview(buf).cast("B"), self._pos)
        self._pos += n
        return n


class LocalReader:
    """Positioned reads from one local file (thread-safe: no shared file position).

    :meth:`view` maps the file instead: the page cache's own bytes, no copy.
    """

    def __init__(self, path: str):
        self.path = path
        self._fd = open_regular(path)
        self.size = os.fstat(self._fd).st_size
        self._map: mmap.mmap | None = None

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


def _load_sync_file_range():
    """Linux's sync_file_range, to start writing dirty pages out early; None elsewhere."""
    if os.name != "posix":
        return None
    try:
        import ctypes  # on first write only: ctypes costs start-up time that reads never need

        # The process's own symbols include the C library's.
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
        fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        return fn
    except (OSError, AttributeError):
        return None


_SYNC_FILE_RANGE: list = []  # [sync_file_range or None] once looked up


def _sync_file_range():
    if not _SYNC_FILE_RANGE:
        _SYNC_FILE_RANGE.append(_load_sync_file_range())
    return _SYNC_FILE_RANGE[0]


_SYNC_FILE_RANGE_WRITE = 2

_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2  # renameat2's flags (linux/fs.h)
_AT_FDCWD = -100
_RENAMEAT2: list = []  # [renameat2 or None] once looked up


def _load_renameat2():
    """The C library's ``renameat2`` (Linux, glibc 2.28 on); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).renameat2
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        fn.restype = ctypes.c_int
        return fn
    except (OSError, AttributeError):
        return None


def _renameat2(src: str, dst: str, flags: int) -> bool:
    """``renameat2(src, dst, flags)``: True when done; False when neither the system nor
    the file system offers it (the caller does it another way); ``OSError`` otherwise
    (``FileExistsError`` for a name taken under ``RENAME_NOREPLACE``)."""
    if not _RENAMEAT2:
        _RENAMEAT2.append(_load_renameat2())
    fn = _RENAMEAT2[0]
    if fn is None:
        return False
    import ctypes

    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), src, None, dst)


LOCAL = Storage()


class RemoteStorage(Storage):
    """An fsspec file system; paths are full URLs.

    Made by :meth:`for_url` with the options given; it pickles to that call again (for a
    task run in another process), and two are equal when their file systems are.
    """

    local = False
    sep = "/"
    atomic_rename = False  # no rename: the index written last is the commit

    def __init__(self, fs, protocol: str, url: str, options: CheckedOptions | None = None):
        self.fs = fs
        self.protocol = protocol
        self.url = url  # the URL it was made for: some file systems take settings from it
        self.options = options

    def __reduce__(self):
        return (RemoteStorage.for_url, (self.url, self.options))

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, RemoteStorage)
            and self.protocol == other.protocol
            and self.fs == other.fs
        )

    def __hash__(self) -> int:
        return hash((self.protocol, self.fs))

    def __repr__(self) -> str:
        return f"<RemoteStorage {self.protocol}://>"

    @classmethod
    def for_url(cls, url: str, storage_options: StorageOptions | None = None) -> RemoteStorage:
        """The file system of ``url``, made with ``storage_options`` (checked: see
        :func:`check_options`) over tfckpt's own defaults (:func:`remote_options`)."""
        try:
            import fsspec
        except ImportError:
            raise CheckpointError(
                f"URLs need fsspec: {install_hint('remote')} (and the "
                "file system's package, e.g. s3fs or gcsfs)",
                path=url,
            ) from None
        protocol = url.split("://", 1)[0]
        retries, options = remote_options(protocol)
        given = check_options(storage_options)
        for key, value in (given or {}).items():
            default = options.get(key)  # given options win; nested ones key by key
            if isinstance(value, Mapping) and isinstance(default, Mapping):
                value = {**default, **value}
            options[key] = value
        try:
            fs, _ = fsspec.core.url_to_fs(url, **options)
            if retries is not None:
                # s3fs makes its client on first use: options it cannot take fail here,
                # as options, not later as a failed read of a checkpoint.
                fs.connect()
        except ImportError as e:
            raise CheckpointError(f"cannot open this URL's file system: {e}", path=url) from None
        except Exception as e:
            blamed = _blamed_options(given, e)
            raise CheckpointError(
                f"cannot open this URL's file system{blamed}: {_describe(e)}", path=url
            ) from None
        if retries is not None and hasattr(fs, "retries"):
            fs.retries = retries  # s3fs's own loop around botocore's retries
        _quiet_abandoned_requests(getattr(fs, "loop", None))
        return cls(fs, protocol, url, given)

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

    def may_lead_to(self, directory: str, name: str) -> bool:
        """On an object store, only into the bucket ``directory`` is in: an absolute
        ``name`` of the same scheme and bucket, a relative one, and neither with a
        ``..`` that could climb out of it (never to a local path)."""
        if ".." in re.split(r"[/\\]", name.partition("://")[2] or name):
            return False
        if not self.isabs(name):
            return True
        scheme, _, rest = directory.partition("://")
        name_scheme, _, name_rest = name.partition("://")
        return name_scheme == scheme and name_rest.split("/")[0] == rest.split("/")[0]

    def call(self, what: str, path: str, fn, *args, error=CheckpointError, **kwargs):
        """``fn(*args, **kwargs)``, with any failure but a missing object as ``error``."""
        try:
            return fn(*args, **kwargs)
        except FileNotFoundError:
            raise
        except CheckpointError:
            raise
        except Exception as e:  # botocore, aiohttp, gcsfs...: each library its own family
            raise error(f"{what} failed: {_describe(e)}", path=path) from None

    def isfile(self, path: str) -> bool:
        try:
            return self.call("looking up", path, self.fs.isfile, self._strip(path))
        except FileNotFoundError:
            return False

    def isdir(self, path: str) -> bool:
        try:
            return self.call("looking up", path, self.fs.isdir, self._strip(path))
        except FileNotFoundError:
            return False

    def listdir(self, path: str) -> list[str]:
        key = self._strip(path)
        self.fs.invalidate_cache(key)  # another process may have written here since
        return [
            posixpath.basename(p.rstrip("/"))
            for p in self.call("listing", path, self.fs.ls, key, detail=False)
        ]

    def read_bytes(self, path: str) -> bytes:
        return self.call("reading", path, self.fs.cat_file, self._strip(path))

    def write_bytes(self, path: str, data: bytes) -> None:
        """One request that stores the whole object, or nothing (never a part of it)."""
        self.call(
            "writing",
            path,
            self.fs.pipe_file,
            self._strip(path),
            bytes(data),
            error=CheckpointWriteError,
        )

    def write_new(self, path: str, data, *, durable: bool = False) -> None:
        """One request that stores the whole object (object stores have no exclusive create)."""
        self.write_bytes(path, data)

    def open_writer(self, path: str, *, exclusive: bool = True):
        """A streaming upload: on S3 with parts in flight behind the writer
        (:class:`tfckpt.io.remote.MultipartUpload`), elsewhere fsspec's own file."""
        from tfckpt.io import remote

        if remote.multipart_uploads(self.fs):
            return remote.MultipartUpload(self, path)
        return RemoteWriter(self, path)

    def fsync(self, file) -> None:
        pass  # an object is durable once stored

    def fsync_dir(self, directory: str) -> None:
        pass

    def writeback(self, file, start: int, n: int) -> bool:
        return False

    def rename_noreplace(self, src: str, dst: str) -> None:
        raise CheckpointWriteError("object stores cannot rename without replacing", path=src)

    def rename_dir_noreplace(self, src: str, dst: str) -> None:
        raise CheckpointWriteError("object stores cannot rename a directory", path=src)

    def exchange(self, a: str, b: str) -> None:
        raise CheckpointWriteError("object stores cannot rename a directory", path=a)

    def remove_tree(self, path: str) -> None:
        raise CheckpointWriteError("not removing a tree of objects", path=path)

    def makedirs(self, path: str) -> list[str]:
        return []  # object stores have no directories

    def remove_dirs(self, directories: list[str]) -> None:
        pass

    def exists(self, path: str) -> bool:
        return self.isfile(path) or self.isdir(path)

    def irregular(self, path: str) -> bool:
        return False  # objects are all regular

    def dir_path(self, path: str) -> str:
        return path.rstrip("/")

    def open_reader(self, path: str) -> Reader:
        """Range reads; on an asynchronous file system each read is several ranges in
        flight at once (:class:`tfckpt.io.remote.ConcurrentReader`)."""
        from tfckpt.io import remote

        reader = RemoteReader(self, path)
        if remote.concurrent_reads(self.fs):
            return remote.ConcurrentReader(self, path, reader.size)
        return reader

    def remove(self, path: str) -> None:
        self.call("deleting", path, self.fs.rm_file, self._strip(path), error=CheckpointWriteError)

    def replace(self, src: str, dst: str) -> None:
        """Copy, then delete: an object store's rename is not atomic."""
        self.call(
            f"moving to {dst}",
            src,
            self.fs.mv,
            self._strip(src),
            self._strip(dst),
            error=CheckpointWriteError,
        )

    def same_file_system(self, other: Storage) -> bool:
        return self == other

    def stat(self, path: str) -> tuple[int, float]:
        """(size, modification time): an object's size and its ``LastModified``."""
        info = self.call("looking up", path, self.fs.info, self._strip(path))
        when = info.get("LastModified") or info.get("mtime") or info.get("created") or 0
        if hasattr(when, "timestamp"):
            when = when.timestamp()
        return int(info.get("size") or 0), float(when)

    def realpath(self, path: str) -> str:
        """One spelling per object (``memory:///a`` and ``memory://a`` are the same)."""
        return f"{self.protocol}://{self._strip(path).lstrip('/')}"


def remote_options(protocol: str) -> tuple[int | None, dict]:
    """The retry bound and client options for a file system, from the environment.

    ``TFCKPT_REMOTE_RETRIES`` (default 2) is how often one request is tried again
    after a server error (5xx), throttling, a timeout or a dropped connection;
    ``TFCKPT_REMOTE_TIMEOUT`` (seconds, default 30) how long connecting and each
    read may wait. They reach S3 through botocore's standard retry mode; s3fs's own
    retry loop around it is set to one pass, so the two do not multiply. Other
    file systems keep their own settings.
    """
    if protocol not in ("s3", "s3a"):
        return None, {}
    try:
        retries = int(os.environ.get(RETRIES_ENV, DEFAULT_RETRIES))
        timeout = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT))
        if retries < 0 or not timeout > 0:
            raise ValueError
    except ValueError:
        raise CheckpointError(
            f"{RETRIES_ENV} must be a whole number >= 0 and {TIMEOUT_ENV} "
            "a positive number of seconds"
        ) from None
    return 1, {
        "config_kwargs": {
            "retries": {"total_max_attempts": retries + 1, "mode": "standard"},
            "connect_timeout": timeout,
            "read_timeout": timeout,
        }
    }


def _quiet_abandoned_requests(loop) -> None:
    """Keep a broken connection's leftovers off stderr: the call that made the request has
    failed already, with a :class:`CheckpointError` that says so."""
    if loop is None or getattr(loop, "_tfckpt_quiet", False):
        return

    def handler(loop, context):
        # Any client library's exception (botocore's and aiohttp's are not OSErrors), but
        # not a KeyboardInterrupt or SystemExit.
        if isinstance(context.get("exception"), Exception) and "never retrieved" in context.get(
            "message", ""
        ):
            return
        loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
    loop._tfckpt_quiet = True


def _blamed_options(storage_options: CheckedOptions | None, e: BaseException) -> str:
    """`` with {what} a, b``: the given options an error names, or all of them; '' if none
    (``what`` as they were given: see :class:`CheckedOptions`)."""
    if not storage_options:
        return ""
    names: list[str] = []

    def walk(options: Mapping, prefix: str) -> None:
        for key, value in options.items():
            names.append(prefix + key)
            if isinstance(value, Mapping):
                walk(value, prefix + key + ".")

    walk(storage_options, "")
    text = str(e)
    named = [n for n in names if re.search(rf"\b{re.escape(n.rsplit('.', 1)[-1])}\b", text)]
    return f" with {storage_options.given_as} {', '.join(named or names)}"


def _describe(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text and text[0] else type(e).__name__


class RemoteWriter:
    """A streaming upload of one object; errors become :class:`CheckpointWriteError`.

    :meth:`discard` drops what was written without storing it: closing an
    fsspec file stores whatever it holds, even when the writing failed part-way.
    """

    def __init__(self, store: RemoteStorage, path: str):
        self.path = path
        self._store = store
        self._file = store.call(
            "opening", path, store.fs.open, store._strip(path), "wb", error=CheckpointWriteError
        )

    def write(self, data) -> int:
        return self._store.call(
            "writing", self.path, self._file.write, data, error=CheckpointWriteError
        )

    def flush(self) -> None:
        self._store.call("writing", self.path, self._file.flush, error=CheckpointWriteError)

    def close(self) -> None:
        self._store.call("writing", self.path, self._file.close, error=CheckpointWriteError)

    def discard(self) -> None:
        try:
            if hasattr(self._file, "discard"):
                self._file.discard()
            self._file.closed = True
        except Exception:
            pass


class RemoteReader:
    """Range reads of one object: only the bytes asked for are fetched."""

    def __init__(self, store: RemoteStorage, path: str):
        self.path = path
        self._store = store
        self._key = store._strip(path)
        self.size = int(store.call("looking up", path, store.fs.size, self._key))

    def readinto(self, buf: memoryview, offset: int) -> int:
        n = min(len(buf), max(self.size - offset, 0))
        if n == 0:
            return 0
        data = self._store.call(
            f"reading bytes [{offset}, {offset + n})",
            self.path,
            self._store.fs.cat_file,
            self._key,
            start=offset,
            end=offset + n,
        )
        if len(data) != n:  # e.g. a server that ignores Range and sends the whole object
            raise CheckpointError(
                f"reading bytes [{offset}, {offset + n}) returned {len(data)} bytes instead of {n}",
                path=self.path,
            )
        buf[:n] = data
        return n

    def close(self) -> None:
        pass
