"""Stopping a run part-way: Ctrl-C, a raising progress callback.

Every tensor here is exactly two read chunks long, the shape in which a reader
thread still holding a chunk for a consumer that has gone away would wait for
ever. Each run must end promptly, with its exception (exit status 130 and one
line on stderr for Ctrl-C), every pipeline thread gone and no temporaries left.
The time bounds are hang detectors, not speed claims.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import tfckpt
from tfckpt import inspection as tfinspect

CHUNK = 1 << 20  # --chunk-bytes: the engine reads an eighth of it at a time
ELEMENTS = 2 * (CHUNK // 8) // 4  # float32: two read chunks per tensor
N_TENSORS = 96
HANG = 30  # seconds after which a run that has not ended counts as hung


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """Written by TensorFlow: float32 tensors of two chunks each, and a step counter."""
    tf = pytest.importorskip("tensorflow")
    prefix = str(tmp_path_factory.mktemp("interrupts") / "src" / "model")
    os.makedirs(os.path.dirname(prefix))
    names = [f"layer_{i:03d}/kernel" for i in range(N_TENSORS)] + ["step"]
    values = [
        tf.constant((np.arange(ELEMENTS, dtype=np.float32) + i) / ELEMENTS)
        for i in range(N_TENSORS)
    ] + [tf.constant(np.int64(5))]
    tf.raw_ops.SaveV2(
        prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names), tensors=values
    )
    return prefix


def _leftovers(directory) -> list[str]:
    if not os.path.isdir(directory):
        return []
    return sorted(f for f in os.listdir(directory) if ".tfckpt-tmp-" in f)


def _absent_or_complete(prefix: str) -> str:
    if not os.path.exists(prefix + ".index"):
        return "absent"
    report = tfinspect.verify(prefix)
    if report["problems"]:
        return "broken: " + report["problems"][0]
    with tfckpt.open(prefix) as ckpt:
        if len(ckpt) != N_TENSORS + 1 or ckpt.info("layer_000/kernel").dtype != "float16":
            return "broken: not the converted checkpoint"
    return "complete"


def _run_in_thread(fn):
    """Run ``fn`` in a thread; its exception, or a failure when it hangs."""
    outcome: dict = {}

    def target():
        try:
            fn()
        except BaseException as e:
            outcome["error"] = e

    runner = threading.Thread(target=target, daemon=True)
    runner.start()
    runner.join(HANG)
    assert not runner.is_alive(), "the run hung"
    return outcome.get("error")


class Stop(Exception):
    pass


@pytest.mark.parametrize("executor", [None, "threads"])
def test_raising_progress_callback_stops_every_thread(source, tmp_path, executor):
    """The callback raises at its k-th call, for many k: the error propagates, nothing is left."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(2) if executor else None
    try:
        calls_per_run = 2 * N_TENSORS if pool is None else 4  # per chunk / per shard task
        for k in range(1, min(calls_per_run, 12) + 1):
            dst = tmp_path / f"out{k}" / "model"
            calls = [0]

            def progress(nbytes):
                calls[0] += 1
                if calls[0] == k:
                    time.sleep(0.02)  # lets the reader thread get a chunk ahead
                    raise Stop(k)

            before = set(threading.enumerate())
            error = _run_in_thread(
                lambda: tfckpt.convert(
                    source,
                    dst,
                    "float16",
                    chunk_bytes=CHUNK,
                    progress=progress,
                    executor=pool,
                    max_shard_bytes=None if pool is None else N_TENSORS * ELEMENTS // 2,
                )
            )
            assert isinstance(error, Stop) and error.args == (k,), repr(error)
            left = [
                t
                for t in threading.enumerate()
                if t not in before and not t.name.startswith("ThreadPoolExecutor")
            ]
            assert left == [], f"threads still alive after call {k}: {left}"
            assert _leftovers(dst.parent) == []
            assert not os.path.exists(f"{dst}.index")
    finally:
        if pool is not None:
            pool.shutdown()


