"""Running the command line as a user's terminal would, for every test of the CLI.

Commands run with a strict UTF-8 stdout and stderr: in this process (fast) with
:func:`run` or :func:`in_process`, or as their own process with :func:`run_process`.
:func:`assert_cli_error` checks a failure is the one line the CLI promises.
``python -c AT_BARRIER ARGS...`` runs a command held at its commit until a second one is there.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import locale
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import tfckpt.cli

STRICT = {"PYTHONIOENCODING": "utf-8:strict", "LC_ALL": "C.UTF-8"}
ROOT = str(Path(tfckpt.__file__).resolve().parent.parent)


def user_env(**extra: str) -> dict:
    """The environment of a command a user runs: no terminal size or colour settings from
    the caller, TensorFlow quiet, strict UTF-8 output, this checkout's tfckpt first."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    env.update(TF_CPP_MIN_LOG_LEVEL="3", TF_ENABLE_ONEDNN_OPTS="0", **STRICT)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, *filter(None, [env.get("PYTHONPATH")])])
    env.update(extra)
    return env


def run_process(
    *args, text: bool = False, env: dict | None = None, timeout: float = 120, **kwargs
) -> subprocess.CompletedProcess:
    """``python -m tfckpt ARGS`` in its own process, in :func:`user_env` unless ``env`` is
    given; output kept as bytes unless ``text``. ``kwargs`` go to ``subprocess.run``
    (``cwd``, ``preexec_fn``, ...)."""
    argv = [a if isinstance(a, bytes) else str(a) for a in args]
    return subprocess.run(
        [sys.executable, "-m", "tfckpt", *argv],
        capture_output=True,
        text=text,
        timeout=timeout,
        env=env or user_env(),
        **kwargs,
    )


def run_text(*args, **kwargs) -> subprocess.CompletedProcess:
    """:func:`run_process` with text output."""
    return run_process(*args, text=True, **kwargs)


def run(*args) -> subprocess.CompletedProcess:
    """``tfckpt.cli.main(ARGS)`` in this process, stdout and stderr strict UTF-8 streams
    (a character they cannot encode raises); argv bytes decoded as Python decodes argv."""
    argv = [os.fsdecode(a) if isinstance(a, bytes) else str(a) for a in args]
    streams = [
        io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict", newline="")
        for _ in range(2)
    ]
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


def in_process(*args) -> tuple[int, str, str]:
    """:func:`run` as exit status, stdout and stderr text."""
    proc = run(*args)
    return proc.returncode, proc.stdout.decode("utf-8"), proc.stderr.decode("utf-8")


def _text(stream) -> str:
    return stream.decode("utf-8") if isinstance(stream, bytes) else stream


def assert_cli_error(result, *fragments: str) -> str:
    """A failure as the CLI promises it: exit status 2, nothing on stdout, exactly one
    stderr line ``tfckpt: error: ...`` containing every one of ``fragments``, no
    traceback. ``result``: a CompletedProcess (text or bytes) or ``(rc, stdout, stderr)``.
    Returns the line."""
    if isinstance(result, subprocess.CompletedProcess):
        result = result.returncode, result.stdout, result.stderr
    rc, out, err = result[0], _text(result[1]), _text(result[2])
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tfckpt: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert out == "", out
    return lines[0]


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
    import tensorflow as tf

    listing = tf.train.load_checkpoint(prefix).debug_string()
    return [line.rsplit(b" (DT_", 1)[0] for line in listing.split(b"\n") if line]


# ``python -c AT_BARRIER ARGS...`` runs the command line holding the process at its first rename
# (or link) of a temporary file until a second process (``BARRIER``: a directory both share)
# has got there too; then both go on at once.
AT_BARRIER = """
import os, sys, time
barrier = os.environ["BARRIER"]
waited = []
def hold(fn):
    def call(src, dst, *a, **k):
        if not waited and ".tfckpt-tmp-" in os.fspath(src):
            waited.append(1)
            open(os.path.join(barrier, str(os.getpid())), "w").close()
            while len(os.listdir(barrier)) < 2:
                time.sleep(0.005)
        return fn(src, dst, *a, **k)
    return call
os.link, os.replace = hold(os.link), hold(os.replace)
from tfckpt.cli import main
sys.exit(main(sys.argv[1:]))
"""


def run_role(script: str, role: str, out, **env: str) -> None:
    """Run ``tests/SCRIPT`` with ``ROLE OUT`` in a process of its own (this checkout and
    the tests' helpers importable, ``env`` added); an assertion error with the end of
    its stderr when it fails."""
    tests = Path(__file__).resolve().parent
    full = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(tests.parent), str(tests)]),
        TF_CPP_MIN_LOG_LEVEL="2",
        **env,
    )
    done = subprocess.run(
        [sys.executable, str(tests / script), role, str(out)],
        env=full,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]


