"""A directory of checkpoints: ``ls``, ``prune``, ``cp`` and ``mv`` on runs TensorFlow wrote
(a TF2 ``CheckpointManager``, a TF1 ``Saver`` with ``max_to_keep``), checked by TensorFlow
itself: ``tf.train.latest_checkpoint`` and a new ``CheckpointManager`` agree with the state
file, every checkpoint kept or copied restores with its values; SIGKILL during ``prune``
and ``mv``, a copy that does not verify and S3 5xx answers lose nothing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import cli_helpers as ch  # noqa: E402
from s3_helpers import on, proxy, s3, s3_server  # noqa: E402,F401  (fixtures)
from saver_runs import saver_run, v1_sharded  # noqa: E402,F401  (v1_sharded: a fixture)

import tfckpt  # noqa: E402
from tfckpt.inspection import directories  # noqa: E402
from tfckpt.io import paths  # noqa: E402
from tfckpt.io.storage import LOCAL  # noqa: E402

TF2_STEPS = 6


def _tf2_value(step: int) -> np.ndarray:
    return np.arange(4, dtype=np.float32) * 10 + step


@pytest.fixture(scope="module")
def tf2_run(tmp_path_factory):
    """A TF2 CheckpointManager run keeping every checkpoint: ckpt-1 ... ckpt-6."""
    root = tmp_path_factory.mktemp("tf2") / "run"
    v = tf.Variable(np.zeros(4, np.float32))
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=v), str(root), max_to_keep=None)
    for step in range(1, TF2_STEPS + 1):
        v.assign(_tf2_value(step))
        manager.save(checkpoint_number=step)
    return root


@pytest.fixture(scope="module")
def tf2_other(tmp_path_factory):
    """Another run of the same checkpoint names, other values (``_tf2_value(step) + 100``)."""
    root = tmp_path_factory.mktemp("tf2_other") / "run"
    v = tf.Variable(np.zeros(4, np.float32))
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=v), str(root), max_to_keep=None)
    for step in range(1, TF2_STEPS + 1):
        v.assign(_tf2_value(step) + 100)
        manager.save(checkpoint_number=step)
    return root


@pytest.fixture(scope="module")
def tf1_run(tmp_path_factory):
    """A TF1 Saver(max_to_keep=4) saving at steps 100 ... 700 (absolute paths in its
    state file, a .meta beside each checkpoint): model.ckpt-400 ... -700 are left."""
    root = tmp_path_factory.mktemp("tf1") / "run"
    root.mkdir()
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        w = v1.get_variable("w", initializer=np.zeros(3, np.float32))
        step = v1.placeholder(tf.float32, [])
        assign = w.assign(tf.fill([3], step))
        saver = v1.train.Saver(max_to_keep=4)
        with v1.Session() as sess:
            for s in range(100, 800, 100):
                sess.run(assign, {step: float(s)})
                saver.save(sess, str(root / "model.ckpt"), global_step=s)
    return root


def _copy(run, tmp_path, name="run"):
    dst = tmp_path / name
    shutil.copytree(run, dst)
    if (dst / "checkpoint").read_text().count(str(run)):  # a Saver's absolute paths
        text = (dst / "checkpoint").read_text().replace(str(run), str(dst))
        (dst / "checkpoint").write_text(text)
    return dst


def _files(directory) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def _restores_tf2(prefix: str, step: int) -> None:
    v = tf.Variable(np.zeros(4, np.float32))
    tf.train.Checkpoint(v=v).restore(prefix).assert_consumed()
    np.testing.assert_array_equal(v.numpy(), _tf2_value(step))


def _restores_tf1(prefix: str, step: int) -> None:
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        w = v1.get_variable("w", shape=[3], dtype=tf.float32)
        with v1.Session() as sess:
            v1.train.Saver().restore(sess, prefix)
            np.testing.assert_array_equal(sess.run(w), np.full(3, step, np.float32))


def _manager(directory, max_to_keep):
    v = tf.Variable(np.zeros(4, np.float32))
    return tf.train.CheckpointManager(
        tf.train.Checkpoint(v=v), str(directory), max_to_keep=max_to_keep
    ), v


def _state_names(directory) -> tuple[str, list[str]]:
    state = paths.read_state_file(LOCAL, str(directory))
    assert state is not None
    return state.model_checkpoint_path, list(state.all_model_checkpoint_paths)


def _aged(*files) -> None:
    """Files an hour old: leftovers of a save long over, which prune removes (younger
    ones may be a save in progress)."""
    import time

    for f in files:
        os.utime(f, (time.time() - 3600,) * 2)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ---------------------------------------------------------------- ls


def test_ls_lists_checkpoints_leftovers_and_missing_entries(tf2_run, tmp_path):
    run = _copy(tf2_run, tmp_path)
    (run / "ckpt-9.data-00000-of-00001").write_bytes(b"x" * 7)
    for part in ("index", "data-00000-of-00001"):  # TensorFlow's parts on S3
        shutil.copy(run / f"ckpt-2.{part}", run / f"ckpt-8.part-00000-of-00001.{part}")
    (run / "ckpt-7.index.tempstate15713094282437616473").write_bytes(b"")
    (run / "checkpoint.tmp0123456789abcdef0123456789abcdef").write_bytes(b"")
    (run / "ckpt-8_temp").mkdir()
    (run / "ckpt-8_temp" / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"y")
    stale = f"ckpt-3.index.tfckpt-tmp-{_dead_pid()}-0a1b2c3d"
    (run / stale).write_bytes(b"")
    live = f"ckpt-3.index.tfckpt-tmp-{os.getpid()}-0a1b2c3d"
    (run / live).write_bytes(b"")
    state = (run / "checkpoint").read_text()
    (run / "checkpoint").write_text(state.replace('"ckpt-1"', '"ckpt-99"', 1))

    data = directories.ls(str(run))
    rows = data["checkpoints"]
    assert [r["step"] for r in rows] == list(range(1, TF2_STEPS + 1))
    for r in rows:
        index = run / f"{r['name']}.index"
        shard = run / f"{r['name']}.data-00000-of-00001"
        assert r["bytes"] == index.stat().st_size + shard.stat().st_size
        assert r["shards"] == 1 and r["format"] == "V2"
        assert r["mtime"] == pytest.approx(max(index.stat().st_mtime, shard.stat().st_mtime))
    # ckpt-1's entry was replaced by one naming a missing checkpoint
    assert [r["in_state_file"] for r in rows] == [False] + [True] * (TF2_STEPS - 1)
    assert [r["latest"] for r in rows] == [False] * (TF2_STEPS - 1) + [True]
    assert data["latest"] == f"ckpt-{TF2_STEPS}" and data["missing"] == ["ckpt-99"]
    kinds = {os.path.basename(o["path"].rstrip("/")): o["kind"] for o in data["orphans"]}
    assert set(kinds) == {
        "ckpt-9.data-00000-of-00001",
        "ckpt-7.index.tempstate15713094282437616473",
        "checkpoint.tmp0123456789abcdef0123456789abcdef",
        "ckpt-8_temp",
        "ckpt-8.part-00000-of-00001.index",
        "ckpt-8.part-00000-of-00001.data-00000-of-00001",
        stale,
    }  # the live process's temporary is not an orphan
    assert kinds["ckpt-9.data-00000-of-00001"] == "data shard without an index"
    assert kinds["ckpt-8_temp"] == "part directory of an interrupted save"

    rc, out, err = ch.in_process("ls", run, "--json")
    assert rc == 0 and err == "" and json.loads(out) == json.loads(json.dumps(data))
    rc, out, err = ch.in_process("ls", run)
    assert rc == 0 and "ckpt-6" in out and "missing: the state file names ckpt-99" in out


def test_ls_tf1_saver_run(tf1_run, tmp_path, monkeypatch):
    run = _copy(tf1_run, tmp_path)
    # entries that climb out of the directory to a checkpoint there, relatively too
    other = _copy(tf1_run, tmp_path, "other")
    monkeypatch.chdir(tmp_path)
    state = (run / "checkpoint").read_text()
    (run / "checkpoint").write_text(
        state.replace(str(run / "model.ckpt-400"), "../other/model.ckpt-400").replace(
            str(run / "model.ckpt-500"), str(other / "model.ckpt-500")
        )
    )
    data = directories.ls("run")
    assert data["elsewhere"] == ["../other/model.ckpt-400", str(other / "model.ckpt-500")]
    assert [r["in_state_file"] for r in data["checkpoints"]] == [False, False, True, True]
    (run / "checkpoint").write_text(state)
    data = directories.ls(str(run))
    assert [r["name"] for r in data["checkpoints"]] == [
        f"model.ckpt-{s}" for s in (400, 500, 600, 700)
    ]
    assert all(r["in_state_file"] for r in data["checkpoints"])
    assert data["latest"] == "model.ckpt-700" and data["orphans"] == []


# ---------------------------------------------------------------- prune


def test_prune_tf2_run_as_checkpoint_manager_leaves_it(tf2_run, tmp_path):
    run = _copy(tf2_run, tmp_path)
    (run / "ckpt-9.data-00000-of-00001").write_bytes(b"x")
    _aged(run / "ckpt-9.data-00000-of-00001")
    before = _files(run)
    plan = directories.prune(str(run), keep_last=2, keep_every_steps=3, keep=[1], dry_run=True)
    assert _files(run) == before  # a dry run changes nothing
    assert [r["name"] for r in plan["removed"]] == ["ckpt-2", "ckpt-4"]
    assert plan["kept"] == ["ckpt-1", "ckpt-3", "ckpt-5", "ckpt-6"]

    rc, out, err = ch.in_process(
        "prune", run, "--keep-last", "2", "--keep-every-steps", "3", "--keep", "1", "--json"
    )
    assert rc == 0, err
    assert json.loads(out)["kept"] == plan["kept"]
    names = sorted(os.listdir(run))
    assert names == sorted(
        ["checkpoint"]
        + [f"ckpt-{s}{x}" for s in (1, 3, 5, 6) for x in (".index", ".data-00000-of-00001")]
    )
    for s in (1, 3, 5, 6):  # untouched
        assert (run / f"ckpt-{s}.index").read_bytes() == before[f"ckpt-{s}.index"]
        _restores_tf2(str(run / f"ckpt-{s}"), s)
    state = paths.read_state_file(LOCAL, str(run))
    old = paths.read_state_file(LOCAL, str(tf2_run))
    assert state.model_checkpoint_path == "ckpt-6"
    assert list(state.all_model_checkpoint_paths) == ["ckpt-5", "ckpt-6"]
    assert list(state.all_model_checkpoint_timestamps) == list(
        old.all_model_checkpoint_timestamps[4:]
    )
    # ckpt-3 was saved after ckpt-1: the manager keeps both for good from here on
    assert state.last_preserved_timestamp == old.all_model_checkpoint_timestamps[2]

    assert tf.train.latest_checkpoint(str(run)) == str(run / "ckpt-6")
    manager, v = _manager(run, max_to_keep=2)
    assert manager.checkpoints == [str(run / "ckpt-5"), str(run / "ckpt-6")]
    assert manager.latest_checkpoint == str(run / "ckpt-6")
    v.assign(_tf2_value(7))
    manager.save(checkpoint_number=7)  # deletes ckpt-5, never the preserved ones
    assert not (run / "ckpt-5.index").exists()
    for s in (1, 3, 6, 7):
        _restores_tf2(str(run / f"ckpt-{s}"), s)


def test_prune_never_follows_a_link_out_of_the_directory(tf2_run, tmp_path):
    """A link named as a part directory is none (TensorFlow makes no links): it stays,
    with what it leads to, even when that holds only part files."""
    run = _copy(tf2_run, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_bytes(b"keep me")
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "part-00000-of-00001.index").write_bytes(b"not the run's")
    (run / "ckpt-8_temp").symlink_to(outside, target_is_directory=True)
    (run / "ckpt-9_temp").symlink_to(parts, target_is_directory=True)
    assert directories.ls(str(run))["orphans"] == []
    directories.prune(str(run), keep_last=TF2_STEPS, min_age=0)
    assert os.path.islink(run / "ckpt-8_temp") and os.path.islink(run / "ckpt-9_temp")
    assert (outside / "precious").read_bytes() == b"keep me"
    assert (parts / "part-00000-of-00001.index").read_bytes() == b"not the run's"


def test_prune_tf1_saver_run(tf1_run, tmp_path):
    run = _copy(tf1_run, tmp_path)
    result = directories.prune(str(run), keep_last=1, keep=[500])
    assert [r["name"] for r in result["removed"]] == ["model.ckpt-400", "model.ckpt-600"]
    assert sorted(p.name for p in run.iterdir()) == sorted(
        ["checkpoint"]
        + [
            f"model.ckpt-{s}{x}"
            for s in (500, 700)
            for x in (".index", ".meta", ".data-00000-of-00001")
        ]
    )
    assert _state_names(run) == ("model.ckpt-700", ["model.ckpt-700"])
    assert tf.train.latest_checkpoint(str(run)) == str(run / "model.ckpt-700")
    state = tf.train.get_checkpoint_state(str(run))
    assert list(state.all_model_checkpoint_paths) == [str(run / "model.ckpt-700")]
    for s in (500, 700):
        _restores_tf1(str(run / f"model.ckpt-{s}"), s)
    # a second prune keeping as much has nothing to do
    again = directories.prune(str(run), keep_last=1, keep=[500])
    assert again["removed"] == [] and again["orphans"] == []


def test_prune_and_ls_cli_errors(tf2_run, tmp_path):
    run = _copy(tf2_run, tmp_path)
    before = _files(run)
    ch.assert_cli_error(ch.in_process("prune", run, "--keep-last", "0"), "keep_last", ">= 1")
    ch.assert_cli_error(
        ch.in_process("prune", run, "--keep-last", "2", "--keep-every-steps", "0"),
        "keep_every_steps",
    )
    ch.assert_cli_error(ch.in_process("ls", tmp_path / "nowhere"), "nowhere")
    (run / "checkpoint").write_text("model_checkpoint_path: [")
    ch.assert_cli_error(
        ch.in_process("prune", run, "--keep-last", "1"), "cannot prune", "state file"
    )
    del before["checkpoint"]
    after = _files(run)
    del after["checkpoint"]
    assert after == before


# Runs the command line, SIGKILLed at the KILL_AT-th file operation that changes the
# directory (a state file written, a file deleted, a file moved into place).
KILL_AT_OPERATION = """
import os, signal, sys
from tfckpt.io import storage
calls = [0]
def killing(name):
    real = getattr(storage.Storage, name)
    def op(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == int(os.environ["KILL_AT"]):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, *args, **kwargs)
    setattr(storage.Storage, name, op)
