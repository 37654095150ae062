"""Faults during ``tfckpt edit --in-place``: a full disk (RLIMIT_FSIZE, as the directory
tests make one), an object store answering 5xx (the moto S3 server behind the fault proxy
of ``s3_helpers``) and SIGKILL at each step of an in-place edit on S3. Each time the old
checkpoint stays byte for byte, TensorFlow reads it, no file of the failed run is left
and the CLI says why on one line."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import cli_helpers as ch  # noqa: E402
from edit_helpers import tf_values, write_tf1  # noqa: E402
from s3_helpers import on, proxy, s3, s3_server  # noqa: E402,F401  (fixtures)

from tfckpt.inspection import directories  # noqa: E402
from tfckpt.rewrite.editing import MAX_VOCAB_BYTES  # noqa: E402

PREFIX = "model.ckpt-2"
EDIT = ("--set", "global_step=0", "--fill", "emb=ones")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return Path(write_tf1(tmp_path_factory.mktemp("pristine"))).parent


def _files(directory) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(directory).iterdir())}


def _edited(old: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return dict(old, global_step=np.int64(0), emb=np.ones_like(old["emb"]))


def _same_values(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype and np.array_equal(got[name], value), name


@pytest.mark.parametrize(
    "limit, shard_bytes",
    [
        (100, None),  # the first data file cannot be written
        (400, "120"),  # the data shards can, the new index (~600 bytes) cannot
    ],
)
def test_full_disk_during_in_place_edit_keeps_the_old_checkpoint(
    pristine, tmp_path, limit, shard_bytes
):
    """RLIMIT_FSIZE plays the full disk: no file above ``limit`` bytes can be written."""
    import resource

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    run = tmp_path / "run"
    shutil.copytree(pristine, run)
    before = _files(run)
    assert len(before[f"{PREFIX}.index"]) > limit  # the index cannot be written either
    old = tf_values(str(run / PREFIX))
    args = ["edit", run / PREFIX, "--in-place", *EDIT]
    if shard_bytes:
        args += ["--max-shard-bytes", shard_bytes]
    ch.assert_cli_error(ch.run_text(*args, preexec_fn=limited), "File too large")
    assert _files(run) == before  # byte for byte, and nothing beside it
    _same_values(tf_values(str(run / PREFIX)), old)
    # with room again the same edit goes through
    assert ch.run_text(*args).returncode == 0
    _same_values(tf_values(str(run / PREFIX)), _edited(old))


def _from_s3(s3, sub: str, where: Path) -> dict[str, bytes]:
    """The objects under ``sub`` copied to the local directory ``where``; their bytes."""
    files = s3.files(sub)
    where.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (where / name).write_bytes(data)
    return files


@pytest.mark.parametrize(
    "method, ending, status",
    [
        ("PUT", ".index", 500),  # the commit itself fails
        ("PUT", ".data-00000-of-00002", 503),  # a new data object cannot be stored
        ("PUT", ".data-00001-of-00002", 500),  # the second one, after the first was
        ("GET", ".data-00000-of-00001", 500),  # the source cannot be read
    ],
)
def test_s3_5xx_during_in_place_edit_keeps_the_old_checkpoint(
    s3, pristine, tmp_path, method, ending, status
):
    url = s3.put(str(pristine / PREFIX), "run")
    before = s3.files("run")
    old = tf_values(str(pristine / PREFIX))
    s3.proxy.rules.append(on(method, ending, status))
    args = ("edit", url, "--in-place", *EDIT, "--max-shard-bytes", "300")
    line = ch.assert_cli_error(ch.in_process(*args), ending.lstrip("."))
    assert url.rsplit("/", 1)[0] in line or PREFIX in line, line
    assert s3.proxy.requests(method, ending)[:1] == [status]  # the fault did happen
    s3.proxy.reset()
    assert s3.files("run") == before  # byte for byte, no object of the failed run
    _from_s3(s3, "run", tmp_path / "back")
    _same_values(tf_values(str(tmp_path / "back" / PREFIX)), old)
    assert ch.in_process(*args)[0] == 0  # the store answering again: it goes through
    after = _from_s3(s3, "run", tmp_path / "after")
    assert sorted(n for n in after if ".data-" in n) == [
        f"{PREFIX}.data-0000{i}-of-00002" for i in range(2)
    ]
    _same_values(tf_values(str(tmp_path / "after" / PREFIX)), _edited(old))


def test_s3_5xx_deleting_the_old_data_after_the_commit(s3, pristine, tmp_path):
    """The new index is in place when the old data object cannot be deleted: the edit is
    done (removing what it replaced is best effort), TensorFlow reads the new values,
    ``tfckpt ls`` shows the object left over as an orphan and ``prune`` removes it."""
    url = s3.put(str(pristine / PREFIX), "run")
    old = tf_values(str(pristine / PREFIX))
    s3.proxy.rules.append(on("DELETE", ".data-00000-of-00001", 500))
    args = ("edit", url, "--in-place", *EDIT, "--max-shard-bytes", "300")
    assert ch.in_process(*args)[0] == 0
    assert set(s3.proxy.requests("DELETE", ".data-00000-of-00001")) == {500}
    s3.proxy.reset()
    _from_s3(s3, "run", tmp_path / "back")
    _same_values(tf_values(str(tmp_path / "back" / PREFIX)), _edited(old))
    run = url.rsplit("/", 1)[0]
    stale = f"{PREFIX}.data-00000-of-00001"
    assert [o["path"].rsplit("/", 1)[1] for o in directories.ls(run)["orphans"]] == [stale]
    assert ch.in_process("prune", run, "--keep-last", "1", "--min-age", "0")[0] == 0
    assert stale not in s3.files("run")
    _from_s3(s3, "run", tmp_path / "pruned")
    _same_values(tf_values(str(tmp_path / "pruned" / PREFIX)), _edited(old))


# The command line on S3, SIGKILLed at the KILL_AT-th operation that changes the store
# (an object written, replaced or deleted).
KILL_AT_OPERATION = """
import os, signal, sys
from tfckpt.io import storage
calls = [0]
def killing(name):
    real = getattr(storage.RemoteStorage, name)
    def op(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == int(os.environ["KILL_AT"]):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, *args, **kwargs)
    setattr(storage.RemoteStorage, name, op)
