"""A SavedModel in, a SavedModel out.

When the one source of a rewrite is given as a SavedModel directory (``saved_model.pb``
or ``.pbtxt`` beside ``variables/variables``) and the destination is a directory (a path
ending in ``/``, or one that exists), the output is a SavedModel: every file of the
source but its variables copied as it is (the graph, ``assets/``, ``assets.extra/``,
``keras_metadata.pb``...), ``variables/variables`` the rewritten checkpoint. The
directory is written whole under a temporary name and renamed into place
(:class:`~tfckpt.io.commit.DirectoryCommit`). ``fingerprint.pb`` is left out: it holds a
hash of the source's variables, which the output's are not, and TensorFlow loads a
SavedModel without one (as it loads those written before fingerprints existed).

The graph restores each variable with the dtype and shape it was saved with: a rewrite
that would change one (a cast, a reshape, a resize), leave one out (a select, a delete,
a dropped object), rename one where the graph restores by name (a TF1 SavedModel's
Saver), or drop the object graph (``--as-tf1``) is refused before anything is written,
listing what would not match. ``checkpoint_only`` (``--checkpoint-only``), or a
checkpoint prefix as the destination, writes the variables alone, as a checkpoint, as
any other source's.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from tfckpt.checkpoint.reader import Checkpoint
from tfckpt.errors import CheckpointError, option
from tfckpt.format.objectgraph import OBJECT_GRAPH_KEY
from tfckpt.io.directories import copy_file
from tfckpt.io.storage import Storage, normalize
from tfckpt.io.temporaries import TMP_MARK
from tfckpt.rewrite.options import Options
from tfckpt.rewrite.plans import Plan, Source

GRAPH_FILES = ("saved_model.pb", "saved_model.pbtxt")
VARIABLES = "variables"  # the directory of the variables, and their prefix's name in it
FINGERPRINT = "fingerprint.pb"
# What TensorFlow and Keras write in a SavedModel directory: what --overwrite may replace.
SAVED_MODEL_NAMES = (*GRAPH_FILES, VARIABLES, "assets", "assets.extra", FINGERPRINT)
KERAS_METADATA = "keras_metadata.pb"
_DEPTH = 32  # directory levels copied (a link cycle ends there)
SHOWN = 5  # mismatches, files named in a message


@dataclass
class SavedModelOutput:
    """Where a SavedModel output comes from and goes: the source directory (on
    ``store``), the output directory, the files copied (relative paths, ``/``-separated,
    directories ending in ``/``) and those left out."""

    source: str
    store: Storage = field(repr=False, compare=False)
    directory: str
    copied: list[str]
    left_out: list[str]
    replaces: bool  # a SavedModel there is replaced (overwrite)

    def variables_prefix(self, out: Storage, directory: str | None = None) -> str:
        """The variables' prefix in ``directory`` (by default the output's)."""
        return out.join(self.directory if directory is None else directory, VARIABLES, VARIABLES)

    def copy_into(self, out: Storage, directory: str) -> int:
        """Copy the files to ``directory`` on ``out`` (the stage); the bytes copied."""
        total = 0
        for rel in self.copied:
            parts = rel.rstrip("/").split("/")
            dst = out.join(directory, *parts)
            if rel.endswith("/"):
                out.makedirs(dst)
                continue
            out.makedirs(out.dirname(dst))
            total += copy_file(self.store, self.store.join(self.source, *parts), out, dst)
        return total

    def to_dict(self) -> dict:
        return {
            "source": self.source,
            "directory": self.directory,
            "copied": self.copied,
            "left_out": self.left_out,
            "replaces": self.replaces,
        }

    def described(self) -> str:
        """What is copied, in a few words: ``saved_model.pb, assets/ (1 file)``."""
        top: dict[str, int] = {}
        for rel in self.copied:
            head, sep, rest = rel.partition("/")
            name = head + sep
            top[name] = top.get(name, 0) + (1 if sep and rest and not rest.endswith("/") else 0)
        words = [
            (f"{name} ({n} file{'s' if n != 1 else ''})" if n else f"{name} (empty)")
            if name.endswith("/")
            else name
            for name, n in top.items()
        ]
        return ", ".join(words)


def saved_model_directory(src, ckpt: Checkpoint) -> str | None:
    """The SavedModel directory the source path ``src`` names, when it names one (the
    directory itself, not its variables' prefix) and ``ckpt`` is its variables."""
    if not isinstance(src, (str, os.PathLike)):
        return None
    store, p = ckpt.storage, normalize(src)
    try:
        if not store.isdir(p):
            return None
        d = store.dir_path(p)
        if ckpt.prefix != store.join(d, VARIABLES, VARIABLES):
            return None  # a state file's checkpoint, another .index
        if not any(store.isfile(store.join(d, n)) for n in GRAPH_FILES):
            return None
    except (OSError, CheckpointError):
        return None
    return d


def source_saved_model(sources, srcs: list[Source]) -> str | None:
    """The SavedModel directory of a rewrite's one source, given as one; else None."""
    found = source_saved_models(sources, srcs)
    return found[0] if len(found) == 1 and len(srcs) == 1 else None


def source_saved_models(sources, srcs: list[Source]) -> list[str]:
    """The SavedModel directories among a rewrite's sources, each given as one."""
    given = [sources] if isinstance(sources, (str, os.PathLike, Checkpoint)) else list(sources)
    if len(given) != len(srcs):
        return []
    found = (saved_model_directory(g, s.ckpt) for g, s in zip(given, srcs))
    return [d for d in found if d is not None]


def is_directory_destination(store: Storage, dst) -> bool:
    """Whether ``dst`` names a directory: it ends in a separator, or one is there."""
    d = normalize(dst)
    return d.endswith(("/", os.sep)) or store.isdir(d)


def _strip(store: Storage, d: str) -> str:
    stripped = store.dir_path(d).rstrip("/" + os.sep)
    return stripped or d


def saved_model_output(
    sources, srcs: list[Source], dst, store: Storage, options: Options
) -> SavedModelOutput | None:
    """The SavedModel a rewrite of ``sources`` to ``dst`` (on ``store``) writes; None
    when it writes a checkpoint (the source is no SavedModel directory, ``dst`` is no
    directory, or ``checkpoint_only``). Refuses a destination it may not write."""
    source = source_saved_model(sources, srcs)
    if source is None or options.checkpoint_only or not is_directory_destination(store, dst):
        return None
    directory = _strip(store, normalize(dst))
    src_store = srcs[0].ckpt.storage
    alone = option("checkpoint_only=True", "--checkpoint-only")
    if not store.atomic_rename:
        raise CheckpointError(
            "a SavedModel is written whole under a temporary name and renamed into place, "
            f"which an object store cannot do: write it to a local directory (and upload "
            f"that), or use {alone} for a checkpoint of its variables",
            path=directory,
        )
    if src_store.same_file_system(store):
        real, src_real = store.realpath(directory), src_store.realpath(source)
        if real == src_real:
            raise CheckpointError(
                "the destination is the source SavedModel; write elsewhere (sources are "
                "never modified)",
                path=directory,
            )
        if real.startswith(src_real.rstrip(os.sep) + os.sep):
            raise CheckpointError(
                "the destination is inside the source SavedModel; write it beside it",
                path=directory,
            )
    copied, left_out = _listed(src_store, source)
    replaces = _check_existing(store, directory, options.overwrite, copied, alone)
    return SavedModelOutput(source, src_store, directory, copied, left_out, replaces)


def _listed(store: Storage, source: str) -> tuple[list[str], list[str]]:
    """(copied, left out): every file and directory of the SavedModel but its variables
    and this tool's temporaries, as relative paths."""
    copied: list[str] = []
    left_out: list[str] = []

    def walk(directory: str, rel: str, depth: int) -> None:
        if depth > _DEPTH:
            raise CheckpointError(
                f"more than {_DEPTH} directory levels (a link cycle?)", path=directory
            )
        for name in sorted(store.listdir(directory)):
            if TMP_MARK in name:
                continue
            path, inner = store.join(directory, name), f"{rel}{name}"
            if not rel and name == VARIABLES:
                continue
            if not rel and name == FINGERPRINT:
                left_out.append(name)
            elif store.isdir(path):
                copied.append(inner + "/")
                walk(path, inner + "/", depth + 1)
            elif store.isfile(path):
                copied.append(inner)
            else:
                raise CheckpointError(
                    "not a regular file: a SavedModel's files are copied", path=path
                )

    try:
        walk(source, "", 0)
    except OSError as e:
        raise CheckpointError(
            f"cannot list the SavedModel: {e.strerror or e}", path=source
        ) from None
    return copied, left_out


def _check_existing(
    store: Storage, directory: str, overwrite: bool, copied: Iterable[str], alone: str
) -> bool:
    """Whether an existing SavedModel at ``directory`` is replaced; refuses a file there,
    an existing SavedModel without ``overwrite``, and a directory holding anything else."""
    if not store.exists(directory):
        return False
    if not store.isdir(directory):
        raise CheckpointError("the destination is a file, not a directory", path=directory)
    names = sorted(store.listdir(directory))
    if not names:
        return False
    theirs = {rel.split("/", 1)[0] for rel in copied}
    known = {*SAVED_MODEL_NAMES, KERAS_METADATA, *theirs}
    is_saved_model = any(n in GRAPH_FILES or n == VARIABLES for n in names)
    others = [n for n in names if n not in known and TMP_MARK not in n]
    if is_saved_model and not others:
        if not overwrite:
            raise CheckpointError(
                f"the destination already exists (use {option('overwrite=True', '--overwrite')})",
                path=directory,
            )
        return True
    shown = ", ".join(others[:SHOWN] if is_saved_model else names[:SHOWN])
    count = len(others) if is_saved_model else len(names)
    more = f" and {count - SHOWN} more" if count > SHOWN else ""
    if is_saved_model:
        why = (
            f"it holds a SavedModel and {shown}{more}, which are no part of one: a SavedModel "
            "is replaced whole, and they would go with it"
        )
    else:
        why = f"it holds {shown}{more}: a SavedModel is written as a whole new directory"
    raise CheckpointError(
        f"the destination is a directory that is not empty ({why}); name a new or empty "
        f"directory, or use {alone} to write a checkpoint of the variables in it",
        path=directory,
    )


def mismatches(p: Plan) -> list[str]:
    """What in the plan's output the SavedModel's graph would not restore: each variable
    it restores left out, cast, reshaped, or (where the graph restores by name) renamed;
    its object graph left out."""
    s = p.sources[0]
    ckpt = s.ckpt
    by_source: dict[str, int] = {}
    for i, (src, name, parts) in enumerate(
        zip(p.tensors.source, p.tensors.name, (t.parts for t in p.tensors))
    ):
        if src == 0 and parts is None:
            by_source.setdefault(name, i)
    why_dropped = {name: why for _, name, why in p.dropped}
    by_name = OBJECT_GRAPH_KEY not in ckpt  # a TF1 graph's Saver restores by name
    out = []
    if not by_name and p.object_graph is None:
        out.append(f"the object graph is left out ({OBJECT_GRAPH_KEY}), which the loader follows")
    for key in ckpt.keys():
        if key == OBJECT_GRAPH_KEY:
            continue
        info = ckpt.info(key)
        row = by_source.get(key)
        if row is None:
            out.append(f"{key}: left out ({why_dropped.get(key, 'not written')})")
            continue
        t = p.tensors[row]
        if t.new_dtype != info.dtype:
            out.append(f"{key}: {info.dtype} -> {t.new_dtype}")
        if tuple(t.out_shape) != tuple(info.shape):
            out.append(f"{key}: shape {list(info.shape)} -> {list(t.out_shape)}")
        if by_name and t.new_name != key:
            out.append(f"{key}: renamed {t.new_name} (a TF1 graph restores by name)")
    return out


def check_saved_model(p: Plan) -> None:
    """Refuse a SavedModel output whose graph would not restore its variables (see
    :func:`mismatches`), naming what would not match and what to write instead."""
    sm = p.saved_model
    if sm is None:
        return
    found = mismatches(p)
    if not found:
        return
    listed = "; ".join(found[:SHOWN]) + (
        f"; and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    )
    raise CheckpointError(
        f"a SavedModel's graph restores each of its variables with the dtype and shape it "
        f"was saved with, and {len(found)} would not match ({listed}): "
        f"tf.saved_model.load of {sm.directory} would fail. To write the variables alone, "
        f"as a checkpoint, use {option('checkpoint_only=True', '--checkpoint-only')} or "
        f"name a checkpoint prefix ({sm.directory.rstrip('/' + os.sep)}/model), and restore "
        "it into a model built for it (tfckpt.restore casts as it restores)",
        path=sm.source,
    )


def bare_checkpoint_note(p: Plan) -> str | None:
    """What a checkpoint written from SavedModels' variables is, and how to use it; None
    when no source is a SavedModel or the output is one."""
    if p.saved_model is not None or not p.from_saved_models:
        return None
    one = len(p.from_saved_models) == 1
    whose = (
        f"the variables of the SavedModel {p.from_saved_models[0]} alone"
        if one
        else f"made of the variables of the SavedModels {', '.join(p.from_saved_models)}"
    )
    return (
        f"{p.dst} is {whose}, a checkpoint, not a SavedModel: restore it into a model built "
        f"in Python (tf.train.Checkpoint(model).read({p.dst!r}), or tfckpt.restore, which "
        "casts)"
        + (
            "; a directory as the destination, without --checkpoint-only "
            "(checkpoint_only=True), writes a SavedModel where the variables keep their "
            "dtypes and shapes"
            if one and p.writes_saved_models
            else ""
        )
    )


def saved_model_notes(p: Plan) -> list[str]:
    """What the summary says of a SavedModel output (or of the variables of one written
    as a checkpoint)."""
    sm = p.saved_model
    if sm is None:
        note = bare_checkpoint_note(p)
        return [] if note is None else [note]
    notes = [
        f"a SavedModel: {sm.described() or 'no other file'} copied from {sm.source}, "
        f"{VARIABLES}/{VARIABLES} rewritten; tf.saved_model.load({sm.directory!r}) loads it"
    ]
    if FINGERPRINT in sm.left_out:
        notes.append(
            f"{FINGERPRINT} not copied: it fingerprints the source's variables; TensorFlow "
            "loads a SavedModel without one"
        )
    return notes
