"""The npz writer's bytes are zipfile's: the same members written through
:class:`zipfile.ZipFile` (as ``numpy.savez`` writes them, stored, at 1980-01-01) give the
same file, on a seekable file and on one that is not (data descriptors), with ZIP64
local headers, with the ZIP64 end records of more than 65 535 members and with offsets
past 2 GiB (a sparse file); and numpy loads what it writes."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from tfckpt.format import tensorfiles
from tfckpt.format.tensorfiles import Entry, NpzWriter


class _Unseekable:
    """A file that can only be written to (as an upload is)."""

    def __init__(self):
        self.buf = io.BytesIO()
        self.writes: list[bytes] = []

    def write(self, data) -> int:
        self.writes.append(bytes(data))
        return self.buf.write(data)

    def flush(self) -> None:
        pass


def _members(n: int = 6):
    rng = np.random.default_rng(0)
    values = {
        "a/kernel": rng.standard_normal((3, 4)).astype(np.float32),
        "a/bias": np.arange(4, dtype=np.float16),
        "émbeddings": rng.integers(-5, 5, (7,), dtype=np.int64),  # a UTF-8 name
        "flag": np.array(True),
        "big": rng.standard_normal(800_000).astype(np.float32),  # streamed: over 1 MiB
        "empty": np.zeros((0, 3), np.float64),
    }
    for i in range(n - len(values)):
        values[f"x{i}"] = np.full((2,), i, np.int32)
    return values


def _entries(values):
    return [Entry(k, str(v.dtype), v.shape) for k, v in values.items()]


def _with_zipfile(f, values, force_zip64=False, pieces=1):
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, v in values.items():
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            with zf.open(info, "w", force_zip64=force_zip64) as m:
                m.write(tensorfiles._npy_header_of(str(v.dtype), v.shape))
                m.write(v.tobytes())


def _with_writer(f, values, pieces=1, whole=False):
    w = NpzWriter(f, _entries(values))
    if whole:  # several whole tensors a call, as the engine's batches come
        names = list(values)
        for i in range(0, len(names), 3):
            w.write_whole(names[i : i + 3], [values[k] for k in names[i : i + 3]])
        w.close()
        return
    for name, v in values.items():
        w.begin(name)
        for part in np.array_split(v.reshape(-1), pieces) if v.size else [v.reshape(-1)]:
            w.write(part)
        w.end()
    w.close()


@pytest.mark.parametrize("pieces", [1, 3, 400])
def test_same_bytes_as_zipfile(tmp_path, pieces):
    values = _members()
    with open(tmp_path / "z.npz", "wb") as f:
        _with_zipfile(f, values)
    with open(tmp_path / "w.npz", "wb", buffering=1 << 20) as f:
        _with_writer(f, values, pieces)
    assert (tmp_path / "w.npz").read_bytes() == (tmp_path / "z.npz").read_bytes()
    with np.load(tmp_path / "w.npz", allow_pickle=False) as z:
        assert sorted(z.files) == sorted(values)
        for k, v in values.items():
            assert z[k].dtype == v.dtype and z[k].shape == v.shape
            np.testing.assert_array_equal(z[k], v)


def test_whole_tensors_written_together_give_the_same_bytes(tmp_path):
    values = _members(12)
    with open(tmp_path / "z.npz", "wb") as f:
        _with_zipfile(f, values)
    for make in (io.BytesIO, _Unseekable):
        ours = make()
        _with_writer(ours, values, whole=True)
        got = ours.getvalue() if make is io.BytesIO else ours.buf.getvalue()
        if make is io.BytesIO:
            assert got == (tmp_path / "z.npz").read_bytes()
        with np.load(io.BytesIO(got), allow_pickle=False) as z:
            np.testing.assert_array_equal(z["big"], values["big"])
    w = NpzWriter(io.BytesIO(), _entries(values))
    with pytest.raises(ValueError, match="expected"):
        w.write_whole(["a/bias"], [values["a/bias"]])
    with pytest.raises(ValueError, match="more bytes"):
        w.write_whole(["a/kernel"], [np.zeros(13, np.float32)])


def test_same_bytes_on_a_file_that_cannot_seek():
    values = _members()
    theirs, ours = _Unseekable(), _Unseekable()
    _with_zipfile(theirs, values)
    _with_writer(ours, values, pieces=2)
    assert ours.buf.getvalue() == theirs.buf.getvalue()
    with np.load(io.BytesIO(ours.buf.getvalue())) as z:
        np.testing.assert_array_equal(z["big"], values["big"])


@pytest.mark.parametrize("whole", [False, True])
def test_same_bytes_with_zip64_local_headers(tmp_path, monkeypatch, whole):
    values = _members()
    monkeypatch.setattr(tensorfiles, "_ZIP64_LIMIT", 0)  # every member in ZIP64 form
    for make in (io.BytesIO, _Unseekable):
        theirs, ours = make(), make()
        _with_zipfile(theirs, values, force_zip64=True)
        _with_writer(ours, values, whole=whole)
        got = ours.getvalue() if make is io.BytesIO else ours.buf.getvalue()
        want = theirs.getvalue() if make is io.BytesIO else theirs.buf.getvalue()
        assert got == want, make


def test_same_bytes_with_more_members_than_plain_zip_counts():
    values = {f"v{i}": np.array([i % 256], np.uint8) for i in range(70_000)}
    theirs, ours = io.BytesIO(), io.BytesIO()
    _with_zipfile(theirs, values)
    _with_writer(ours, values)
    assert ours.getvalue() == theirs.getvalue()
    with np.load(io.BytesIO(ours.getvalue())) as z:
        assert len(z.files) == 70_000 and z["v69999"][0] == 69999 % 256


def test_same_bytes_with_offsets_past_2_gib(tmp_path):
    """Members that start past 2 GiB get the offsets' ZIP64 fields (a sparse file: the
    archive starts at 3 GiB)."""
    values = _members()
    start = 3 << 30
    for name, write in (("z", _with_zipfile), ("w", _with_writer)):
        with open(tmp_path / name, "wb") as f:
            f.seek(start)
            write(f, values)
    with open(tmp_path / "z", "rb") as z, open(tmp_path / "w", "rb") as w:
        z.seek(start)
        w.seek(start)
        assert w.read() == z.read()


class _Recording(io.BytesIO):
    """A seekable file that remembers its largest write."""

    largest = 0

    def write(self, data) -> int:
        self.largest = max(self.largest, memoryview(data).nbytes)
        return super().write(data)


@pytest.mark.parametrize("seekable", [True, False])
def test_a_big_member_in_small_pieces_is_not_held_whole(seekable):
    """Small pieces of a 3 MiB member are handed on about every MiB, not gathered whole."""
    values = _members()
    f = _Recording() if seekable else _Unseekable()
    _with_writer(f, values, pieces=400)  # pieces of 8 KB
    largest = f.largest if seekable else max(len(w) for w in f.writes)
    assert values["big"].nbytes > 3_000_000 and largest < 2 << 20
