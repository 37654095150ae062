"""The members of a tar or zip archive: names, kinds, where their bytes are, links.

:func:`index_archive` reads an archive once (a tar's headers, in order; a zip's central
directory) and returns an :class:`Index` that answers what a file system would (is it
a file, a directory, what does a directory hold, where are a file's bytes) for
:class:`~tfckpt.io.archives.ArchiveStorage`. Nothing is extracted and no member name
ever reaches the local file system.

Names come from the archive's contents, so they are checked before anything is kept;
an archive with any of these is refused whole, naming the member (tar and unzip warn
and skip or rewrite them, which hides what the archive really holds):

- a name that is absolute (``/etc/x``, ``C:\\x``), climbs (``a/../../x``), holds a NUL,
  or (in a zip) uses backslashes, which are Windows separators there;
- two members of the same name (``./a`` and ``a`` are the same), or a file where
  another member needs a directory;
- a symbolic or hard link whose target is absolute or climbs out of the archive
  (links inside it are followed, at most :data:`MAX_HOPS` deep);
- more than :data:`MAX_MEMBERS` members, a name longer than :data:`MAX_NAME`
  characters or names adding up to more than :data:`MAX_NAME_BYTES`, a tar header
  extension (long name, pax record) over :data:`MAX_HEADER_READ`, a zip central
  directory over :data:`MAX_DIRECTORY`: what an index may hold is bounded, whatever
  the archive declares.

Sizes declared in headers are checked against the archive before they are used: a
plain tar or stored zip member must lie inside the file; a deflated zip member may not
declare more than deflate can expand its compressed bytes to.
"""

from __future__ import annotations

import io
import posixpath
import re
import stat
from collections.abc import Callable

from tfckpt.errors import CheckpointError, CorruptCheckpointError, UnsupportedCheckpointError
from tfckpt.io.compressed import BZIP2, DEFLATE, GZIP, XZ, Cursor, Stream
from tfckpt.io.storage import Reader

FILE, DIR, SYMLINK, HARDLINK, OTHER = "file", "directory", "symlink", "hardlink", "other"
MAX_MEMBERS = 100_000
MAX_NAME = 4096
MAX_NAME_BYTES = 16 << 20
MAX_HEADER_READ = 1 << 20
MAX_HEADER_BYTES = 128 << 20
MAX_DIRECTORY = 8 << 20
MAX_HOPS = 40
# Kept in memory as a compressed tar is indexed: small members whole (a state file, most
# indexes), up to SMALL_TOTAL in all, and the last TAIL bytes of every other file (where
# a V1 table's magic number is), so that looking at them costs no second pass.
SMALL = 1 << 20
SMALL_TOTAL = 16 << 20
TAIL = 64
_TAR_HEADER = "a tar header (or its long name or pax records)"
DEFLATE_MAX_RATIO = 1032  # deflate's most: 258 bytes from 2 bits
_ROOTED = re.compile(r"^(?:[/\\]|[A-Za-z]:)")
ZIP_STORED, ZIP_DEFLATED, ZIP_BZIP2 = 0, 8, 12
_ZIP_METHODS = {ZIP_STORED: None, ZIP_DEFLATED: DEFLATE, ZIP_BZIP2: BZIP2}
_KINDS = {GZIP: "tar.gz", BZIP2: "tar.bz2", XZ: "tar.xz", None: "tar"}


class Member:
    """One entry: its kind, and where its bytes are (``offset`` in the archive for a plain
    tar, in the decompressed stream for a compressed one, of the local header for a zip)."""

    __slots__ = ("kind", "offset", "size", "target", "zip")

    def __init__(self, kind: str, offset: int = 0, size: int = 0, target: str | None = None):
        self.kind = kind
        self.offset = offset
        self.size = size
        self.target = target  # a link's target, as a member name
        self.zip: tuple | None = None  # (method, compressed size, crc, encrypted)


