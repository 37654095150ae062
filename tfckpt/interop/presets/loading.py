"""A ``config.json`` loaded by transformers itself: the proof that a model directory's
config is one transformers takes.

:func:`load_config` runs the installed transformers in a process of its own (its imports,
logging and threads stay out of this one; a config that makes it hang or crash cannot
take this process with it): ``AutoConfig.from_pretrained`` on a directory holding the
file, the config class's own ``validate()``, then, where PyTorch is installed, the
architecture the config names built on PyTorch's ``meta`` device (no memory for weights),
which is where a model refuses what its config class let through (a hidden size the
heads do not divide). Remote code is never run, nothing is downloaded. The answer for the
same bytes is kept for the rest of the process.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass

from tfckpt.errors import CheckpointError
from tfckpt.interop.presets.family import MAX_CONFIG_BYTES, Refused, read_json
from tfckpt.io.storage import Storage

TIMEOUT_S = 600  # transformers and PyTorch import in seconds; a loaded machine, in minutes

# Run as ``python -c`` in a directory holding config.json; writes result.json there.
_LOADER = """
import json, sys
def answer(**result):
    with open("result.json", "w") as f:
        json.dump(result, f)
    sys.exit(0)
try:
    import transformers
except ImportError:
    answer(absent="transformers")
def refused(stage, e):
    text = " ".join(f"{type(e).__name__}: {e}".split())
    answer(refused=text if len(text) <= 300 else text[:297] + "...", stage=stage)
try:
    config = transformers.AutoConfig.from_pretrained(
        ".", local_files_only=True, trust_remote_code=False
    )
    if hasattr(config, "validate"):
        config.validate()
except Exception as e:
    refused("config", e)
version = transformers.__version__
found = dict(version=version, config=type(config).__name__)
names = getattr(config, "architectures", None) or []
if len(names) != 1 or not isinstance(names[0], str):
    answer(refused=f"architectures is {names!r}: it names no one class", stage="model", **found)
try:
    import torch
except ImportError:
    answer(**found)
model = getattr(transformers, names[0], None)
if not isinstance(model, type):
    answer(refused=f"transformers {version} has no class {names[0]}", stage="model", **found)
try:
    with torch.device("meta"):
        model(config)
except Exception as e:
    refused("model", e)
answer(built=names[0], **found)
"""


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
_LOCK = threading.Lock()


def load_config(data: bytes, path: str, made_of: bool = False) -> Loaded:
    """``data`` (a config.json's bytes) as transformers loads it; a
    :class:`~tfckpt.CheckpointError` naming ``path`` when transformers refuses it
    (``made_of``: ``path`` is the release's config that ``data`` was made of)."""
    key = hashlib.sha256(data).digest()
    with _LOCK:
        known = _ANSWERS.get(key)
    if known is not None:
        return known
    with tempfile.TemporaryDirectory(prefix="tfckpt-config-") as tmp:
        with open(os.path.join(tmp, "config.json"), "wb") as f:
            f.write(data)
        env = dict(
            os.environ,
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            TRANSFORMERS_VERBOSITY="error",
            TF_CPP_MIN_LOG_LEVEL="3",
        )
        try:
            done = subprocess.run(
                [sys.executable, "-c", _LOADER],
                cwd=tmp,  # the directory loaded; nothing of the caller's on sys.path
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise CheckpointError(
                f"transformers did not load the config within {TIMEOUT_S} s", path=path
            ) from None
        except OSError as e:
            raise CheckpointError(f"cannot run transformers: {e.strerror}", path=path) from None
        try:
            with open(os.path.join(tmp, "result.json"), "rb") as f:
                result = json.loads(f.read())
        except (OSError, ValueError):
            last = (done.stderr.decode("utf-8", "replace").strip().splitlines() or ["no output"])[
                -1
            ]
            raise CheckpointError(
                f"transformers stopped while loading the config (exit {done.returncode}): "
                f"{last[:300]}",
                path=path,
            ) from None
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
