"""A ``config.json`` loaded by transformers itself: the proof that a model directory's
config is one transformers takes.

:func:`load_config` asks the installed transformers, in a process of its own (its imports,
logging and threads stay out of this one; a config that makes it hang or crash cannot
take this process with it), what it makes of a config: the class ``AutoConfig`` picks for
its ``model_type``, made from the JSON as ``AutoConfig.from_pretrained`` makes it
(``from_dict``), the config class's own ``validate()``, then, where PyTorch is installed,
the architecture the config names built on PyTorch's ``meta`` device (no memory for
weights), which is where a model refuses what its config class let through (a hidden
size the heads do not divide). Remote code is never run, nothing is downloaded.

The process is started on the first question and answers every later one (one line of
JSON each way), so transformers and PyTorch are imported once a run, however many
configs it checks; the answer for the same bytes is kept for the rest of the process.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import queue
import subprocess
import sys
import threading
from dataclasses import dataclass

from tfckpt.errors import CheckpointError
from tfckpt.interop.presets.family import MAX_CONFIG_BYTES, Refused, read_json
from tfckpt.io.storage import Storage

TIMEOUT_S = 600  # transformers and PyTorch import in seconds; a loaded machine, in minutes

# Run as ``python -c``: one question a line on stdin (a config's JSON text), one answer a
# line of JSON on its stdout; whatever transformers prints goes to stderr.
_WORKER = """
import json, os, sys
del sys.path[0]  # the working directory: nothing of the caller's is imported
answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
os.dup2(2, 1)
sys.stdout = sys.stderr
def answer(**result):
    answers.write(json.dumps(result) + "\\n")
    answers.flush()
try:
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
except ImportError:
    transformers = None
try:
    import torch
except ImportError:
    torch = None
def refused(stage, e, **found):
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return dict(refused=text if len(text) <= 300 else text[:297] + "...", stage=stage, **found)
def judge(text):
    try:
        data = json.loads(text)
        kind = data.get("model_type") if isinstance(data, dict) else None
        if kind not in CONFIG_MAPPING:
            raise ValueError(f"no config class for model_type {kind!r}")
        config = CONFIG_MAPPING[kind].from_dict(data)
        if hasattr(config, "validate"):
            config.validate()
    except Exception as e:
        return refused("config", e)
    version = transformers.__version__
    found = dict(version=version, config=type(config).__name__)
    names = getattr(config, "architectures", None) or []
    if len(names) != 1 or not isinstance(names[0], str):
        why = f"architectures is {names!r}: it names no one class"
        return dict(refused=why, stage="model", **found)
    if torch is None:
        return found
    model = getattr(transformers, names[0], None)
    if not isinstance(model, type):
        why = f"transformers {version} has no class {names[0]}"
        return dict(refused=why, stage="model", **found)
    try:
        with torch.device("meta"):
            model(config)
    except Exception as e:
        return refused("model", e, **found)
    return dict(built=names[0], **found)
for line in sys.stdin:
    answer(**(judge(line) if transformers is not None else dict(absent="transformers")))
