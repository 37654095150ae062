"""Crashes mid-write, full disks, untouched sources, names that look like paths.

Real subprocesses are killed with SIGKILL at timed points and at every step of
the commit; a size limit (RLIMIT_FSIZE) plays the full disk.
"""

from __future__ import annotations

import hashlib
import os
import resource
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from cli_helpers import Forker, assert_cli_error, run_process

import tfckpt
from tfckpt import inspection as tfinspect

N_TENSORS = 48
ELEMENTS = 1 << 20  # 4 MiB of float32 each: ~190 MiB to convert


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("safety") / "src" / "model")
    with tfckpt.BundleWriter(prefix) as w:
        for i in range(N_TENSORS):
            w.add(f"layer_{i:02d}/kernel", (np.arange(ELEMENTS, dtype=np.float32) + i) / ELEMENTS)
        w.add("step", np.int64(5))
    return prefix


def _hash_files(prefix: str) -> dict[str, str]:
    d, base = os.path.split(prefix)
    return {
        f: hashlib.sha256(open(os.path.join(d, f), "rb").read()).hexdigest()
        for f in sorted(os.listdir(d))
        if f.startswith(base + ".")
    }


def _verified(prefix: str) -> str | None:
    """'absent' or 'broken: ...' when there is no intact checkpoint at ``prefix``."""
    if not os.path.exists(prefix + ".index"):
        return "absent"
    report = tfinspect.verify(prefix)
    return "broken: " + report["problems"][0] if report["problems"] else None


def _state(prefix: str) -> str:
    """'absent', 'old', 'new' or a description of what is wrong with the checkpoint there."""
    bad = _verified(prefix)
    if bad:
        return bad
    with tfckpt.open(prefix) as ckpt:
        dtype = ckpt.info("layer_00/kernel").dtype
        if len(ckpt) != N_TENSORS + 1:
            return f"broken: {len(ckpt)} tensors"
        if dtype == "float32":
            return "old"
        if dtype == "float16":
            first = ckpt["layer_00/kernel"]
            expected = (np.arange(ELEMENTS, dtype=np.float32) / ELEMENTS).astype(np.float16)
            return "new" if first.tobytes() == expected.tobytes() else "broken: values"
    return f"broken: dtype {dtype}"


def _leftovers(directory: str) -> list[str]:
    if not os.path.isdir(directory):
        return []  # a failed first write removes the directory it created
    return sorted(f for f in os.listdir(directory) if ".tfckpt-tmp-" in f)


def _convert_cmd(src, dst, *extra):
    return [
        sys.executable,
        "-m",
        "tfckpt",
        "convert",
        src,
        dst,
        "--dtype",
        "float16",
        "--overwrite",
        *extra,
    ]