for name in ("remove", "replace", "rename_noreplace", "write_new", "write_bytes",
             "open_writer"):
    killing(name)
from tfckpt.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def forker(tmp_path_factory):
    """The killed commands' processes, forked from one that imported tfckpt and the S3
    client's libraries once (not fsspec: it reads the endpoint from the environment when
    imported, which each command does itself)."""
    preload = ("tfckpt.cli", "tfckpt.io.storage", "botocore.session", "aiobotocore.session")
    with ch.Forker(*preload, tmp_dir=tmp_path_factory.mktemp("forked")) as forker:
        yield forker


def test_sigkill_during_in_place_edit_on_s3_leaves_old_or_new(s3, forker, pristine, tmp_path):
    """Killed before each change to the store: TensorFlow reads the old checkpoint (its
    objects byte for byte) until the new index is stored, the new one after; a new data
    object a kill leaves behind has a shard count of its own, which ``tfckpt ls`` shows
    as an orphan and ``prune`` removes."""
    old = tf_values(str(pristine / PREFIX))
    new = _edited(old)
    states, strays = [], 0
    for kill_at in range(1, 12):
        url = s3.put(str(pristine / PREFIX), f"run{kill_at}")
        before = s3.files(f"run{kill_at}")
        args = ["edit", url, "--in-place", *EDIT, "--max-shard-bytes", "300"]
        proc = forker.run(KILL_AT_OPERATION, *args, env=ch.user_env(KILL_AT=str(kill_at)))
        assert "Traceback" not in proc.stderr, proc.stderr
        back = tmp_path / f"back{kill_at}"
        now = _from_s3(s3, f"run{kill_at}", back)
        values = tf_values(str(back / PREFIX))
        state = "old" if values["global_step"] == 2 else "new"
        _same_values(values, old if state == "old" else new)
        if state == "old":
            assert {n: now[n] for n in before} == before, kill_at
            stray = sorted(set(now) - set(before))
            assert all(".data-" in n and n.endswith("-of-00002") for n in stray), stray
            if stray:
                strays += 1
                orphans = [
                    o["path"].rsplit("/", 1)[1]
                    for o in directories.ls(url.rsplit("/", 1)[0])["orphans"]
                ]
                assert sorted(orphans) == stray, (orphans, stray)
        states.append(state)
        if proc.returncode == 0:
            assert state == "new"
            assert sorted(n for n in now if ".data-" in n) == [
                f"{PREFIX}.data-0000{i}-of-00002" for i in range(2)
            ]
            break
        assert proc.returncode == -signal.SIGKILL, proc.stderr
    else:
        pytest.fail("the in-place edit never completed")
    assert states[0] == "old" and states[-1] == "new" and strays, (states, strays)