for name in ("remove", "replace", "rename_noreplace", "write_new"):
    killing(name)
from tfckpt.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def forker(tmp_path_factory):
    """The killed commands' processes, forked from one that imported tfckpt once."""
    preload = ("tfckpt.cli", "tfckpt.inspection.directories", "tfckpt.io.storage")
    with ch.Forker(*preload, tmp_dir=tmp_path_factory.mktemp("forked")) as forker:
        yield forker


def _killed_at(forker, n: int, *args) -> int:
    proc = forker.run(KILL_AT_OPERATION, *args, env=ch.user_env(KILL_AT=str(n)), timeout=60)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode


def _state_names_exist(run) -> None:
    """The state file names only checkpoints that are there, and TensorFlow agrees."""
    latest, listed = _state_names(run)
    for name in [*listed, latest]:
        assert (run / f"{name}.index").exists(), name
    assert tf.train.latest_checkpoint(str(run)) == str(run / latest)


def test_sigkill_during_prune_loses_nothing_kept(forker, tf2_run, tmp_path):
    kept = (3, 5, 6)
    outcomes = []
    for n in range(1, 12):
        run = _copy(tf2_run, tmp_path, f"run{n}")
        (run / "ckpt-9.data-00000-of-00001").write_bytes(b"x")
        (run / "ckpt-8_temp").mkdir()
        (run / "ckpt-8_temp" / "part-00000-of-00001.index").write_bytes(b"y")
        # all of it long written: what a killed prune leaves (data without its index)
        # is no save in progress for the next prune
        _aged(*run.iterdir(), run / "ckpt-8_temp" / "part-00000-of-00001.index")
        before = _files(run)
        args = ("prune", run, "--keep-last", "2", "--keep", "3")
        rc = _killed_at(forker, n, *args)
        outcomes.append(rc)
        for s in kept:  # every file of every checkpoint kept, byte for byte
            for f in (f"ckpt-{s}.index", f"ckpt-{s}.data-00000-of-00001"):
                assert (run / f).read_bytes() == before[f], (n, f)
        _state_names_exist(run)
        assert ch.in_process(*args)[0] == 0  # the next run completes the prune
        assert sorted(os.listdir(run)) == sorted(
            ["checkpoint"]
            + [f"ckpt-{s}{x}" for s in kept for x in (".index", ".data-00000-of-00001")]
        )
        _state_names_exist(run)
        for s in kept:
            _restores_tf2(str(run / f"ckpt-{s}"), s)
    assert -signal.SIGKILL in outcomes and outcomes[-1] == 0, outcomes