# Sends SIGINT to itself from the writing loop at its n-th chunk (INTERRUPT_AT), a
# little later, so the reader thread is a chunk ahead; then runs the command line.
INTERRUPT_AT_CHUNK = """
import importlib, os, signal, sys, time
pipeline = importlib.import_module("tfckpt.rewrite.pipeline")
real_write = pipeline.WriteBehind.write
calls = [0]
def write(self, data):
    calls[0] += 1
    if calls[0] == int(os.environ["INTERRUPT_AT"]):
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)
    return real_write(self, data)
pipeline.WriteBehind.write = write
from tfckpt.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def _convert_args(source, dst, *extra):
    return [
        "convert",
        source,
        str(dst),
        "--dtype",
        "float16",
        "--chunk-bytes",
        str(CHUNK),
        "--overwrite",
        *extra,
    ]


def _check_interrupted(proc: subprocess.Popen, dst, what: str) -> str:
    try:
        _, err = proc.communicate(timeout=HANG)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"{what}: still running {HANG} s after SIGINT")
    state = _absent_or_complete(str(dst))
    if proc.returncode == 0:  # the signal came after the run had finished
        assert state == "complete", f"{what}: {state}"
    else:
        assert proc.returncode == 130, f"{what}: exit status {proc.returncode}: {err}"
        lines = err.splitlines()
        assert state in ("absent", "complete"), f"{what}: {state}"
        if state == "complete" and len(lines) == 2:
            # The signal came after the commit and its report, before the exit: the
            # output is whole and the report true; the run still says it was stopped.
            assert lines[0].startswith("wrote "), f"{what}: {err}"
            lines = lines[1:]
        assert lines == ["tfckpt: interrupted"], f"{what}: {err}"
    assert _leftovers(os.path.dirname(dst)) == [], what
    return "finished" if proc.returncode == 0 else state


@pytest.mark.parametrize(
    "extra",
    [(), ("--executor", "threads:2", "--max-shard-bytes", "8M")],
    ids=["in-process", "thread-executor"],
)
def test_sigint_at_the_nth_chunk(source, tmp_path, extra):
    dst = tmp_path / "out" / "model"
    for n in (1, 2, 3, 8, 33) if not extra else (1, 4, 33):
        proc = subprocess.Popen(
            [sys.executable, "-c", INTERRUPT_AT_CHUNK, *_convert_args(source, dst, *extra)],
            env=dict(os.environ, INTERRUPT_AT=str(n)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        state = _check_interrupted(proc, dst, f"interrupted at chunk {n}")
        assert state == "absent"


def test_sigint_at_timed_points(source, tmp_path):
    """SIGINT at many moments after the run has started writing (its temporaries appear)."""
    dst = tmp_path / "out" / "model"
    states = []
    for delay in (0, 0.005, 0.01, 0.02, 0.03, 0.045, 0.06, 0.08, 0.1, 0.15, 0.3):
        proc = subprocess.Popen(
            [sys.executable, "-m", "tfckpt", *_convert_args(source, dst)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + HANG
        while not _leftovers(dst.parent) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        states.append(_check_interrupted(proc, dst, f"SIGINT {delay} s into the run"))
    # The signal reached the run while it was writing at least once.
    assert "absent" in states, states


# The installed `tfckpt` script's own lines (`from tfckpt.__main__ import main`, exit with
# its status), after a finder that sends this process SIGINT when the program first imports
# the module named in argv[1]: a real Ctrl-C, arriving while the command line loads.
INTERRUPT_AT_IMPORT = """
import os, signal, sys

class InterruptOnImport:
    def __init__(self, name):
        self.name = name
    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.name:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, InterruptOnImport(sys.argv.pop(1)))
from tfckpt.__main__ import main
sys.exit(main())
"""


@pytest.mark.parametrize(
    "module",
    ["tfckpt.cli", "tfckpt.cli.parsers", "tfckpt.io.storage", "tfckpt.cli.commands", "numpy"],
)
def test_sigint_while_the_command_line_loads(source, tmp_path, module):
    """Ctrl-C in the program's first moments, as it imports: no traceback, exit 130."""
    dst = tmp_path / "out" / "model"
    proc = subprocess.Popen(
        [sys.executable, "-c", INTERRUPT_AT_IMPORT, module, *_convert_args(source, dst)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    _check_interrupted(proc, dst, f"SIGINT on importing {module}")
    assert proc.returncode == 130
    assert not os.path.exists(dst.parent)
