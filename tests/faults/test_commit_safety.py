"""The local commit under contention and failure, on checkpoints TensorFlow wrote.

- Two real ``tfckpt convert`` processes to one destination, held at a barrier right before
  their first rename so they always race: exactly one commits, the other fails cleanly.
- A state file that cannot be written after the checkpoint is committed: a warning, exit 0,
  no temporary left (and temporaries of a killed state-file write are removed later).
- A full disk (RLIMIT_FSIZE) into a new nested destination: every directory the run
  created is removed again.
- A run killed (SIGKILL) at the rename of its index into place: what it leaves is no
  checkpoint to any reader.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import cli_helpers as ch  # noqa: E402
import transform_helpers as th  # noqa: E402
from cli_helpers import AT_BARRIER, in_process, user_env  # noqa: E402
from saver_runs import runs  # noqa: E402,F401  (the Saver runs)

import tfckpt  # noqa: E402
from tfckpt.io.temporaries import TMP_MARK  # noqa: E402
from tfckpt.rewrite.engine import execute  # noqa: E402

VALUES = {f"layer_{i}/kernel": np.linspace(-1, 1, 4096, dtype=np.float32) + i for i in range(4)}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """Four float32 tensors (64 KiB), written by TensorFlow's SaveV2."""
    return th.save_v2(tmp_path_factory.mktemp("commit_src") / "model", VALUES)


def temporaries(directory) -> list[str]:
    return sorted(f for f in os.listdir(directory) if TMP_MARK in f)


def tf_values(prefix) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(str(prefix))
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()}


def test_two_concurrent_converts_to_one_destination(source, tmp_path):
    dst = tmp_path / "out" / "model"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = dict(os.environ, BARRIER=str(barrier))
    procs = {
        dtype: subprocess.Popen(
            [sys.executable, "-c", AT_BARRIER, "convert", source, str(dst), "--dtype", dtype],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for dtype in ("float16", "bfloat16")
    }
    done = {dtype: (p.wait(timeout=120), p.stderr.read()) for dtype, p in procs.items()}
    assert len(os.listdir(barrier)) == 2  # both reached the commit before either went on
    winners = [d for d, (code, _) in done.items() if code == 0]
    assert len(winners) == 1, done
    (loser,) = set(done) - set(winners)
    code, err = done[loser]
    ch.assert_cli_error((code, "", err), "another run")
    # The winner's checkpoint, whole, as TensorFlow reads it; nothing of the loser's.
    got = tf_values(dst)
    assert sorted(got) == sorted(VALUES)
    for name, value in VALUES.items():
        assert got[name].dtype == tf.as_dtype(winners[0]).as_numpy_dtype
        assert got[name].tobytes() == value.astype(got[name].dtype).tobytes()
    assert temporaries(dst.parent) == []
    assert sorted(os.listdir(dst.parent)) == [
        "checkpoint",
        "model.data-00000-of-00001",
        "model.index",
    ]


def test_library_refuses_a_checkpoint_committed_meanwhile(source, tmp_path):
    """Planned while the destination was free, committed after another run took it."""
    dst = str(tmp_path / "model")
    plan = tfckpt.plan(source, dst, cast="float16")
    tfckpt.convert(source, dst, "bfloat16")
    before = th.digests(tmp_path)
    with pytest.raises(tfckpt.CheckpointWriteError, match="another run"):
        execute(plan)
    assert th.digests(tmp_path) == before
    assert {str(v.dtype) for v in tf_values(dst).values()} == {"bfloat16"}


def test_state_file_failure_after_the_commit_is_a_warning(source, tmp_path):
    out = tmp_path / "out"
    (out / "checkpoint").mkdir(parents=True)  # no state file can be renamed over this
    proc = ch.run_text("convert", source, f"{out}/", "--dtype", "float16")
    assert proc.returncode == 0, proc.stderr
    warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("tfckpt: warning:")]
    assert len(warnings) == 1 and "state file" in warnings[0], proc.stderr
    assert "Traceback" not in proc.stderr
    got = tf_values(out / "model")
    assert {n: v.tobytes() for n, v in got.items()} == {
        n: v.astype(np.float16).tobytes() for n, v in VALUES.items()
    }
    assert temporaries(out) == []
    # The library says so too.
    summary = tfckpt.convert(source, f"{out}/", "bfloat16", overwrite=True)
    assert len(summary.warnings) == 1 and "state file" in summary.warnings[0]
    assert temporaries(out) == []


def test_state_file_temporaries_of_killed_runs_are_removed(source, tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a process id no longer in use
    stale = tmp_path / f"checkpoint{TMP_MARK}{gone.pid}"
    stale.write_bytes(b'model_checkpoint_path: "half"\n')
    tfckpt.convert(source, f"{tmp_path}/", "float16")
    assert temporaries(tmp_path) == []
    assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "model")


def _limited(limit: int):
    def preexec():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


def test_full_disk_into_a_new_nested_directory(source, tmp_path):
    dst = tmp_path / "a" / "b" / "c" / "model"
    proc = ch.run_text("convert", source, dst, "--dtype", "float64", preexec_fn=_limited(16 << 10))
    ch.assert_cli_error(proc, "write")
    assert os.listdir(tmp_path) == []  # a/, a/b/ and a/b/c/ all removed again


# Killed (SIGKILL) as it commits: at the rename of its temporary index into place.
KILLED_AT_COMMIT = """
import os, signal, sys
def kill_at_index(fn):
    def call(src, dst, *a, **k):
        if ".tfckpt-tmp-" in os.fspath(src) and os.fspath(src).endswith(".index"):
            os.kill(os.getpid(), signal.SIGKILL)
        return fn(src, dst, *a, **k)
    return call
os.link, os.replace, os.rename = map(kill_at_index, (os.link, os.replace, os.rename))
from tfckpt.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_run_killed_at_its_commit_leaves_nothing_a_reader_takes(runs, tmp_path):
    from tfckpt.io.temporaries import TMP_MARK

    out = tmp_path / "out"
    argv = ["convert", runs["v2"][-1], str(out / "model"), "--dtype", "float16"]
    proc = subprocess.run([sys.executable, "-c", KILLED_AT_COMMIT, *argv], env=user_env())
    assert proc.returncode == -9
    left = [f for f in os.listdir(out) if TMP_MARK in f and f.endswith(".index")]
    assert left, os.listdir(out)
    with pytest.raises(tfckpt.CheckpointNotFoundError):
        tfckpt.open(str(out))
    assert tfckpt.list_checkpoints(str(out))["checkpoints"] == []
    rc, _, err = in_process("dump", out / "model")
    assert rc == 2 and TMP_MARK not in err, err
    # Beside a checkpoint, that checkpoint is the directory's only one.
    for f in os.listdir(os.path.dirname(runs["v2"][-1])):
        if f.startswith("model.ckpt-3.") and not f.endswith(".meta"):
            shutil.copy(os.path.join(os.path.dirname(runs["v2"][-1]), f), out / f)
    with tfckpt.open(str(out)) as ckpt:
        assert ckpt.prefix == str(out / "model.ckpt-3")
    rows = tfckpt.list_checkpoints(str(out))["checkpoints"]
    assert [r["name"] for r in rows] == ["model.ckpt-3"]