# ---------------------------------------------------------------- cp and mv


def test_cp_run_rewrites_the_state_file_for_the_copy(tf1_run, tf2_run, tmp_path):
    src1 = _copy(tf1_run, tmp_path, "src1")
    dst1 = tmp_path / "copies" / "tf1"
    before = _files(src1)
    rc, out, err = ch.in_process("cp", src1, dst1)
    assert rc == 0, err
    assert _files(src1) == before
    assert {k: v for k, v in _files(dst1).items() if k != "checkpoint"} == {
        k: v for k, v in before.items() if k != "checkpoint"
    }
    # A Saver's absolute paths into the source now point into the copy
    latest, listed = _state_names(dst1)
    assert latest == str(dst1.resolve() / "model.ckpt-700")
    assert listed == [str(dst1.resolve() / f"model.ckpt-{s}") for s in (400, 500, 600, 700)]
    assert tf.train.latest_checkpoint(str(dst1)) == str(dst1.resolve() / "model.ckpt-700")
    for s in (400, 700):
        _restores_tf1(str(dst1 / f"model.ckpt-{s}"), s)

    dst2 = tmp_path / "copies" / "tf2"
    tfckpt.inspection.directories.copy(str(tf2_run), str(dst2))
    assert (dst2 / "checkpoint").read_bytes() == (tf2_run / "checkpoint").read_bytes()
    manager, _ = _manager(dst2, max_to_keep=TF2_STEPS)
    assert manager.checkpoints == [str(dst2 / f"ckpt-{s}") for s in range(1, TF2_STEPS + 1)]
    for s in range(1, TF2_STEPS + 1):
        _restores_tf2(str(dst2 / f"ckpt-{s}"), s)

    # one checkpoint: into a directory under its name, or renamed
    tfckpt.inspection.directories.copy(str(tf2_run / "ckpt-4"), str(tmp_path / "one") + "/")
    tfckpt.inspection.directories.copy(str(tf2_run / "ckpt-4"), str(tmp_path / "one" / "best"))
    _restores_tf2(str(tmp_path / "one" / "ckpt-4"), 4)
    _restores_tf2(str(tmp_path / "one" / "best"), 4)
    assert sorted(os.listdir(tmp_path / "one")) == [
        "best.data-00000-of-00001",
        "best.index",
        "ckpt-4.data-00000-of-00001",
        "ckpt-4.index",
    ]
    # an existing destination is refused, the source is the source, nothing is changed
    snapshot = _files(tmp_path / "copies")
    ch.assert_cli_error(ch.in_process("cp", src1, dst1), "exists", "model.ckpt-400")
    ch.assert_cli_error(ch.in_process("mv", dst1, dst1), "the destination is the source")
    ch.assert_cli_error(ch.in_process("cp", dst1, dst1 / "inner"), "inside the source")
    ch.assert_cli_error(ch.in_process("cp", dst1 / "model.ckpt-1", tmp_path), "no checkpoint")
    assert _files(tmp_path / "copies") == snapshot


