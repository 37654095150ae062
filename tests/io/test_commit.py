"""The one commit (``tfckpt.io.commit.Commit``) on its own: where new files go, the order in
which they appear, what a failure or an interrupt removes, whether the commit happened, and
what is removed after it — on the local file system and on an object store (memory://).
The writers over it are tested end to end in ``tests/faults`` and ``tests/interop``."""

from __future__ import annotations

import os
import uuid

import pytest

from tfckpt.errors import CheckpointWriteError
from tfckpt.io.commit import Commit
from tfckpt.io.storage import LOCAL, storage_for
from tfckpt.io.temporaries import TMP_MARK


def listing(d) -> dict[str, bytes]:
    return {f: (d / f).read_bytes() for f in sorted(os.listdir(d))}


def export_commit(d, **kw) -> Commit:
    """A sharded export's commit to ``d/model``: two data files, then the index."""
    c = Commit(LOCAL, str(d / "model.index.json"), what="an export", **kw)
    for k in (1, 2):
        where = c.new_file(str(d / f"model-{k}.bin"))
        assert TMP_MARK in where and os.path.dirname(where) == str(d)
        with open(where, "wb") as f:
            f.write(b"data %d" % k)
    c.write_last(b"new index")
    return c


def test_data_files_first_then_the_index(tmp_path):
    c = export_commit(tmp_path, overwrite=False)
    assert not c.committed() and all(TMP_MARK in f for f in os.listdir(tmp_path))
    c.publish()
    assert c.committed()
    assert listing(tmp_path) == {
        "model-1.bin": b"data 1",
        "model-2.bin": b"data 2",
        "model.index.json": b"new index",
    }
    c.discard()  # after the commit: nothing of it is removed
    assert len(os.listdir(tmp_path)) == 3


def test_an_output_committed_meanwhile_is_refused(tmp_path):
    c = export_commit(tmp_path, overwrite=False)
    (tmp_path / "model.index.json").write_bytes(b"another run's")
    with pytest.raises(CheckpointWriteError, match="another run wrote an export here meanwhile"):
        c.publish()
    assert not c.committed()
    c.discard()  # this run's files, those moved into place too; never the other run's
    assert listing(tmp_path) == {"model.index.json": b"another run's"}


def test_a_failed_commit_leaves_the_old_output(tmp_path, monkeypatch):
    (tmp_path / "model.index.json").write_bytes(b"old index")
    c = export_commit(tmp_path, overwrite=True)
    store = c.store

    def failing(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "replace", failing)
    with pytest.raises(OSError):
        c.publish(retire=str(tmp_path / "model.index.json"))
    assert not c.committed()
    c.discard()
    assert listing(tmp_path) == {"model.index.json": b"old index"}


def test_interrupted_after_its_commit_it_keeps_what_is_live(tmp_path, monkeypatch):
    c = export_commit(tmp_path, overwrite=True)
    store = c.store
    replace = store.replace

    def interrupted(src, dst):
        replace(src, dst)
        raise KeyboardInterrupt

    monkeypatch.setattr(store, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        c.publish()
    assert c.committed()
    c.discard()
    assert sorted(os.listdir(tmp_path)) == ["model-1.bin", "model-2.bin", "model.index.json"]


def test_the_replaced_index_is_retired_then_removed_with_its_files(tmp_path, monkeypatch):
    (tmp_path / "model.index.json").write_bytes(b"old index")
    (tmp_path / "old-1.bin").write_bytes(b"old data")
    (tmp_path / "old-2.bin").write_bytes(b"old data")
    c = export_commit(tmp_path, overwrite=True)
    c.publish(retire=str(tmp_path / "model.index.json"))
    assert c.retired is not None and open(c.retired, "rb").read() == b"old index"
    store = c.store
    remove, calls = store.remove, []

    def interrupted_once(path):
        calls.append(path)
        if len(calls) == 1:
            raise KeyboardInterrupt  # Ctrl-C at the first removal
        remove(path)

    monkeypatch.setattr(store, "remove", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        c.remove_replaced([str(tmp_path / "old-1.bin"), str(tmp_path / "old-2.bin")])
    # Tried again, the rest removed too, then the interrupt raised.
    assert sorted(os.listdir(tmp_path)) == ["model-1.bin", "model-2.bin", "model.index.json"]


def test_a_single_file_is_the_last_file(tmp_path):
    (tmp_path / "model.bin").write_bytes(b"old")
    c = Commit(LOCAL, str(tmp_path / "model.bin"), overwrite=True)
    with open(c.last_file(), "wb") as f:
        f.write(b"new")
    assert listing(tmp_path)["model.bin"] == b"old"
    c.publish()
    assert listing(tmp_path) == {"model.bin": b"new"}


def test_directories_made_are_removed_after_a_failure(tmp_path):
    out = tmp_path / "a" / "b"
    c = Commit(LOCAL, str(out / "model.bin"), overwrite=False)
    c.make_directory(str(out))
    with open(c.last_file(), "wb") as f:
        f.write(b"part")
    c.discard()
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- an object store


@pytest.fixture
def mem():
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    root = f"/commit-{uuid.uuid4().hex[:12]}"
    yield f"memory:/{root}"
    if fs.exists(root):
        fs.rm(root, recursive=True)


def objects(url: str) -> dict[str, bytes]:
    store = storage_for(url, None)
    return {n: store.read_bytes(f"{url}/{n}") for n in sorted(store.listdir(url))}


def remote_commit(url: str) -> Commit:
    store = storage_for(url, None)
    c = Commit(store, f"{url}/model.index.json", overwrite=True, what="an export")
    where = c.new_file(f"{url}/model-1.bin")
    assert where == f"{url}/model-1.bin"  # no rename: the final (free) name
    store.write_bytes(where, b"data")
    c.write_last(b"new index")
    assert objects(url).get("model.index.json") != b"new index"  # stored at publish, at once
    return c


def test_object_store_uploads_the_index_last(mem):
    c = remote_commit(mem)
    c.publish()
    assert c.committed()
    assert objects(mem) == {"model-1.bin": b"data", "model.index.json": b"new index"}


def test_object_store_failed_index_upload_removes_the_new_data(mem, monkeypatch):
    store = storage_for(mem, None)
    store.write_bytes(f"{mem}/model.index.json", b"old index")
    c = remote_commit(mem)

    def failing(path, data):
        raise CheckpointWriteError("writing failed", path=path)

    monkeypatch.setattr(c.store, "write_bytes", failing)
    with pytest.raises(CheckpointWriteError):
        c.publish()
    assert not c.committed()  # the index holds other bytes
    c.discard()
    assert objects(mem) == {"model.index.json": b"old index"}


def test_object_store_upload_that_landed_counts_as_the_commit(mem, monkeypatch):
    c = remote_commit(mem)
    write = c.store.write_bytes

    def landed_then_failed(path, data):
        write(path, data)
        raise KeyboardInterrupt

    monkeypatch.setattr(c.store, "write_bytes", landed_then_failed)
    with pytest.raises(KeyboardInterrupt):
        c.publish()
    assert c.committed()
    c.discard()  # the live index's data is kept
    assert objects(mem) == {"model-1.bin": b"data", "model.index.json": b"new index"}