"""


class _Worker:
    """The process running :data:`_WORKER`, and the threads reading its two pipes."""

    def __init__(self):
        env = dict(
            os.environ,
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            TRANSFORMERS_VERBOSITY="error",
            TF_CPP_MIN_LOG_LEVEL="3",
            PYTHONIOENCODING="utf-8",
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            errors="replace",
        )
        self.answers: queue.Queue[str | None] = queue.Queue()
        self.printed: collections.deque[str] = collections.deque(maxlen=20)
        for stream, take in ((self.proc.stdout, self.answers.put), (self.proc.stderr, None)):
            threading.Thread(target=self._read, args=(stream, take), daemon=True).start()

    def _read(self, stream, take) -> None:
        for line in stream:
            if take is not None:
                take(line)
            else:
                self.printed.append(line.strip())
        if take is not None:
            take(None)  # the process has ended

    def ask(self, text: str, path: str) -> dict:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(text + "\n")
            self.proc.stdin.flush()
        except OSError:
            return self._stopped(path)
        try:
            line = self.answers.get(timeout=TIMEOUT_S)
        except queue.Empty:
            self.stop()
            raise CheckpointError(
                f"transformers did not load the config within {TIMEOUT_S} s", path=path
            ) from None
        if line is None:
            return self._stopped(path)
        return json.loads(line)

    def _stopped(self, path: str) -> dict:
        self.stop()
        last = next((x for x in reversed(self.printed) if x), "no output")
        raise CheckpointError(
            f"transformers stopped while loading the config (exit {self.proc.returncode}): "
            f"{last[:300]}",
            path=path,
        )

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@dataclass(frozen=True)
class Loaded:
    """What transformers made of a config: its version, the config class, the model
    class built (None without PyTorch); or ``absent``: transformers is not installed."""

    version: str = ""
    config: str = ""
    built: str | None = None
    absent: bool = False

    def note(self) -> str:
        """The line an export's summary says about it."""
        if self.absent:
            return "config.json not loaded: transformers is not installed"
        built = (
            f" and builds {self.built}"
            if self.built
            else " (no model built: PyTorch is not installed)"
        )
        return f"config.json: transformers {self.version} loads it as {self.config}{built}"


_ANSWERS: dict[bytes, Loaded] = {}  # by the config's SHA-256
_LOCK = threading.Lock()  # one question at a time to the one worker
_WORKERS: list[_Worker] = []  # the running worker, once started


def load_config(data: bytes, path: str, made_of: bool = False) -> Loaded:
    """``data`` (a config.json's bytes) as transformers loads it; a
    :class:`~tfckpt.CheckpointError` naming ``path`` when transformers refuses it
    (``made_of``: ``path`` is the release's config that ``data`` was made of)."""
    key = hashlib.sha256(data).digest()
    with _LOCK:
        known = _ANSWERS.get(key)
        if known is not None:
            return known
        try:  # one line: the JSON text again, without its line breaks
            text = json.dumps(json.loads(data.decode("utf-8")), allow_nan=False)
        except (ValueError, RecursionError) as e:
            raise CheckpointError(
                f"the config is no JSON transformers reads: {e}", path=path
            ) from None
        if not _WORKERS or _WORKERS[0].proc.poll() is not None:
            try:
                _WORKERS[:] = [_Worker()]
            except OSError as e:
                raise CheckpointError(f"cannot run transformers: {e.strerror}", path=path) from None
        try:
            result = _WORKERS[0].ask(text, path)
        except CheckpointError:
            _WORKERS.clear()
            raise
    if "refused" in result:
        what = "the config.json made of it" if made_of else "the config"
        if result["stage"] == "model":
            what = f"the model of {what}"
        raise CheckpointError(f"transformers refuses {what}: {result['refused']}", path=path)
    loaded = (
        Loaded(absent=True)
        if "absent" in result
        else Loaded(result["version"], result["config"], result.get("built"))
    )
    with _LOCK:
        _ANSWERS[key] = loaded
    return loaded


def verify_config(store: Storage, directory: str) -> Loaded:
    """The ``config.json`` of model directory ``directory`` (on ``store``) read back and
    loaded by transformers (:func:`load_config`); an error naming it when it cannot be
    read, is not a config JSON object, or transformers refuses it."""
    path = store.join(directory, "config.json")
    try:
        data = store.read_bytes(path)
    except OSError as e:
        raise CheckpointError(f"cannot read the config: {e.strerror}", path=path) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise CheckpointError(f"larger than {MAX_CONFIG_BYTES >> 20} MiB", path=path)
    try:
        read_json(data)
    except Refused as e:
        raise CheckpointError(f"the config holds what JSON does not: {e}", path=path) from None
    except ValueError as e:
        raise CheckpointError(f"the config cannot be read: {e}", path=path) from None
    return load_config(data, path)