def test_mv_run_and_one_checkpoint(tf2_run, tmp_path):
    src = _copy(tf2_run, tmp_path, "src")
    dst = tmp_path / "moved"
    rc, out, err = ch.in_process("mv", src, dst)
    assert rc == 0, err
    assert not src.exists()
    manager, _ = _manager(dst, max_to_keep=TF2_STEPS)
    assert manager.latest_checkpoint == str(dst / f"ckpt-{TF2_STEPS}")
    # one checkpoint out of a run: its entry leaves the run's state file
    rc, out, err = ch.in_process("mv", dst / f"ckpt-{TF2_STEPS}", tmp_path / "best" / "model")
    assert rc == 0, err
    _restores_tf2(str(tmp_path / "best" / "model"), TF2_STEPS)
    assert not (dst / f"ckpt-{TF2_STEPS}.index").exists()
    assert _state_names(dst) == (
        f"ckpt-{TF2_STEPS - 1}",
        [f"ckpt-{s}" for s in range(1, TF2_STEPS)],
    )
    assert tf.train.latest_checkpoint(str(dst)) == str(dst / f"ckpt-{TF2_STEPS - 1}")


def test_mv_whose_copy_does_not_verify_keeps_the_source(tf2_run, tmp_path, monkeypatch):
    from tfckpt.io import directories as io_dirs

    src = _copy(tf2_run, tmp_path, "src")
    before = _files(src)
    real = io_dirs.copy_file

    def damaging(src_store, path, dst_store, dst):
        n = real(src_store, path, dst_store, dst)
        if ".data-" in path and path.endswith("ckpt-3.data-00000-of-00001"):
            data = bytearray(open(dst, "rb").read())
            data[-1] ^= 0x40
            with open(dst, "wb") as f:
                f.write(data)
        return n

    monkeypatch.setattr(io_dirs, "copy_file", damaging)
    line = ch.assert_cli_error(ch.in_process("mv", src, tmp_path / "dst"), "does not verify")
    assert "source is left as it was" in line
    assert _files(src) == before


def _complete_somewhere(step: int, *places) -> None:
    """Checkpoint ``step`` restores, with its values, from one of ``places`` at least."""
    for place in places:
        if (place / f"ckpt-{step}.index").exists():
            report = tfckpt.inspection.verify(str(place / f"ckpt-{step}"))
            if not report["problems"]:
                _restores_tf2(str(place / f"ckpt-{step}"), step)
                return
    raise AssertionError(f"ckpt-{step} is lost: {places}")


def test_sigkill_during_mv_loses_nothing(forker, tf2_run, tmp_path):
    outcomes = []
    n = 0
    while True:
        n += 1
        src = _copy(tf2_run, tmp_path, f"src{n}")
        dst = tmp_path / f"dst{n}"
        rc = _killed_at(forker, n, "mv", src, dst)
        outcomes.append(rc)
        for step in range(1, TF2_STEPS + 1):
            _complete_somewhere(step, src, dst)
        if src.exists() and (src / "checkpoint").exists():
            _state_names_exist(src)  # the source's state file names what is there
        if dst.exists() and (dst / "checkpoint").exists():
            _state_names_exist(dst)
        if rc == 0:
            break
        assert rc == -signal.SIGKILL, rc
        if any(src.glob("*.index")):  # `mv --overwrite` again finishes the move
            assert ch.in_process("mv", src, dst, "--overwrite")[0] == 0, n
        # at most the data shard a kill between its index and it left
        assert [p.name for p in src.glob("*") if ".data-" not in p.name] == [], n
        manager, _ = _manager(dst, max_to_keep=TF2_STEPS)
        assert manager.checkpoints == [str(dst / f"ckpt-{s}") for s in range(1, TF2_STEPS + 1)]
        for step in range(1, TF2_STEPS + 1):
            _restores_tf2(str(dst / f"ckpt-{step}"), step)
    # killed while copying, while publishing, and while deleting the source
    assert n > TF2_STEPS * 3, n


def _tf2_restored(prefix: str) -> np.ndarray:
    v = tf.Variable(np.zeros(4, np.float32))
    tf.train.Checkpoint(v=v).restore(prefix).assert_consumed()
    return v.numpy()