class Index:
    """What an archive holds, by member name (``a/b``; ``""`` is its root)."""

    def __init__(self, path: str, kind: str, size: int, codec: str | None = None):
        self.path = path
        self.kind = kind  # "tar", "tar.gz", "tar.bz2", "tar.xz" or "zip"
        self.size = size  # of the archive file
        self.codec = codec  # a compressed tar's
        self.members: dict[str, Member] = {}
        self.children: dict[str, dict[str, None]] = {"": {}}
        self.stream: Stream | None = None  # a compressed tar's decompressed bytes
        self.cached: dict[str, bytes] = {}
        self.tails: dict[str, bytes] = {}
        self._name_bytes = 0

    def hostile(self, member: str, why: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(
            f"member {member!r} {why}; refusing the archive (nothing was extracted)",
            path=self.path,
        )

    def name(self, raw: str, *, backslashes: bool = False) -> str:
        """``raw`` as a member name, or refused (see the module's list)."""
        if len(raw) > MAX_NAME:
            raise self.hostile(raw[:60] + "...", f"has a name of {len(raw)} characters")
        if "\x00" in raw:
            raise self.hostile(raw, "has a NUL in its name")
        if backslashes and "\\" in raw:
            raise self.hostile(raw, "names a Windows path (backslashes)")
        if _ROOTED.match(raw):
            raise self.hostile(raw, "has an absolute name")
        parts = [p for p in raw.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise self.hostile(raw, "climbs out of the archive (..)")
        return "/".join(parts)

    def add(self, raw: str, member: Member, *, backslashes: bool = False) -> str:
        name = self.name(raw, backslashes=backslashes)
        if len(self.members) >= MAX_MEMBERS:
            raise CorruptCheckpointError(
                f"more than {MAX_MEMBERS} members; tfckpt indexes at most that many",
                path=self.path,
            )
        self._name_bytes += len(name)
        if self._name_bytes > MAX_NAME_BYTES:
            raise CorruptCheckpointError(
                f"member names add up to more than {MAX_NAME_BYTES} characters", path=self.path
            )
        if not name:
            if member.kind != DIR:
                raise self.hostile(raw, "has an empty name")
            return name
        old = self.members.get(name)
        if old is not None:
            if old.kind == DIR and member.kind == DIR:
                return name
            raise self.hostile(raw, "appears twice (two members of one name)")
        if name in self.children and member.kind != DIR:
            raise self.hostile(raw, "is not a directory, but other members lie under it")
        parent, _, base = name.rpartition("/")
        self._directory(parent, raw)
        self.children[parent][base] = None
        self.members[name] = member
        if member.kind == DIR:
            self.children.setdefault(name, {})
        return name

    def _directory(self, name: str, raw: str) -> None:
        """Make ``name`` and the directories above it directories."""
        missing = []
        while name not in self.children:
            old = self.members.get(name)
            if old is not None and old.kind != DIR:
                raise self.hostile(raw, f"lies under {name!r}, which is not a directory")
            missing.append(name)
            name = name.rpartition("/")[0]
        for d in reversed(missing):
            parent, _, base = d.rpartition("/")
            self.children[d] = {}
            self.children[parent][base] = None

    def link(self, name: str, raw_target: str, hard: bool) -> str:
        """A link's target as a member name; refused when it leads out of the archive.

        A hard link names another member; a symbolic one a path from its own directory.
        """
        if _ROOTED.match(raw_target) or "\x00" in raw_target:
            raise self.hostile(name, f"is a link to {raw_target!r}, outside the archive")
        joined = raw_target if hard else posixpath.join(posixpath.dirname(name), raw_target)
        target = posixpath.normpath(joined) if joined else "."
        if target == ".." or target.startswith("../"):
            raise self.hostile(name, f"is a link to {raw_target!r}, outside the archive")
        return "" if target == "." else target

    # -- lookups

    def resolve(self, name: str) -> str | None:
        """``name`` with every link on its way followed: the member or directory it is,
        or None when there is none (or the links loop)."""
        parts = name.split("/") if name else []
        done = ""
        hops = 0
        while parts:
            cur = f"{done}/{parts[0]}" if done else parts[0]
            parts = parts[1:]
            m = self.members.get(cur)
            if m is not None and m.kind in (SYMLINK, HARDLINK):
                hops += 1
                if hops > MAX_HOPS or m.target is None:
                    return None
                parts = (m.target.split("/") if m.target else []) + parts
                done = ""
                continue
            if m is None and cur not in self.children:
                return None
            done = cur
        return done

    def exists(self, name: str) -> bool:
        """Whether ``name`` is an entry itself (a link that leads nowhere is)."""
        parent = self.resolve(posixpath.dirname(name)) if "/" in name else ""
        if parent is None:
            return False
        full = f"{parent}/{posixpath.basename(name)}" if parent else name
        return not name or full in self.members or full in self.children

    def file(self, name: str) -> Member | None:
        found = self.resolve(name)
        m = self.members.get(found) if found else None
        return m if m is not None and m.kind == FILE else None

    def directories(self) -> list[str]:
        return sorted(self.children)


# ---------------------------------------------------------------- reading headers


class _HeaderReads(io.RawIOBase):
    """The file ``tarfile`` or ``zipfile`` reads headers through: reads of at most
    ``most`` bytes each and ``total`` in all (a header's declared size is never
    allocated unchecked); seeking only moves the position."""

    def __init__(
        self, read_at: Callable[[int, int], bytes], size: int | None, path: str, what: str
    ):
        self._read_at = read_at
        self._what = what
        self._size = size
        self._path = path
        self.pos = 0
        self.total = 0
        self.most = MAX_HEADER_READ

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_END:
            if self._size is None:
                raise io.UnsupportedOperation("no size")
            offset += self._size
        elif whence == io.SEEK_CUR:
            offset += self.pos
        self.pos = max(0, offset)
        return self.pos

    def read(self, n: int | None = -1) -> bytes:
        if n is None or n < 0:
            n = (self._size or 0) - self.pos
        if n > self.most:
            raise CorruptCheckpointError(
                f"{self._what} of {n} bytes at byte {self.pos}: tfckpt reads at most "
                f"{self.most >> 20} MiB of it",
                path=self._path,
            )
        self.total += n
        if self.total > MAX_HEADER_BYTES:
            raise CorruptCheckpointError(
                f"headers add up to more than {MAX_HEADER_BYTES} bytes", path=self._path
            )
        data = self._read_at(self.pos, n)
        self.pos += len(data)
        return data

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def _pread(reader: Reader) -> Callable[[int, int], bytes]:
    def read_at(offset: int, n: int) -> bytes:
        n = max(0, min(n, reader.size - offset))
        buf = bytearray(n)
        got = 0
        while got < n:
            k = reader.readinto(memoryview(buf)[got:], offset + got)
            if k == 0:
                break
            got += k
        return bytes(buf[:got])

    return read_at


def _cursor_read(cursor: Cursor) -> Callable[[int, int], bytes]:
    def read_at(offset: int, n: int) -> bytes:
        buf = bytearray(n)
        k = cursor.readinto(memoryview(buf), offset)
        return bytes(buf[:k])

    return read_at


# ---------------------------------------------------------------- tar


def index_tar(open_file: Callable[[], Reader], path: str, size: int, codec: str | None) -> Index:
    """The members of a tar archive, plain (``codec`` None) or compressed: one pass over
    it (for a compressed one, decompressing it all once; small members and the tails of
    the others are kept as they pass, see :data:`SMALL`)."""
    import tarfile

    index = Index(path, _KINDS[codec], size, codec)
    reader = open_file()
    cursor = None
    try:
        if codec is None:
            headers = _HeaderReads(_pread(reader), size, path, _TAR_HEADER)
        else:
            index.stream = Stream(open_file, 0, size, codec, path)
            cursor = index.stream.cursor()
            headers = _HeaderReads(_cursor_read(cursor), None, path, _TAR_HEADER)
        try:
            tar = tarfile.TarFile(fileobj=headers, mode="r")
            while True:
                info = tar.next()
                if info is None:
                    break
                # tarfile keeps every header it read; the index is enough.
                tar.members.clear()  # type: ignore[attr-defined]
                _add_tar_member(index, info, cursor)
            if cursor is not None:
                cursor.drain()  # the end marker and checksum of the whole stream
        except tarfile.TarError as e:
            raise CorruptCheckpointError(f"not a readable tar archive: {e}", path=path) from None
        except RecursionError:
            raise CorruptCheckpointError("tar headers nest too deep", path=path) from None
    finally:
        reader.close()
        if cursor is not None:
            cursor.close()
    _check_links(index)
    return index


def _add_tar_member(index: Index, info, cursor: Cursor | None) -> None:
    if info.isreg() and not info.issparse():
        member = Member(FILE, info.offset_data, info.size)
    elif info.isdir():
        member = Member(DIR)
    elif info.issym() or info.islnk():
        member = Member(SYMLINK if info.issym() else HARDLINK, target=info.linkname)
    else:
        member = Member(OTHER)  # devices, pipes, sparse files: never read
    name = index.add(info.name, member)
    if member.kind != FILE:
        return
    end = member.offset + member.size
    if cursor is None:
        if end > index.size:
            raise index.hostile(
                info.name, f"declares {member.size} bytes, past the archive's end ({index.size})"
            )
        return
    # A compressed tar: the bytes are passing anyway.
    total = sum(len(b) for b in index.cached.values())
    if member.size <= SMALL and total + member.size <= SMALL_TOTAL:
        data = _read_exactly(cursor, member.offset, member.size, index, info.name)
        index.cached[name] = data
    elif member.size:
        at = max(member.offset, end - TAIL)
        index.tails[name] = _read_exactly(cursor, at, end - at, index, info.name)


def _read_exactly(cursor: Cursor, offset: int, n: int, index: Index, raw: str) -> bytes:
    buf = bytearray(n)
    if cursor.readinto(memoryview(buf), offset) != n:
        raise index.hostile(raw, f"declares {n} bytes at {offset}, past the archive's end")
    return bytes(buf)


def _check_links(index: Index) -> None:
    for name, m in index.members.items():
        if m.kind in (SYMLINK, HARDLINK):
            raw = m.target or ""
            m.target = index.link(name, raw, m.kind == HARDLINK)


# ---------------------------------------------------------------- zip


def index_zip(open_file: Callable[[], Reader], path: str, size: int) -> Index:
    """The members of a zip archive, from its central directory (at most
    :data:`MAX_DIRECTORY` bytes of it)."""
    import zipfile

    index = Index(path, "zip", size)
    reader = open_file()
    try:
        headers = _HeaderReads(_pread(reader), size, path, "a zip central directory")
        headers.most = MAX_DIRECTORY
        try:
            # Unbuffered: a buffered reader would allocate a declared size before reading.
            with zipfile.ZipFile(headers) as zf:
                infos = zf.infolist()
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError) as e:
            raise CorruptCheckpointError(f"not a readable zip archive: {e}", path=path) from None
        for info in infos:
            _add_zip_member(index, info)
        links = {n: m for n, m in index.members.items() if m.kind == SYMLINK}
        for name, m in links.items():
            m.target = _read_link(index, open_file, name, m)
    finally:
        reader.close()
    _check_links(index)
    return index


def _add_zip_member(index: Index, info) -> None:
    mode = info.external_attr >> 16
    if info.is_dir():
        index.add(info.filename, Member(DIR), backslashes=True)
        return
    kind = SYMLINK if info.create_system == 3 and stat.S_ISLNK(mode) else FILE
    member = Member(kind, info.header_offset, info.file_size)
    member.zip = (info.compress_type, info.compress_size, info.CRC, bool(info.flag_bits & 1))
    index.add(info.filename, member, backslashes=True)
    if info.header_offset + info.compress_size > index.size:
        raise index.hostile(info.filename, "lies past the archive's end")
    if info.compress_type == ZIP_STORED and info.compress_size != info.file_size:
        raise index.hostile(
            info.filename, f"is stored ({info.compress_size} bytes) but declares {info.file_size}"
        )
    if (
        info.compress_type == ZIP_DEFLATED
        and info.file_size > info.compress_size * DEFLATE_MAX_RATIO + 1024
    ):
        raise index.hostile(
            info.filename,
            f"declares {info.file_size} bytes from {info.compress_size} deflated: "
            "more than deflate can expand to",
        )


def zip_data(index: Index, open_file: Callable[[], Reader], name: str, m: Member):
    """Where a zip member's bytes are: (offset of its data, compressed size, codec or None
    for stored, crc); refused for encryption and methods tfckpt does not read."""
    assert m.zip is not None
    method, csize, crc, encrypted = m.zip
    if encrypted:
        raise UnsupportedCheckpointError(
            "the member is encrypted; decrypt the archive first", path=f"{index.path}#{name}"
        )
    if method not in _ZIP_METHODS:
        raise UnsupportedCheckpointError(
            f"the member is compressed with zip method {method}; tfckpt reads stored, "
            "deflated and bzip2 members: extract it with unzip",
            path=f"{index.path}#{name}",
        )
    reader = open_file()
    try:
        head = _pread(reader)(m.offset, 30)
    finally:
        reader.close()
    if len(head) < 30 or head[:4] != b"PK\x03\x04":
        raise index.hostile(name, "has no local header where the directory says")
    start = m.offset + 30 + int.from_bytes(head[26:28], "little")
    start += int.from_bytes(head[28:30], "little")
    if start + csize > index.size:
        raise index.hostile(name, "lies past the archive's end")
    return start, csize, _ZIP_METHODS[method], crc


def _read_link(index: Index, open_file: Callable[[], Reader], name: str, m: Member) -> str:
    if m.size > MAX_NAME:
        raise index.hostile(name, f"is a link of {m.size} bytes")
    start, csize, codec, crc = zip_data(index, open_file, name, m)
    if codec is None:
        reader = open_file()
        try:
            data = _pread(reader)(start, m.size)
        finally:
            reader.close()
    else:
        stream = Stream(open_file, start, start + csize, codec, index.path, size=m.size, crc=crc)
        cursor = stream.cursor()
        try:
            data = cursor.read(m.size)
        finally:
            cursor.close()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise index.hostile(name, "is a link whose target is not text") from None


# ---------------------------------------------------------------- which kind


def sniff(head: bytes) -> str | None:
    """What an archive's first bytes (512 or fewer) say it is: "zip", "tar" or a
    compressed tar's codec (gzip, bzip2, xz); None for none of these."""
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    if head[:2] == b"\x1f\x8b":
        return GZIP
    if head[:3] == b"BZh":
        return BZIP2
    if head[:6] == b"\xfd7zXZ\x00":
        return XZ
    if head[257:262] == b"ustar":
        return "tar"
    return None


def index_archive(open_file: Callable[[], Reader], path: str) -> Index:
    """The index of the archive at ``path`` (opened with ``open_file``), of the kind its
    content says."""
    reader = open_file()
    try:
        size = reader.size
        head = _pread(reader)(0, 512)
    finally:
        reader.close()
    kind = sniff(head)
    if kind == "zip":
        return index_zip(open_file, path, size)
    if kind in (GZIP, BZIP2, XZ):
        return index_tar(open_file, path, size, kind)
    if kind == "tar" or (len(head) == 512 and _tar_checksum_ok(head)):
        return index_tar(open_file, path, size, None)
    raise CheckpointError(
        "not a tar or zip archive (tfckpt opens .tar, .tar.gz, .tar.bz2, .tar.xz and .zip)",
        path=path,
    )


def _tar_checksum_ok(head: bytes) -> bool:
    """A pre-POSIX tar header (no ``ustar`` magic) whose checksum field is right."""
    try:
        stored = int(head[148:156].split(b"\x00")[0].strip() or b"-1", 8)
    except ValueError:
        return False
    return stored == sum(head[:148]) + 256 + sum(head[156:])