@pytest.mark.parametrize("existing", [False, True], ids=["fresh", "overwrite"])
def test_sigkill_at_timed_points(forker, source, tmp_path, existing):
    dst = str(tmp_path / "out" / "model")
    seen = []
    # Before the run writes (start-up, planning), then at moments after its first
    # temporary file appears: a faster run must not slip between fixed times.
    for after_write, delay in [(False, 0.05)] + [
        (True, d) for d in (0, 0.01, 0.03, 0.06, 0.1, 0.2, 0.4)
    ]:
        if existing:
            tfckpt.transform(source, dst, overwrite=True)  # a float32 copy: the "old" one
        proc = subprocess.Popen(
            _convert_cmd(source, dst), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        if after_write:
            deadline = time.monotonic() + 30
            while (
                not _leftovers(os.path.dirname(dst))
                and proc.poll() is None
                and time.monotonic() < deadline
            ):
                time.sleep(0.001)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        state = _state(dst)
        # Killed with its temporary files on disk: the kill landed inside the write.
        inside = proc.returncode == -signal.SIGKILL and bool(_leftovers(os.path.dirname(dst)))
        seen.append((delay, state, inside))
        allowed = {"old", "new"} if existing else {"absent", "new"}
        assert state in allowed, f"killed after {delay} s: {state}"
        # The next run (a process of its own, forked) cleans up and completes.
        done = forker.run(CLI, *_convert_cmd(source, dst)[3:], env=dict(os.environ))
        assert done.returncode == 0, done.stderr
        assert _state(dst) == "new"
        assert _leftovers(os.path.dirname(dst)) == []
        if not existing:
            for f in os.listdir(os.path.dirname(dst)):
                os.unlink(os.path.join(os.path.dirname(dst), f))
    # The timing reached inside the write at least once (not only before or after it).
    assert any(inside for _, _, inside in seen), seen


CLI = """
import sys
from tfckpt.cli import main
sys.exit(main(sys.argv[1:]))
"""

KILL_AT_RENAME = """
import os, signal, sys
real_replace = os.replace
calls = [0]
def replace(src, dst, *a, **k):
    calls[0] += 1
    if calls[0] == int(os.environ["KILL_AT"]):
        os.kill(os.getpid(), signal.SIGKILL)
    return real_replace(src, dst, *a, **k)
os.replace = replace
from tfckpt.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def forker(tmp_path_factory):
    """Runs of the command line, each a process of its own, forked from one that started
    Python and imported numpy once (not tfckpt: KILL_AT_RENAME patches os.replace before
    it imports tfckpt, as in a fresh interpreter)."""
    tmp = tmp_path_factory.mktemp("forked")
    with Forker("numpy", tmp_dir=tmp, env=dict(os.environ)) as forker:
        yield forker


@pytest.mark.parametrize("existing", [False, True], ids=["fresh", "overwrite"])
def test_sigkill_at_every_step_of_the_commit(forker, tmp_path, existing):
    """Kill before each rename of the commit: the old checkpoint or nothing, never a mix."""
    src = str(tmp_path / "src" / "model")
    with tfckpt.BundleWriter(src) as w:
        for i in range(N_TENSORS):
            w.add(f"layer_{i:02d}/kernel", (np.arange(64, dtype=np.float32) + i) / ELEMENTS)
        w.add("step", np.int64(5))
    dst = str(tmp_path / "out" / "model")
    steps = 0
    states = []
    for kill_at in range(1, 12):
        if existing:
            tfckpt.transform(src, dst, overwrite=True, max_shard_bytes=8 << 10)  # 2+ shards
            before = _hash_files(dst)
        env = dict(os.environ, KILL_AT=str(kill_at))
        args = ["convert", src, dst, "--dtype", "float16", "--overwrite", "--max-shard-bytes"]
        proc = forker.run(KILL_AT_RENAME, *args, "8K", env=env)
        if proc.returncode == 0:
            break  # past the last rename: the run completed
        assert proc.returncode == -signal.SIGKILL
        steps += 1
        state = _checkpoint_state_small(dst)
        states.append(state)
        if state == "new":
            continue  # killed after the index rename (e.g. at the state file): committed
        if existing:
            assert state == "old", f"killed at rename {kill_at}: {state}"
            assert {f: h for f, h in _hash_files(dst).items() if f in before} == before
        else:
            assert state == "absent", f"killed at rename {kill_at}: {state}"
    # The old checkpoint (or nothing) until one rename, the new one from then on.
    first_new = states.index("new") if "new" in states else len(states)
    assert first_new >= 2 and all(s == "new" for s in states[first_new:]), states
    assert _checkpoint_state_small(dst) == "new"


def _checkpoint_state_small(prefix: str) -> str:
    bad = _verified(prefix)
    if bad:
        return bad
    with tfckpt.open(prefix) as ckpt:
        return {"float32": "old", "float16": "new"}.get(ckpt.info("layer_00/kernel").dtype, "?")


def _limited(limit: int):
    def preexec():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


@pytest.mark.parametrize("existing", [False, True], ids=["fresh", "overwrite"])
def test_disk_full(source, tmp_path, existing):
    dst = str(tmp_path / "out" / "model")
    if existing:
        tfckpt.transform(source, dst, include=["^step$"])
        before = _hash_files(dst)
    proc = subprocess.run(
        _convert_cmd(source, dst),
        capture_output=True,
        text=True,
        preexec_fn=_limited(8 << 20),
        timeout=300,
    )
    assert_cli_error(proc, "write")
    assert _leftovers(os.path.dirname(dst)) == []
    if existing:
        assert _hash_files(dst) == before
    else:
        assert not os.path.exists(dst + ".index")


def test_library_write_error_is_a_checkpoint_error(tmp_path):
    """The same through the library, in a child with a small file size limit."""
    code = (
        "import numpy as np, tfckpt, sys\n"
        "try:\n"
        f"    tfckpt.save({{'x': np.zeros(4 << 20, np.float32)}}, {str(tmp_path / 'm')!r})\n"
        "except tfckpt.CheckpointWriteError as e:\n"
        "    print('CheckpointWriteError', e); sys.exit(0)\n"
        "sys.exit(1)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        preexec_fn=_limited(1 << 20),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert os.listdir(tmp_path) == []


COMMANDS = [
    ["dump", "{src}"],
    ["dump", "{src}", "--json"],
    ["dump", "{src}", "--tensor", "step"],
    ["diff", "{src}", "{other}"],
    ["stats", "{src}"],
    ["verify", "{src}"],
    ["convert", "{src}", "{out}/c", "--dtype", "bfloat16"],
    ["rename", "{src}", "{out}/r", "--map", "layer_=block_"],
    ["select", "{src}", "{out}/s", "--exclude", "^step$"],
    ["merge", "{src}", "{other}", "-o", "{out}/m", "--prefer", "first"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_sources_are_never_modified(tmp_path, args):
    src = str(tmp_path / "a" / "model")
    other = str(tmp_path / "b" / "model")
    tfckpt.save(
        {
            "layer_00/kernel": np.ones((4, 4), np.float32),
            "step": np.int64(1),
            "words": np.array([b"x", b"yz"], dtype=object),
        },
        src,
    )
    tfckpt.save({"layer_00/kernel": np.zeros((4, 4), np.float32)}, other)
    before = {**_hash_files(src), **{"b/" + k: v for k, v in _hash_files(other).items()}}
    mtimes = {
        f: os.stat(os.path.join(tmp_path / "a", f)).st_mtime_ns for f in os.listdir(tmp_path / "a")
    }
    cmd = [a.format(src=src, other=other, out=tmp_path / "out") for a in args]
    proc = run_process(*cmd, text=True)
    assert proc.returncode == (1 if args[0] == "diff" else 0), proc.stderr  # they did run
    after = {**_hash_files(src), **{"b/" + k: v for k, v in _hash_files(other).items()}}
    assert after == before
    assert {
        f: os.stat(os.path.join(tmp_path / "a", f)).st_mtime_ns for f in os.listdir(tmp_path / "a")
    } == mtimes


def test_destination_may_not_be_a_source(tmp_path):
    src = str(tmp_path / "model")
    tfckpt.save({"a": np.ones(3, np.float32)}, src)
    before = _hash_files(src)
    for dst in (src, str(tmp_path) + os.sep, str(tmp_path)):
        with pytest.raises(tfckpt.CheckpointError):
            tfckpt.convert(src, dst, "float16", overwrite=True)
    assert _hash_files(src) == before


@pytest.mark.parametrize(
    "name",
    [
        "../../escape",
        "/absolute/looking",
        "a/../../b",
        "..",
        "nul\x00inside",
        "x" * 10_000,
        "dir/" * 200 + "deep",
        "data-00000-of-00001",
        "../model.index",
    ],
)
def test_names_are_never_paths(tmp_path, name):
    out = tmp_path / "inner" / "model"
    value = np.arange(6, dtype=np.float32)
    tfckpt.save({name: value, "plain": value}, str(out))
    converted = tmp_path / "inner" / "conv"
    tfckpt.convert(str(out), str(converted), "float16")
    # Only the checkpoint's own files, all inside the destination directory.
    assert sorted(os.listdir(tmp_path)) == ["inner"]
    # (No state file: the directory holds the source, whose state it would be.)
    assert sorted(os.listdir(tmp_path / "inner")) == sorted(
        ["model.index", "model.data-00000-of-00001", "conv.index", "conv.data-00000-of-00001"]
    )
    with tfckpt.open(str(converted)) as ckpt:
        assert name in ckpt.keys()
        assert ckpt[name].tobytes() == value.astype(np.float16).tobytes()


def test_names_are_never_paths_for_tensorflow(tmp_path):
    """TensorFlow reads those names back from what tfckpt wrote, too."""
    tf = pytest.importorskip("tensorflow")
    names = ["../../escape", "nul\x00inside", "x" * 10_000]
    prefix = str(tmp_path / "model")
    tfckpt.save({n: np.full(2, i, np.int32) for i, n in enumerate(names)}, prefix)
    reader = tf.train.load_checkpoint(prefix)
    for i, n in enumerate(names):
        assert reader.get_tensor(n).tolist() == [i, i]