def test_overwrite_replaces_each_checkpoint_in_one_step(forker, tf2_run, tf2_other, tmp_path):
    """SIGKILL at the file operations of `cp --overwrite`: each checkpoint restores, whole,
    with its old values or its new ones; the state file names what is there."""
    dst = _copy(tf2_other, tmp_path, "dst")
    ch.assert_cli_error(ch.in_process("cp", tf2_run, dst), "--overwrite", "ckpt-1")
    ch.assert_cli_error(ch.in_process("cp", tf2_run / "ckpt-2", dst / "ckpt-2"), "--overwrite")
    outcomes = []
    for n in [*range(1, 14), *range(18, 42, 6), 0]:  # 0: not killed
        run = _copy(tf2_other, tmp_path, f"dst{n}")
        rc = _killed_at(forker, n, "cp", tf2_run, run, "--overwrite")
        outcomes.append(rc)
        for s in range(1, TF2_STEPS + 1):
            assert not tfckpt.inspection.verify(str(run / f"ckpt-{s}"))["problems"], (n, s)
            got = _tf2_restored(str(run / f"ckpt-{s}"))
            new, old = _tf2_value(s), _tf2_value(s) + 100
            assert np.array_equal(got, new) or np.array_equal(got, old), (n, s, got)
        _state_names_exist(run)
    assert outcomes[-1] == 0 and outcomes.count(-signal.SIGKILL) == len(outcomes) - 1
    data = directories.ls(str(run))
    assert data["orphans"] == [] and len(data["checkpoints"]) == TF2_STEPS
    for s in range(1, TF2_STEPS + 1):  # one empty extra shard: new names, old data gone
        assert sorted(p.name for p in run.glob(f"ckpt-{s}.*")) == [
            f"ckpt-{s}.data-00000-of-00002",
            f"ckpt-{s}.data-00001-of-00002",
            f"ckpt-{s}.index",
        ]
        assert (run / f"ckpt-{s}.data-00001-of-00002").stat().st_size == 0
        _restores_tf2(str(run / f"ckpt-{s}"), s)
    assert tf.train.latest_checkpoint(str(run)) == str(run / f"ckpt-{TF2_STEPS}")
    # the same again: back to one shard, the two-shard files gone
    copy = _copy(tf2_run, tmp_path, "again")
    assert ch.in_process("mv", copy / "ckpt-3", run / "ckpt-3", "--overwrite")[0] == 0
    assert sorted(p.name for p in run.glob("ckpt-3.*")) == [
        "ckpt-3.data-00000-of-00001",
        "ckpt-3.index",
    ]
    _restores_tf2(str(run / "ckpt-3"), 3)
    assert not (copy / "ckpt-3.index").exists()


def test_full_disk_during_mv_and_prune_changes_nothing(tf2_run, tmp_path):
    """RLIMIT_FSIZE plays the full disk: a file of more than 100 bytes cannot be written."""
    import resource

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))

    src = _copy(tf2_run, tmp_path, "src")
    before = _files(src)
    dst = tmp_path / "out" / "run"
    proc = ch.run_text("mv", src, dst, preexec_fn=limited)
    ch.assert_cli_error(proc, "File too large")
    assert _files(src) == before
    assert not (tmp_path / "out").exists()  # the directories it made, removed again
    proc = ch.run_text("prune", src, "--keep-last", "1", preexec_fn=limited)
    ch.assert_cli_error(proc, "state file", "File too large")
    assert _files(src) == before


# ---------------------------------------------------------------- object stores


def test_cp_and_mv_through_s3(s3, tf2_run, tmp_path):
    url = f"{s3.url}/runs/tf2"
    rc, out, err = ch.in_process("cp", tf2_run, url)
    assert rc == 0, err
    stored = s3.files("runs/tf2")
    assert stored["checkpoint"] == (tf2_run / "checkpoint").read_bytes()
    assert len(stored) == 1 + 2 * TF2_STEPS
    data = directories.ls(url)
    assert data["latest"] == f"ckpt-{TF2_STEPS}" and len(data["checkpoints"]) == TF2_STEPS

    # back to a local disk with the bucket failing its deletes: the copy is whole, the
    # source still has every checkpoint it did not get to delete
    s3.proxy.rules.append(on("DELETE", ".data-00000-of-00001", 500))
    back = tmp_path / "back"
    line = ch.assert_cli_error(ch.in_process("mv", url, back), "deleting")
    assert "ckpt-1.data-00000-of-00001" in line
    manager, _ = _manager(back, max_to_keep=TF2_STEPS)
    assert manager.checkpoints == [str(back / f"ckpt-{s}") for s in range(1, TF2_STEPS + 1)]
    for s in range(1, TF2_STEPS + 1):
        _restores_tf2(str(back / f"ckpt-{s}"), s)
    s3.proxy.reset()

    # to S3 with the bucket failing an index upload: the source stays, no index is there
    src = _copy(tf2_run, tmp_path, "src")
    before = _files(src)
    s3.proxy.rules.append(on("PUT", "ckpt-2.index", 503))
    ch.assert_cli_error(ch.in_process("mv", src, f"{s3.url}/runs/fail"), "ckpt-2.index")
    assert _files(src) == before
    left = s3.files("runs/fail")
    assert "ckpt-2.index" not in left and "checkpoint" not in left
    assert len(s3.proxy.requests("PUT", "ckpt-2.index")) == 2  # one retry, then gave up