def _hostile(tmp_path: Path) -> dict[str, Path]:
    """Things that are no vocabulary or .npy file: a named pipe (no writer: reading it
    would wait forever), a device without end, a directory; and a regular file over the
    vocabulary's limit (sparse: no disk used)."""
    tmp_path.mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "adir").mkdir()
    with open(tmp_path / "huge.txt", "wb") as f:
        f.truncate(MAX_VOCAB_BYTES + 1)
    return {
        "fifo": tmp_path / "fifo",
        "zero": Path("/dev/zero"),
        "dir": tmp_path / "adir",
        "huge": tmp_path / "huge.txt",
    }


NOT_REGULAR = {
    "fifo": "not a regular file (a named pipe)",
    "zero": "not a regular file (a character device)",
    "dir": "not a regular file (a directory)",
    "huge": f"more than the limit of {MAX_VOCAB_BYTES}",
}
REMAP = ["--remap-rows", "^emb$", "--old-vocab"]
HOSTILE_EDITS = [  # <path>: the hostile input the case names; <ok>: a good vocabulary
    *((f"old vocab {k}", [*REMAP, "<path>", "--new-vocab", "<ok>"]) for k in NOT_REGULAR),
    *((f"new vocab {k}", [*REMAP, "<ok>", "--new-vocab", "<path>"]) for k in NOT_REGULAR),
    *((f"set {k}", ["--set", "dense/bias=@<path>"]) for k in ("fifo", "zero", "dir")),
    *((f"add {k}", ["--add", "new=@<path>"]) for k in ("fifo", "zero", "dir")),
    ("resize 10**12", ["--resize", "^emb$=1000000000000"]),
]


@pytest.mark.parametrize("case, args", HOSTILE_EDITS, ids=[c for c, _ in HOSTILE_EDITS])
def test_hostile_edit_inputs_are_one_line_and_leave_nothing(pristine, tmp_path, case, args):
    """Each its own process, bounded by a timeout generous for a loaded machine (a hang is
    what is tested): one line, exit status 2, the source byte for byte, nothing written."""
    paths = _hostile(tmp_path / "in")
    (tmp_path / "in" / "ok.txt").write_text("a\nb\nc\nd\ne\nf\n")
    paths["ok"] = tmp_path / "in" / "ok.txt"
    run = tmp_path / "run"
    shutil.copytree(pristine, run)
    before = _files(run)
    inputs = {
        p.name: p.stat().st_size if p.is_file() else None for p in (tmp_path / "in").iterdir()
    }
    key = case.rsplit(" ", 1)[-1]
    hostile = str(paths.get(key, ""))
    args = [a.replace("<path>", hostile).replace("<ok>", str(paths["ok"])) for a in args]
    result = ch.run_text("edit", run / PREFIX, tmp_path / "out" / "m", *args, timeout=60)
    want = NOT_REGULAR.get(key, "more than the 268435456 an edit takes")
    line = ch.assert_cli_error(result, want)
    assert str(paths[key]) in line if key in paths else "--resize" in line
    assert _files(run) == before
    assert not (tmp_path / "out").exists()
    after = {p.name: p.stat().st_size if p.is_file() else None for p in (tmp_path / "in").iterdir()}
    assert after == inputs
