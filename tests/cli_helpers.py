"""Running the command line as a user's terminal would, for tests of what it prints.

Commands run with a strict UTF-8 stdout and stderr: in this process (fast) with
:func:`run`, or as their own process with :func:`run_process`.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys

import tensorflow as tf

import tfckpt.cli

STRICT = {"PYTHONIOENCODING": "utf-8:strict", "LC_ALL": "C.UTF-8"}


def run_process(*args) -> subprocess.CompletedProcess:
    """``python -m tfckpt ARGS`` with a strict UTF-8 stdout; output kept as bytes."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    env.update(TF_CPP_MIN_LOG_LEVEL="3", **STRICT)
    argv = [a if isinstance(a, bytes) else str(a) for a in args]
    return subprocess.run([sys.executable, "-m", "tfckpt", *argv], capture_output=True,
                          timeout=120, env=env)


def run(*args) -> subprocess.CompletedProcess:
    """``tfckpt.cli.main(ARGS)`` in this process, stdout and stderr strict UTF-8 streams
    (a character they cannot encode raises); argv bytes decoded as Python decodes argv."""
    argv = [os.fsdecode(a) if isinstance(a, bytes) else str(a) for a in args]
    streams = [io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict", newline="")
               for _ in range(2)]
    saved = os.environ.pop("COLUMNS", None)
    try:
        with contextlib.redirect_stdout(streams[0]), contextlib.redirect_stderr(streams[1]):
            try:
                rc = tfckpt.cli.main(argv)
            except SystemExit as e:  # argparse
                rc = e.code
    finally:
        if saved is not None:
            os.environ["COLUMNS"] = saved
    out, err = (s.flush() or s.buffer.getvalue() for s in streams)
    return subprocess.CompletedProcess(argv, rc, out, err)


def assert_terminal_safe(proc: subprocess.CompletedProcess, what) -> None:
    """No traceback; stdout and stderr valid UTF-8 whose every line is printable text."""
    for stream in (proc.stdout, proc.stderr):
        text = stream.decode("utf-8")  # strict: no stray bytes
        assert "Traceback" not in text, (what, text)
        for line in text.split("\n"):
            assert line.isprintable(), (what, line)


def bytes_name(name: str) -> bytes:
    return name.encode("utf-8", errors="surrogateescape")


def tf_keys(prefix: str) -> list[bytes]:
    """Index keys as TensorFlow's own reader lists them (bytes): whole tensors, and for a
    partitioned tensor its slices' keys instead of its name."""
    listing = tf.train.load_checkpoint(prefix).debug_string()
    return [line.rsplit(b" (DT_", 1)[0] for line in listing.split(b"\n") if line]


