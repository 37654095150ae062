"""The one exception family tfckpt raises for anything wrong with a checkpoint, and
:func:`option`, how its messages name an option: as an argument from Python, as a flag on
the command line."""

from __future__ import annotations

import os
import re
import sys

# Private-use characters around an option's two spellings in a message (never in a name
# tfckpt writes into one: those reach messages through repr or as paths).
_OPEN, _BETWEEN, _CLOSE = "\ue000", "\ue001", "\ue002"
_OPTION = re.compile(f"{_OPEN}([^{_BETWEEN}]*){_BETWEEN}([^{_CLOSE}]*){_CLOSE}")


def option(python: str, flag: str) -> str:
    """An option named in an error message, spelt both ways: ``python`` as the library
    takes it (``"overwrite=True"``), ``flag`` as the command line does
    (``"--overwrite"``). ``str(error)`` shows the first, the command line the second
    (:attr:`CheckpointError.cli_message`).

    >>> str(CheckpointError(f"it exists (use {option('overwrite=True', '--overwrite')})"))
    'it exists (use overwrite=True)'
    """
    return f"{_OPEN}{python}{_BETWEEN}{flag}{_CLOSE}"


def flag(name: str) -> str:
    """:func:`option` for an option whose argument is its flag's name in snake case:
    ``flag("in-place")`` reads ``in_place`` from Python, ``--in-place`` on the command
    line."""
    return option(name.replace("-", "_"), f"--{name}")


SUGGEST_AMONG = 200_000  # names searched for the nearest: an error stays quick


def did_you_mean(word: str, candidates) -> str:
    """``"; did you mean 'X'?"`` for the candidate nearest ``word`` (difflib's measure);
    ``""`` when none is near, or when there are too many to search quickly."""
    import difflib

    names = [c for c in candidates if isinstance(c, str)]
    if not isinstance(word, str) or not names or len(names) > SUGGEST_AMONG:
        return ""
    found = difflib.get_close_matches(word, names, n=1, cutoff=0.75)
    return f"; did you mean {found[0]!r}?" if found else ""


def install_hint(extra: str) -> str:
    """The command that installs tfckpt's optional dependencies ``extra`` (``"report"``,
    ``"tf"``...) where the user is, for an error to quote:

    - tfckpt run from a source checkout (the directory above this package holds a
      pyproject.toml naming the project tfckpt: an editable install, or the checkout on
      ``PYTHONPATH``): ``pip install -e 'CHECKOUT[extra]'``;
    - installed from a checkout's directory (its distribution's ``direct_url.json``,
      PEP 610, names that directory): ``pip install 'CHECKOUT[extra]'``;
    - otherwise (a release): ``pip install 'tfckpt[extra]'``.

    CHECKOUT is ``.`` where it is the current directory.

    >>> install_hint("report").startswith("pip install ")
    True
    """
    import shlex

    found = _checkout()
    if found is None:
        return f"pip install 'tfckpt[{extra}]'"
    root, editable = found
    try:
        here = "." if os.path.samefile(root, os.getcwd()) else str(root)
    except OSError:  # the current directory is gone
        here = str(root)
    return "pip install " + ("-e " if editable else "") + shlex.quote(f"{here}[{extra}]")


def _checkout() -> tuple[str, bool] | None:
    """The source checkout tfckpt runs from or was installed from, and whether it runs
    from it (editable); None for a release."""
    package = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(package)
    if _names_tfckpt(root):
        return root, True
    import json
    from importlib import metadata
    from urllib.parse import urlparse
    from urllib.request import url2pathname

    try:
        dist = metadata.distribution("tfckpt")
        text = dist.read_text("direct_url.json")
        installed = os.path.abspath(str(dist.locate_file("tfckpt/errors.py")))
    except (metadata.PackageNotFoundError, OSError):
        return None
    if not text or installed != os.path.abspath(__file__):
        return None  # not this copy's record
    try:
        record = json.loads(text)
        url, info = record["url"], record.get("dir_info")
    except (ValueError, TypeError, KeyError):
        return None
    if not isinstance(info, dict) or not url.startswith("file://"):
        return None  # a wheel, an archive or a VCS URL: installed as a release is
    source = url2pathname(urlparse(url).path)
    if not _names_tfckpt(source):
        return None
    return source, bool(info.get("editable"))