def test_prune_on_s3_with_failing_requests(s3, tf2_run, tmp_path):
    url = f"{s3.url}/runs/prune"
    directories.copy(str(tf2_run), url)
    part = f"{url[len('s3://') :]}/ckpt-8_temp/part-00000-of-00001.index"
    s3.direct.pipe_file(part, b"left by a killed save")
    assert [o["kind"] for o in directories.ls(url)["orphans"]] == [
        "part directory of an interrupted save"
    ]
    before = s3.files("runs/prune")
    # the state file cannot be stored: nothing is deleted
    s3.proxy.rules.append(on("PUT", "/checkpoint", 500))
    ch.assert_cli_error(
        ch.in_process("prune", url, "--keep-last", "2", "--min-age", "0"),
        "/checkpoint: writing failed",
    )
    assert s3.files("runs/prune") == before
    s3.proxy.reset()
    # a delete fails: the new state file names only what is there, kept files are whole
    s3.proxy.rules.append(on("DELETE", "ckpt-2.index", 500))
    ch.assert_cli_error(
        ch.in_process("prune", url, "--keep-last", "2", "--min-age", "0"), "ckpt-2.index"
    )
    s3.proxy.reset()
    data = directories.ls(url)
    assert data["missing"] == [] and data["latest"] == f"ckpt-{TF2_STEPS}"
    listed = [c["name"] for c in data["checkpoints"] if c["in_state_file"]]
    assert listed == [f"ckpt-{TF2_STEPS - 1}", f"ckpt-{TF2_STEPS}"]
    after = s3.files("runs/prune")
    for s in (TF2_STEPS - 1, TF2_STEPS):
        for f in (f"ckpt-{s}.index", f"ckpt-{s}.data-00000-of-00001"):
            assert after[f] == before[f]
    assert ch.in_process("prune", url, "--keep-last", "2", "--min-age", "0")[0] == 0
    assert sorted(s3.files("runs/prune")) == sorted(
        ["checkpoint"]
        + [f"ckpt-{s}{x}" for s in (5, 6) for x in (".index", ".data-00000-of-00001")]
    )
    back = tmp_path / "back"
    directories.copy(url, str(back))
    manager, _ = _manager(back, max_to_keep=2)
    assert manager.checkpoints == [str(back / "ckpt-5"), str(back / "ckpt-6")]
    for s in (5, 6):
        _restores_tf2(str(back / f"ckpt-{s}"), s)


def test_v1_runs_ls_prune_and_cp(tmp_path, v1_sharded):
    """V1 files: a Saver(V1) run (one table file per save) and a sharded V1 run (files
    named by a pattern in the state file)."""
    run = tmp_path / "v1"
    saver_run(run, tf.compat.v1.train.SaverDef.V1)
    data = directories.ls(str(run))
    rows = data["checkpoints"]
    assert [(r["name"], r["format"], r["shards"]) for r in rows] == [
        (f"model.ckpt-{s}", "V1", 1) for s in (1, 2, 3)
    ]
    assert [r["bytes"] for r in rows] == [(run / r["name"]).stat().st_size for r in rows]
    assert data["latest"] == "model.ckpt-3" and all(r["in_state_file"] for r in rows)
    values = {
        s: tf.train.load_checkpoint(str(run / f"model.ckpt-{s}")).get_tensor("v") for s in (1, 3)
    }
    directories.prune(str(run), keep_last=1, keep=[1])
    assert sorted(p.name for p in run.iterdir()) == sorted(
        ["checkpoint", "model.ckpt-1", "model.ckpt-1.meta", "model.ckpt-3", "model.ckpt-3.meta"]
    )
    assert tf.train.latest_checkpoint(str(run)) == str(run / "model.ckpt-3")
    copy = tmp_path / "v1copy"
    directories.copy(str(run), str(copy))
    assert tf.train.latest_checkpoint(str(copy)) == str(copy.resolve() / "model.ckpt-3")
    for s in (1, 3):
        np.testing.assert_array_equal(
            tf.train.load_checkpoint(str(copy / f"model.ckpt-{s}")).get_tensor("v"), values[s]
        )

    directory, saved = v1_sharded
    sharded = tmp_path / "sharded"
    shutil.copytree(directory, sharded)
    text = (sharded / "checkpoint").read_text().replace(directory, str(sharded))
    (sharded / "checkpoint").write_text(text)
    data = directories.ls(str(sharded))
    assert [(r["name"], r["format"], r["shards"]) for r in data["checkpoints"]] == [
        (f"model.ckpt-{s}", "V1", 2) for s in (1, 2, 3)
    ]
    assert data["latest"] == "model.ckpt-3" and data["missing"] == []
    directories.prune(str(sharded), keep_last=2)
    assert not list(sharded.glob("model.ckpt-1*"))
    assert _state_names(sharded) == (
        "model.ckpt-3-?????-of-00002",
        ["model.ckpt-2-?????-of-00002", "model.ckpt-3-?????-of-00002"],
    )
    assert tf.train.latest_checkpoint(str(sharded)) == str(sharded / "model.ckpt-3-?????-of-00002")
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(sharded)))
    assert sorted(reader.get_variable_to_shape_map()) == ["a", "b"]


def test_overwrite_on_s3_whose_index_upload_fails(s3, tf2_run, tf2_other, tmp_path):
    url = f"{s3.url}/runs/over"
    directories.copy(str(tf2_other), url)
    before = s3.files("runs/over")
    s3.proxy.rules.append(on("PUT", "ckpt-3.index", 500))
    ch.assert_cli_error(ch.in_process("cp", tf2_run, url, "--overwrite"), "ckpt-3.index")
    s3.proxy.reset()
    after = s3.files("runs/over")
    for s in (3, 4, 5, 6):  # untouched, no new data left beside them
        assert sorted(k for k in after if k.startswith(f"ckpt-{s}.")) == sorted(
            k for k in before if k.startswith(f"ckpt-{s}.")
        )
        assert all(after[k] == before[k] for k in before if k.startswith(f"ckpt-{s}."))
    assert after["checkpoint"] == before["checkpoint"]
    assert ch.in_process("cp", tf2_run, url, "--overwrite")[0] == 0
    back = tmp_path / "back"
    directories.copy(url, str(back))
    assert directories.ls(url)["orphans"] == []
    for s in range(1, TF2_STEPS + 1):
        _restores_tf2(str(back / f"ckpt-{s}"), s)