# The parent of :class:`Forker`'s children: it imports what they share once, then forks one
# child per job, single-threaded at each fork (it does nothing else); it tells the child's
# pid, then its exit status as subprocess does (-N: killed by signal N). The child runs the
# job's code at the top level, so that it ends as ``python -c CODE`` does: an uncaught
# exception printed by the interpreter, exit status 1; atexit handlers run, threads joined.
_FORK_SERVER = """
import base64, importlib, json, os, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print("ready", flush=True)
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.environ.clear()
        os.environ.update(job["env"])
        if job["cwd"] is not None:
            os.chdir(job["cwd"])
        for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        sys.argv = [os.fsdecode(base64.b64decode(a)) for a in job["argv"]]
        sys.path[0] = job["path0"]
        exec(compile(job["code"], "<string>", "exec"), {"__name__": "__main__"})
        sys.exit(0)
    print(pid, flush=True)
    status = os.waitpid(pid, 0)[1]
    print(os.waitstatus_to_exitcode(status), flush=True)
"""

# What an interpreter reads from its environment when it starts (or numpy when imported):
# a job whose values differ from a server's goes to another server.
_STARTUP_ENV = ("PYTHON", "LC_", "LANG", "OPENBLAS", "OMP_", "MKL_", "NUMPY")


def startup_env(env: dict) -> tuple:
    """The part of ``env`` a fresh interpreter would read before running anything."""
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(_STARTUP_ENV)))


class Forker:
    """``python -c CODE ARGS`` as a process of its own, forked from one process that
    started in ``env`` (:func:`user_env` unless given) and imported ``preload`` once:
    what a fresh interpreter would do, without its start-up, for tests that run many
    short commands. Each job's environment and working directory are its own; it must
    agree with the server's on :func:`startup_env`. Use as a context manager (or call
    :meth:`close`)."""

    def __init__(self, *preload: str, tmp_dir: str | os.PathLike, env: dict | None = None):
        self._tmp = Path(tmp_dir)
        self._tmp.mkdir(parents=True, exist_ok=True)
        self._jobs = 0
        self.env = env or user_env()
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _FORK_SERVER, *preload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(self._tmp / "server.err", "wb"),  # noqa: SIM115  (the server's)
            env=self.env,
            text=True,
        )
        ready = self._line(120)
        assert ready == "ready", (self._tmp / "server.err").read_text()

    def _line(self, timeout: float) -> str | None:
        assert self._proc.stdout is not None
        if not select.select([self._proc.stdout], [], [], timeout)[0]:
            return None
        return self._proc.stdout.readline().strip()

    def run(
        self,
        code: str,
        *args,
        env: dict | None = None,
        cwd=None,
        text: bool = True,
        timeout: float = 120,
        path0: str = "",
    ) -> subprocess.CompletedProcess:
        """``python -c CODE ARGS`` in ``env`` (:func:`user_env` unless given) and ``cwd``:
        its exit status (negative: the signal that killed it), stdout and stderr (text
        as subprocess decodes it, or bytes). Past ``timeout`` seconds it is killed and
        :class:`subprocess.TimeoutExpired` raised, as by ``subprocess.run``.
        ``path0``: ``sys.path[0]`` ('' as for ``-c``)."""
        env = env or user_env()
        assert startup_env(env) == startup_env(self.env), "another interpreter start-up"
        self._jobs += 1
        out, err = (self._tmp / f"job{self._jobs}.{s}" for s in ("out", "err"))
        argv = ["-c", *args]
        job = {
            "code": code,
            "argv": [base64.b64encode(os.fsencode(a)).decode() for a in argv],
            "env": env,
            "cwd": None if cwd is None else str(cwd),
            "stdout": str(out),
            "stderr": str(err),
            "path0": path0,
        }
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(job) + "\n")
        self._proc.stdin.flush()
        pid = self._line(60)
        assert pid, ("the fork server died", (self._tmp / "server.err").read_text())
        status = self._line(timeout)
        if status is None:
            os.kill(int(pid), signal.SIGKILL)
            self._line(60)
            raise subprocess.TimeoutExpired(argv, timeout, out.read_bytes(), err.read_bytes())
        stdout, stderr = out.read_bytes(), err.read_bytes()
        out.unlink()
        err.unlink()
        if text:  # as subprocess.run(text=True) decodes: the locale's encoding, \r\n -> \n
            encoding = locale.getpreferredencoding(False)
            stdout, stderr = (
                b.decode(encoding).replace("\r\n", "\n").replace("\r", "\n")
                for b in (stdout, stderr)
            )
        return subprocess.CompletedProcess(argv, int(status), stdout, stderr)

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            self._proc.wait(timeout=60)

    def __enter__(self) -> Forker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