def _names_tfckpt(directory: str) -> bool:
    """Whether ``directory`` holds a pyproject.toml of the project tfckpt."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # the same parser, before it joined the standard library
        import tomli as tomllib
    try:
        with open(os.path.join(directory, "pyproject.toml"), "rb") as f:
            project = tomllib.load(f).get("project")
    except (OSError, ValueError):
        return False
    return isinstance(project, dict) and project.get("name") == "tfckpt"


def spelt(text: str, *, cli: bool = False) -> str:
    """``text`` with each :func:`option` in it spelt for Python, or for the command line."""
    return _OPTION.sub(lambda m: m[2 if cli else 1], text)


class CheckpointError(Exception):
    """Base of every error tfckpt raises about a checkpoint.

    ``path`` is the file involved and ``tensor`` the tensor name, when known;
    both are also part of the message.

    >>> try:
    ...     tfckpt.open("train/model.ckpt-7")["no/such/tensor"]
    ... except tfckpt.CheckpointError as e:
    ...     print(e.path, e.tensor, e.detail)
    """

    def __init__(self, message: str, *, path: str | None = None, tensor: str | None = None):
        self.path = path
        self.tensor = tensor
        self.detail = spelt(message)
        parts = []
        if path is not None:
            parts.append(str(path))
        if tensor is not None:
            parts.append(f"tensor {tensor!r}")
        self.message = ": ".join(parts + [self.detail])
        # The options the message names (see option()) as the command line spells them.
        self.cli_message = ": ".join(parts + [spelt(message, cli=True)])
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


class CheckpointNotFoundError(CheckpointError):
    """No checkpoint, or no such tensor, where one was asked for.

    >>> tfckpt.open("empty-dir")
    Traceback (most recent call last):
    tfckpt.errors.CheckpointNotFoundError: empty-dir: no checkpoint in directory; ...
    """


class TensorNotFoundError(CheckpointNotFoundError, KeyError):
    """The checkpoint has no tensor of that name (also a ``KeyError``, as in a mapping).

    >>> ckpt["dense/kernl"]
    Traceback (most recent call last):
    tfckpt.errors.TensorNotFoundError: train/model.ckpt-7: tensor 'dense/kernl': no such
    tensor in the checkpoint
    """


class CorruptCheckpointError(CheckpointError):
    """The bytes on disk are not a valid checkpoint: checksum, truncation, malformed entry.

    >>> ckpt["dense/kernel"]  # its bytes changed on disk since it was written
    Traceback (most recent call last):
    tfckpt.errors.CorruptCheckpointError: train/model.ckpt-7.data-00000-of-00001: tensor
    'dense/kernel': checksum mismatch: stored 0xe0717c79, computed 0xa94d015e ...
    """


class UnsupportedCheckpointError(CheckpointError):
    """Valid content that tfckpt cannot represent in the form asked for.

    >>> tfckpt.open("from-a-newer-tensorflow/model")  # a bundle version it cannot read
    Traceback (most recent call last):
    tfckpt.errors.UnsupportedCheckpointError: from-a-newer-tensorflow/model.index: bundle
    format version producer=2 min_consumer=3 ... cannot be read by a version 1 reader
    """


class UnknownDTypeError(CheckpointError, ValueError):
    """A dtype name tfckpt does not know (also a ``ValueError``, as numpy's would be); the
    message suggests the nearest known name.

    >>> tfckpt.convert("train/", "fp16/", "flaot16")
    Traceback (most recent call last):
    tfckpt.errors.UnknownDTypeError: unknown dtype 'flaot16'; did you mean 'float16'?
    """


class CheckpointWriteError(CheckpointError):
    """Writing a checkpoint failed; nothing was left at the destination.

    >>> tfckpt.convert("train/", "/read-only/fp16", "float16")
    Traceback (most recent call last):
    tfckpt.errors.CheckpointWriteError: /read-only/fp16: cannot create directory: Permission
    denied
    """


_LISTED = 50  # tensors an overflow message names
OVERFLOW_ARGS = "overflow='clip' or 'inf'"
PREFER_ARGS = "prefer='first' or 'last'"


class CastOverflowError(CheckpointError):
    """A cast met values beyond the target dtype's range with ``overflow='error'``.

    ``counts`` maps each affected output tensor to its number of such values;
    nothing was written.

    >>> try:
    ...     tfckpt.convert("train/", "fp16/", "float16", overflow="error")
    ... except tfckpt.CastOverflowError as e:
    ...     print(e.counts)  # {'dense/bias': 2}
    """

    def __init__(self, counts: dict[str, int], dst: str):
        self.counts = counts
        # The first few by name: the message is one line, whatever the number of tensors.
        shown = sorted(counts.items())[:_LISTED]
        listed = ", ".join(f"{n} ({c} values)" for n, c in shown)
        if len(counts) > len(shown):
            listed += f" and {len(counts) - len(shown)} more"
        super().__init__(
            f"values beyond the target dtype's range in {len(counts)} tensor(s), "
            f"nothing written (use {option(OVERFLOW_ARGS, '--overflow clip|inf')}): {listed}",
            path=dst,
        )


class CheckpointPathWarning(UserWarning):
    """A path was found other than where it was written: a state file naming checkpoints
    by paths of another machine or directory, taken from beside the state file instead.

    >>> warnings.simplefilter("error", tfckpt.CheckpointPathWarning)  # refuse such guesses
    """


class KerasWeightsError(CheckpointError):
    """A Keras model's weights and a checkpoint do not match (missing or misshapen);
    nothing was assigned. ``report`` is the :class:`tfckpt.keras.LoadReport` so far."""

    def __init__(self, message: str, *, report, path: str | None = None):
        self.report = report
        super().__init__(message, path=path)