def test_prune_leaves_a_save_in_progress_alone(tf2_run, tmp_path):
    """TensorFlow mid-save: its part directory ``ckpt-7_temp/`` written (SaveV2 of the part,
    as a sharded save writes it), not merged yet. prune leaves it and a checkpoint whose
    index temporary is fresh; the save then completes (MergeV2Checkpoints) and TensorFlow
    reads it. An hour later the same part directory is a leftover prune removes."""
    run = _copy(tf2_run, tmp_path)
    part = str(run / "ckpt-7_temp" / "part-00000-of-00001")
    value = np.arange(5, dtype=np.float32)
    tf.raw_ops.SaveV2(prefix=part, tensor_names=["v"], shape_and_slices=[""], tensors=[value])
    (run / "ckpt-2.index.tempstate123").write_bytes(b"")  # ckpt-2 being written again
    rc, out, err = ch.in_process("prune", run, "--keep-last", "2", "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert sorted(os.path.basename(o["path"].rstrip("/")) for o in data["in_progress"]) == [
        "ckpt-2.index.tempstate123",
        "ckpt-7_temp",
    ]
    assert [r["name"] for r in data["removed"]] == ["ckpt-1", "ckpt-3", "ckpt-4"]
    assert (run / "ckpt-2.index").exists() and (run / "ckpt-7_temp").is_dir()
    tf.raw_ops.MergeV2Checkpoints(
        checkpoint_prefixes=[part], destination_prefix=str(run / "ckpt-7"), delete_old_dirs=True
    )
    np.testing.assert_array_equal(
        tf.train.load_checkpoint(str(run / "ckpt-7")).get_tensor("v"), value
    )
    _restores_tf2(str(run / "ckpt-2"), 2)

    tf.raw_ops.SaveV2(prefix=part, tensor_names=["v"], shape_and_slices=[""], tensors=[value])
    _aged(*(run / "ckpt-7_temp").iterdir(), run / "ckpt-2.index.tempstate123")
    data = directories.prune(str(run), keep_last=2)
    assert data["in_progress"] == [] and [r["name"] for r in data["removed"]] == [
        "ckpt-2",
        "ckpt-5",
    ]
    assert not (run / "ckpt-7_temp").exists()
    assert sorted(os.listdir(run)) == sorted(
        ["checkpoint"]
        + [f"ckpt-{s}{x}" for s in (6, 7) for x in (".index", ".data-00000-of-00001")]
    )
    ch.assert_cli_error(
        ch.in_process("prune", run, "--keep-last", "1", "--min-age", "nan"), "min_age"
    )


# ---------------------------------------------------------------- what prune owns


def _blocked_save(obstacle, save) -> None:
    """Run TensorFlow's ``save()`` with a non-empty directory at ``obstacle``, where the save
    renames a file to: the save fails there, leaving what it wrote before (its real
    leftovers); the obstacle is removed again."""
    (obstacle / "x").mkdir(parents=True)
    with pytest.raises(tf.errors.OpError):
        save()
    shutil.rmtree(obstacle)


def _foreign(run) -> dict[str, bytes]:
    """What other programs keep in a run's directory under names like a save's
    temporaries: prune must leave every one of them alone. Returns their files."""
    before = _files(run)
    for d, f in [
        ("eval_temp", "events.out.tfevents.1.host"),
        ("tensorboard_temp", "plugins.json"),
        ("ckpt-8_temp", "notes.txt"),  # a checkpoint's name, but not a part directory
        ("eval_temp_0123456789abcdef0123456789abcdef", "part-00000-of-00001.index"),
    ]:
        (run / d).mkdir()
        (run / d / f).write_bytes(b"not the run's")
    (run / "ckpt-8_temp" / "part-00000-of-00001.index").write_bytes(b"y")
    (run / "x.tempstate123").write_bytes(b"not the run's")
    (run / "embeddings.index.tempstate5").write_bytes(b"not the run's")
    (run / "eval.data-00000-of-00001").write_bytes(b"not the run's")
    (run / "notes.txt.tfckpt-tmp-1-0a1b2c3d").write_bytes(b"not the run's")
    (run / "checkpoint.tmp0123456789abcdef0123456789abcdef").mkdir()  # a directory
    (run / "checkpoint.tmp0123456789abcdef0123456789abcdef" / "keep").write_bytes(b"k")
    return {p: b for p, b in _files(run).items() if p not in before}


def _leftovers(data) -> list[str]:
    return sorted(os.path.basename(o["path"].rstrip("/")) for o in data["orphans"])


def test_prune_removes_only_what_the_runs_saves_left(forker, tf2_run, tmp_path):
    """A CheckpointManager run whose saves TensorFlow left unfinished (a part directory
    with its shards; one with a data file's ``.tempstate``; a merge half done) and one
    tfckpt left killed, beside other programs' ``eval_temp/``, ``tensorboard_temp/``,
    ``x.tempstate123`` ...: ls lists, ``prune --dry-run`` says and prune removes exactly
    the run's; the others are there byte for byte; TensorFlow restores what is kept."""
    run = _copy(tf2_run, tmp_path)
    foreign = _foreign(run)
    foreign_state = (run / "checkpoint").read_bytes()
    manager, v = _manager(run, max_to_keep=None)
    v.assign(_tf2_value(7))
    # the merge cannot move the shard: ckpt-7_temp/part-00000-of-00001.{index,data-...}
    _blocked_save(run / "ckpt-7.data-00000-of-00001", lambda: manager.save(checkpoint_number=7))
    # the part's data cannot be renamed: ckpt-9_temp/part-...data-00000-of-00001.tempstateN
    part_data = run / "ckpt-9_temp" / "part-00000-of-00001.data-00000-of-00001"
    _blocked_save(part_data, lambda: manager.save(checkpoint_number=9))
    # the merged index cannot be written: ckpt-10.data-... and the part's index are left
    _blocked_save(run / "ckpt-10.index", lambda: manager.save(checkpoint_number=10))
    assert (run / "checkpoint").read_bytes() == foreign_state  # no failed save listed
    # tfckpt writing ckpt-11 into the run, killed before its commit
    ch_args = ("convert", run / f"ckpt-{TF2_STEPS}", run / "ckpt-11", "--dtype", "float16")
    assert _killed_at(forker, 2, *ch_args) == -signal.SIGKILL
    tfckpt_left = sorted(n for n in os.listdir(run) if n.startswith("ckpt-11.tfckpt-tmp-"))
    assert [n.rsplit(".", 1)[1] for n in tfckpt_left] == ["data-0", "index"]
    tempstate = [p.name for p in (run / "ckpt-9_temp").iterdir()]
    assert len(tempstate) == 1 and tempstate[0].startswith(f"{part_data.name}.tempstate")
    owned = sorted(
        [
            "ckpt-7_temp",
            "ckpt-9_temp",
            "ckpt-10_temp",
            "ckpt-10.data-00000-of-00001",
            *tfckpt_left,
        ]
    )
    assert sorted(os.listdir(run / "ckpt-7_temp")) == [
        "part-00000-of-00001.data-00000-of-00001",
        "part-00000-of-00001.index",
    ]
    assert os.listdir(run / "ckpt-10_temp") == ["part-00000-of-00001.index"]

    assert _leftovers(directories.ls(str(run))) == owned
    before = _files(run)
    args = ("prune", run, "--keep-last", "2", "--min-age", "0")
    rc, out, err = ch.in_process(*args, "--dry-run", "--json")
    assert rc == 0, err
    assert _leftovers(json.loads(out)) == owned and _files(run) == before
    rc, out, err = ch.in_process(*args, "--dry-run")
    assert (
        rc == 0
        and sorted(
            os.path.basename(line.split(" (")[0].split(" ", 2)[2].rstrip("/"))
            for line in out.splitlines()
            if line.startswith("would remove ") and "files)" not in line
        )
        == owned
    )
    rc, out, err = ch.in_process(*args, "--json")
    assert rc == 0, err
    assert _leftovers(json.loads(out)) == owned
    after = _files(run)
    assert {p: after.get(p) for p in foreign} == foreign
    assert (run / "ckpt-8_temp").is_dir() and (run / "eval_temp").is_dir()
    assert sorted(n for n in os.listdir(run) if n.startswith("ckpt-")) == sorted(
        ["ckpt-8_temp"]
        + [f"ckpt-{s}{x}" for s in (5, 6) for x in (".index", ".data-00000-of-00001")]
    )
    manager, _ = _manager(run, max_to_keep=2)
    assert manager.checkpoints == [str(run / "ckpt-5"), str(run / "ckpt-6")]
    for s in (5, 6):
        _restores_tf2(str(run / f"ckpt-{s}"), s)
    # nothing of the run's is left: a second prune removes nothing more
    again = directories.prune(str(run), keep_last=2, min_age=0)
    assert again["orphans"] == [] and _files(run) == after


@pytest.mark.parametrize("sharded", [False, True], ids=["saver", "sharded-saver"])
def test_prune_removes_only_what_a_tf1_savers_saves_left(tf1_run, tmp_path, sharded):
    """A TF1 Saver's failed saves: beside the prefix (``model.ckpt-800.index.tempstateN``
    and the data it renamed; ``model.ckpt-900.data-00000-of-00001.tempstateN``), or with
    ``sharded=True`` its ``model.ckpt-800_temp/`` part directories. prune removes those
    and leaves the foreign ones."""
    run = _copy(tf1_run, tmp_path)
    foreign = _foreign(run)
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        w = v1.get_variable("w", initializer=np.zeros(3, np.float32))
        saver = v1.train.Saver(max_to_keep=None, sharded=sharded)
        with v1.Session() as sess:
            sess.run(w.initializer)
            for step, blocked in ((800, ".index"), (900, ".data-00000-of-00001")):
                _blocked_save(
                    run / f"model.ckpt-{step}{blocked}",
                    lambda step=step: saver.save(
                        sess, str(run / "model.ckpt"), global_step=step, write_state=False
                    ),
                )
    left = sorted(n for n in os.listdir(run) if n.startswith(("model.ckpt-800", "model.ckpt-900")))
    if sharded:
        assert left == [
            "model.ckpt-800.data-00000-of-00001",  # merged before the index failed
            "model.ckpt-800_temp",
            "model.ckpt-900_temp",
        ], left
    else:
        assert [n.split(".tempstate")[0] for n in left] == [
            "model.ckpt-800.data-00000-of-00001",  # renamed before the index failed
            "model.ckpt-800.index",
            "model.ckpt-900.data-00000-of-00001",
        ], left
        assert all(".tempstate" in n for n in left[1:])
    owned = left
    assert _leftovers(directories.ls(str(run))) == owned
    result = directories.prune(str(run), keep_last=4, min_age=0)
    assert _leftovers(result) == owned
    after = _files(run)
    assert {p: after.get(p) for p in foreign} == foreign
    assert tf.train.latest_checkpoint(str(run)) == str(run / "model.ckpt-700")
    for s in (400, 500, 600, 700):
        _restores_tf1(str(run / f"model.ckpt-{s}"), s)


@pytest.mark.parametrize(
    "state",
    ["garbage", "binary", "directory", "fifo"],
)
def test_mv_and_cp_of_a_run_whose_state_file_cannot_be_read_change_nothing(
    tf2_run, tmp_path, state
):
    """A run whose state file TensorFlow cannot read (not text protobuf, not UTF-8, a
    directory, a named pipe) is refused by mv and cp before anything is copied, in one
    line naming the state file: nothing moves (the state file is never left behind
    alone), nothing appears at the destination. Repaired, the run moves whole."""
    run = _copy(tf2_run, tmp_path)
    good = (run / "checkpoint").read_bytes()
    (run / "checkpoint").unlink()
    if state == "garbage":
        (run / "checkpoint").write_text("model_checkpoint_path: [")
    elif state == "binary":
        (run / "checkpoint").write_bytes(b"\xff\xfe\x00model")
    elif state == "directory":
        (run / "checkpoint").mkdir()
        (run / "checkpoint" / "x").write_bytes(b"x")
    else:
        os.mkfifo(run / "checkpoint")
    before = sorted(os.listdir(run))
    before_files = _files(run)
    for verb in ("mv", "cp"):
        dst = tmp_path / f"{verb}-dst"
        line = ch.assert_cli_error(ch.in_process(verb, run, dst), "state file", "nothing was")
        assert str(run / "checkpoint") in line
        assert sorted(os.listdir(run)) == before and _files(run) == before_files
        assert not dst.exists()
    with pytest.raises(tfckpt.CheckpointError, match="cannot move the run"):
        directories.move(str(run), str(tmp_path / "lib-dst"))
    assert not (tmp_path / "lib-dst").exists() and _files(run) == before_files

    if (run / "checkpoint").is_dir():
        shutil.rmtree(run / "checkpoint")
    else:
        (run / "checkpoint").unlink()
    (run / "checkpoint").write_bytes(good)
    dst = tmp_path / "moved"
    assert ch.in_process("mv", run, dst)[0] == 0
    assert not run.exists()
    manager, _ = _manager(dst, max_to_keep=TF2_STEPS)
    assert manager.latest_checkpoint == str(dst / f"ckpt-{TF2_STEPS}")
    for s in range(1, TF2_STEPS + 1):
        _restores_tf2(str(dst / f"ckpt-{s}"), s)
