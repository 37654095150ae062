"""A directory of checkpoints: what it holds (:func:`ls`), keeping some and removing the
rest (:func:`prune`), copying or moving one checkpoint or a whole run (:func:`copy`,
:func:`move`).

A directory is scanned once (:func:`scan`): each checkpoint with all its files (a V2
index, its data shards and a ``.meta`` graph; a V1 table file or a sharded save's files),
the leftovers of interrupted saves, and what the ``checkpoint`` state file names. Only
files inside the directory are ever written or deleted: a state file's entries are read
as names of the directory's own checkpoints, never followed out of it to delete.

The order of every change is the one that loses nothing if the process dies between
two steps: ``prune`` writes the new state file (naming only checkpoints kept) before it
deletes anything, and deletes a checkpoint's index before its data; ``copy`` commits
each checkpoint as any output is committed (data first, the index last) and the state
file after the checkpoints it names; ``move`` copies, verifies every copy's checksums,
and only then deletes the source. (Past 600 lines on purpose: the scan, the verbs and the order of
their changes stay in one place, where that order can be checked.)
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from tfckpt._proto.checkpoint_state_pb2 import CheckpointState
from tfckpt.checkpoint.index import BundleIndex
from tfckpt.checkpoint.v1files import SHARD_RE, is_table_file
from tfckpt.errors import CheckpointError, CheckpointNotFoundError, CheckpointWriteError
from tfckpt.format.natural import natural_key
from tfckpt.io import commit as commit_files
from tfckpt.io import directories as dirs
from tfckpt.io import paths
from tfckpt.io.commit import Commit
from tfckpt.io.storage import Storage, StorageOptions, normalize, storage_for
from tfckpt.io.temporaries import stale_temporaries

# --- scanning -------------------------------------------------------------------

DATA_WITHOUT_INDEX = "data shard without an index"
KILLED_TFCKPT = "temporary of a killed tfckpt run"  # its process is gone: never in progress
# prune leaves a leftover this recent alone (seconds): a save may be writing it.
MIN_AGE = 30.0
OTHER_SAVE = "data shard of another save (its index names a different shard count)"


@dataclass
class Stored:
    """One checkpoint in a directory: its prefix and every file that is part of it."""

    prefix: str
    name: str
    format: str  # "V2" or "V1"
    files: list[str]  # the last one is written last when copied: the index (V2)
    shards: int
    nbytes: int = 0  # index and data (not the .meta graph)
    mtime: float = 0.0
    pattern: str | None = None  # a sharded V1 save's: how a state file names it

    @property
    def step(self) -> int | None:
        return paths.checkpoint_step(self.name)

    @property
    def state_name(self) -> str:
        """How a state file beside it names it, as TensorFlow writes relative paths."""
        return self.pattern or self.name


@dataclass
class Scan:
    """What :func:`scan` found in a directory."""

    store: Storage
    directory: str
    checkpoints: list[Stored]  # oldest step first; those without a step first
    orphans: list[tuple[str, str]]  # (path, kind)
    state: CheckpointState | None = None  # the parsed state file, if any
    state_error: str | None = None
    listed: dict[str, float | None] = field(default_factory=dict)  # name -> its timestamp
    latest: str | None = None  # the name of the state file's latest, if in the directory
    missing: list[str] = field(default_factory=list)  # entries naming no checkpoint
    elsewhere: list[str] = field(default_factory=list)  # entries outside the directory

    def by_name(self, name: str) -> Stored | None:
        return next((c for c in self.checkpoints if c.name == name), None)

    def checkpoints_named(self, name: str) -> str:
        """How a state file names the checkpoint ``name`` of the directory."""
        found = self.by_name(name)
        return name if found is None else found.state_name


def _own_data(store: Storage, index: str, data: list[str]) -> tuple[list[str], list[str]]:
    """The data files of ``data`` that the ``index`` names, and the others: where the
    names carry more than one shard count (an in-place rewrite killed, or a replaced
    file it could not delete), the index's header tells which save they belong to.
    An index that cannot be read claims them all (nothing is called an orphan)."""
    counts = {paths.parse_data_filename(n)[2] for n in data}  # type: ignore[index]
    if len(counts) < 2:
        return data, []
    try:
        num = BundleIndex(store.read_bytes(index), index, index).header.num_shards
    except (OSError, CheckpointError):
        return data, []
    own = [n for n in data if paths.parse_data_filename(n)[2] == num]  # type: ignore[index]
    return own, [n for n in data if n not in own]


def scan(store: Storage, directory: str) -> Scan:
    """Every checkpoint, leftover and state-file entry of ``directory`` on ``store``.

    A leftover is one of this run's: a temporary, part directory or data shard of a
    save of one of its checkpoint prefixes (see :func:`_owner`); a part directory only
    while it holds nothing but the parts a save writes. Anything else (``eval_temp/``,
    a ``x.tempstate1`` of another program) is not the run's, and never listed."""
    try:
        names = sorted(store.listdir(directory))
    except FileNotFoundError:
        raise CheckpointNotFoundError("no such directory", path=directory) from None
    except NotADirectoryError:
        raise CheckpointNotFoundError("not a directory", path=directory) from None
    join = store.join
    groups: dict[str, dict[str, list[str]]] = {}
    # (path, kind, the prefixes whose save may have left it): kept if the run owns one
    leftovers: list[tuple[str, str, tuple[str, ...]]] = []
    part_dirs: list[tuple[str, str]] = []  # (path, prefix)
    stale = set(stale_temporaries(store, directory, lambda name: True))

    def group(prefix: str) -> dict[str, list[str]]:
        return groups.setdefault(prefix, {"index": [], "data": [], "meta": [], "v1": []})

    for name in names:
        path = join(directory, name)
        if name == paths.STATE_FILENAME:
            continue
        if dirs.is_tfckpt_temporary(name):
            if path in stale:
                leftovers.append((path, KILLED_TFCKPT, dirs.temporary_prefixes(name)))
            continue  # a live run's: not ours to touch
        kind = dirs.tensorflow_temporary(name)
        if kind is not None:
            kind = f"TensorFlow {kind} of an interrupted save"
            leftovers.append((path, kind, dirs.temporary_prefixes(name)))
            continue
        data = paths.parse_data_filename(name)
        if name.endswith(".index"):
            group(name[: -len(".index")])["index"].append(name)
        elif data is not None:
            group(data[0])["data"].append(name)
        elif name.endswith(".meta"):
            group(name[: -len(".meta")])["meta"].append(name)
        elif (part := dirs.part_directory_prefix(name)) is not None and store.isdir(path):
            part_dirs.append((path, part))
        elif (m := SHARD_RE.match(name)) and "?" not in name and is_table_file(store, path):
            group(m["prefix"])["v1"].append(name)
        elif not store.isdir(path) and is_table_file(store, path):
            group(name)["v1"].append(name)
    checkpoints = []
    for prefix, g in groups.items():
        if (part := dirs.part_prefix(prefix)) is not None:
            kind = "part of an interrupted save"
            leftovers += [
                (join(directory, n), kind, (part,)) for k in ("index", "data") for n in g[k]
            ]
            continue
        if g["index"]:
            own, others = _own_data(store, join(directory, g["index"][0]), g["data"])
            leftovers += [(join(directory, n), OTHER_SAVE, (prefix,)) for n in others]
            files, fmt, shards = [*own, *g["meta"], *g["index"]], "V2", len(own)
        elif g["v1"]:
            files, fmt, shards = [*g["meta"], *g["v1"]], "V1", len(g["v1"])
        else:
            kind = DATA_WITHOUT_INDEX
            leftovers += [(join(directory, n), kind, (prefix,)) for n in g["data"]]
            continue
        full = [join(directory, f) for f in files]
        c = Stored(join(directory, prefix), prefix, fmt, full, shards)
        sharded = [SHARD_RE.match(n) for n in g["v1"] if n != prefix]
        if fmt == "V1" and sharded and sharded[0]:
            c.pattern = f"{prefix}-?????-of-{sharded[0]['num']}"
        for f in c.files:
            size, mtime = store.stat(f)
            c.mtime = max(c.mtime, mtime)
            if not f.endswith(".meta"):
                c.nbytes += size
        checkpoints.append(c)
    checkpoints.sort(key=lambda c: (c.step is not None, c.step or 0, natural_key(c.name)))
    result = Scan(store, directory, checkpoints, [])
    _read_state(result)
    if result.state is None and result.state_error is None and paths.STATE_FILENAME in names:
        path = join(directory, paths.STATE_FILENAME)
        result.state_error = f"{path}: the state file is not a regular file"
    owns = _owner(result)
    orphans = [
        (path, kind)
        for path, kind, prefixes in leftovers
        if any(owns(p) for p in prefixes) and not store.isdir(path)
    ]
    kind = "part directory of an interrupted save"
    orphans += [
        (path + store.sep, kind)
        for path, prefix in part_dirs
        if owns(prefix) and _holds_only_parts(store, path)
    ]
    result.orphans = sorted(orphans)
    return result


def _owner(s: Scan):
    """Whether a prefix (or the state file's name) is one of the run's in ``s``: the name
    of one of its checkpoints or of a state-file entry, or a later (or earlier) step of
    one (``ckpt-8`` where ``ckpt-3`` is there: an interrupted save of the same run)."""
    names = {c.name for c in s.checkpoints}
    if s.state is not None:
        state = s.state
        for entry in [*state.all_model_checkpoint_paths, state.model_checkpoint_path]:
            name = _entry_name(s.store, s.directory, entry) if entry else None
            if name is not None:
                names.add(name)
    if names or s.state is not None or s.state_error is not None:
        names.add(paths.STATE_FILENAME)
    families = {m[1] for n in names if (m := _NUMBERED.fullmatch(n))}

    def owns(prefix: str) -> bool:
        if prefix in names:
            return True
        m = _NUMBERED.fullmatch(prefix)
        return m is not None and m[1] in families

    return owns


_NUMBERED = re.compile(r"(.+-)\d+")  # a prefix numbered by its step: (what precedes the step)


def _holds_only_parts(store: Storage, path: str) -> bool:
    """Whether the directory ``path`` holds only the files a sharded save writes into its
    part directory (nothing at all, too: a save killed as it began)."""
    try:
        entries = store.listdir(path)
    except OSError:
        return False
    where = store.join(store.realpath(store.dirname(path)), store.basename(path))
    if store.realpath(path) != where:
        return False  # a link: TensorFlow makes none, and what it leads to is elsewhere
    return all(dirs.is_part_file(n) and not store.isdir(store.join(path, n)) for n in entries)


def _read_state(s: Scan) -> None:
    """The state file's entries, each matched with a checkpoint of the directory by the
    name it has there (a TF1 ``Saver`` writes absolute paths, maybe of another machine)."""
    store = s.store
    try:
        s.state = paths.read_state_file(store, s.directory)
    except CheckpointError as e:
        s.state_error = " ".join(str(e).split())
        return
    except OSError as e:
        path = store.join(s.directory, paths.STATE_FILENAME)
        s.state_error = f"{path}: cannot read the state file: {e.strerror or e}"
        return
    state = s.state
    if state is None:
        return
    entries = list(state.all_model_checkpoint_paths)
    times = list(state.all_model_checkpoint_timestamps)
    stamps = dict(zip(entries, times)) if len(times) == len(entries) else {}
    latest = state.model_checkpoint_path
    for entry in dict.fromkeys([*entries, latest]):
        if not entry:
            continue
        name = _entry_name(store, s.directory, entry)
        if name is None or s.by_name(name) is None:
            (s.missing if name is not None else s.elsewhere).append(entry)
            continue
        if entry in entries or name not in s.listed:
            s.listed[name] = stamps.get(entry)
        if entry == latest:
            s.latest = name


def _entry_name(store: Storage, directory: str, entry: str) -> str | None:
    """The name in ``directory`` of the checkpoint a state-file entry means: its last path
    component where the entry is relative or leads into the directory (or has gone, a
    moved run's absolute path); None for a checkpoint that exists elsewhere."""
    base = re.split(r"[/\\]", entry)[-1]
    if not base or base in (".", ".."):
        return entry  # names no checkpoint of the directory: missing
    pattern = SHARD_RE.match(base)
    if pattern and pattern["shard"] == "?????":  # a sharded V1 save's files
        base = pattern["prefix"]
    rooted = store.isabs(entry) or re.match(r"^(?:[/\\]|[A-Za-z]:[/\\])", entry)
    if not rooted and "/" not in entry and "\\" not in entry:
        return base
    where = entry if rooted else store.join(directory, entry)
    if store.may_lead_to(directory, where):
        if store.dirname(store.realpath(where)) == store.realpath(directory):
            return base
        if paths.checkpoint_exists(store, where):
            return None  # a checkpoint outside the directory: never ours to manage
    return base


# --- ls ---------------------------------------------------------------------------


def ls(directory, *, storage_options: StorageOptions | None = None) -> dict:
    """What a directory of checkpoints holds: ``{"directory", "state_file", "state_error",
    "latest", "checkpoints": [{"prefix", "name", "step", "format", "mtime", "bytes",
    "shards", "in_state_file", "latest"}], "orphans": [{"path", "kind"}],
    "missing": [state-file entries naming no checkpoint], "elsewhere": [entries naming
    checkpoints outside the directory]}``; checkpoints oldest step first.

    >>> [c["step"] for c in ls("train")["checkpoints"]]
    [3, 4, 5]
    """
    directory = normalize(directory)
    store = storage_for(directory, storage_options)
    s = scan(store, _directory(store, directory))
    return {
        "directory": s.directory,
        "state_file": s.state is not None,
        "state_error": s.state_error,
        "latest": s.latest,
        "checkpoints": [
            {
                "prefix": c.prefix,
                "name": c.name,
                "step": c.step,
                "format": c.format,
                "mtime": c.mtime,
                "bytes": c.nbytes,
                "shards": c.shards,
                "in_state_file": c.name in s.listed,
                "latest": c.name == s.latest,
            }
            for c in s.checkpoints
        ],
        "orphans": [{"path": p, "kind": k} for p, k in s.orphans],
        "missing": s.missing,
        "elsewhere": s.elsewhere,
    }


def _directory(store: Storage, directory: str) -> str:
    if not store.isdir(directory):
        raise CheckpointNotFoundError("not a directory", path=directory)
    return store.dir_path(directory)


# --- prune ------------------------------------------------------------------------


def prune(
    directory,
    *,
    keep_last: int,
    keep_every_steps: int | None = None,
    keep: tuple[int, ...] | list[int] = (),
    dry_run: bool = False,
    min_age: float = MIN_AGE,
    storage_options: StorageOptions | None = None,
) -> dict:
    """Keep the ``keep_last`` newest numbered checkpoints of ``directory``, those whose
    step is a multiple of ``keep_every_steps``, and the steps in ``keep``; delete the
    others (every file of each) and the leftovers of interrupted saves, and rewrite the
    state file as ``tf.train.CheckpointManager(max_to_keep=keep_last)`` leaves it: the
    newest as latest, the ``keep_last`` newest in ``all_model_checkpoint_paths`` with
    their save times, and the others kept left out of it, behind
    ``last_preserved_timestamp`` (as the manager's ``keep_checkpoint_every_n_hours``
    keeps checkpoints for good), so that a manager made on the directory never deletes
    them. Checkpoints whose name ends in no step are never deleted.

    The new state file is written first, naming only checkpoints kept; then each
    checkpoint to go loses its index, then its other files. ``dry_run``: only say what
    would go.

    A run saving into the directory meanwhile: a leftover written less than
    ``min_age`` seconds ago (a part directory by its newest file) may be a save in
    progress and stays, and so does a checkpoint such a leftover names (its
    ``NAME_temp`` part directory, ``NAME.index.tempstate...``); both are listed in
    ``in_progress``. (The state file a saving run writes after its save may still name
    checkpoints pruned meanwhile: TensorFlow's manager skips those that are gone.)

    Returns ``{"directory", "kept", "removed": [{"name", "step", "files"}],
    "orphans": [{"path", "kind"}], "in_progress": [{"path", "kind"}],
    "state_file": {"latest", "checkpoints"} | None, "dry_run"}``.

    >>> prune("train", keep_last=3, keep_every_steps=10000)["kept"]
    ['model.ckpt-10000', 'model.ckpt-20000', 'model.ckpt-24000', ...]
    """
    if not isinstance(keep_last, int) or isinstance(keep_last, bool) or keep_last < 1:
        raise CheckpointError(f"keep_last must be a whole number >= 1, not {keep_last!r}")
    if keep_every_steps is not None and (
        not isinstance(keep_every_steps, int) or keep_every_steps < 1
    ):
        raise CheckpointError(
            f"keep_every_steps must be a whole number >= 1, not {keep_every_steps!r}"
        )
    if not isinstance(min_age, (int, float)) or not min_age >= 0 or min_age == float("inf"):
        raise CheckpointError(f"min_age must be a number of seconds >= 0, not {min_age!r}")
    directory = normalize(directory)
    store = storage_for(directory, storage_options)
    s = scan(store, _directory(store, directory))
    if s.state_error is not None:
        raise CheckpointError(f"cannot prune: {s.state_error}")
    busy = _in_progress(s, min_age)
    numbered = [c for c in s.checkpoints if c.step is not None]
    recent = numbered[-keep_last:]
    wanted = set(keep)
    removed, preserved = [], []
    for c in numbered[: max(len(numbered) - keep_last, 0)]:
        step = c.step
        assert step is not None
        if step in wanted or (keep_every_steps and step % keep_every_steps == 0):
            preserved.append(c)
        elif not _named_by(store, c, busy):
            removed.append(c)
    state = _manager_state(s, recent, preserved)
    orphans = [(p, k) for p, k in s.orphans if p not in busy]
    result = {
        "directory": s.directory,
        "kept": [c.name for c in s.checkpoints if c not in removed],
        "removed": [{"name": c.name, "step": c.step, "files": c.files} for c in removed],
        "orphans": [{"path": p, "kind": k} for p, k in orphans],
        "in_progress": [{"path": p, "kind": k} for p, k in s.orphans if p in busy],
        "state_file": None if state is None else {"latest": state[0], "checkpoints": state[1]},
        "dry_run": dry_run,
    }
    if dry_run:
        return result
    if state is not None:
        dirs.replace_state_file(store, s.directory, dirs.state_bytes(*state))
    for c in removed:
        _delete_checkpoint(store, c)
    for path, _ in orphans:
        if path.endswith(store.sep):
            dirs.remove_part_directory(store, path.rstrip(store.sep))
        else:
            dirs.remove(store, path)
    return result


def _in_progress(s: Scan, min_age: float) -> set[str]:
    """The leftovers of ``s`` written less than ``min_age`` seconds ago (a directory: its
    newest entry); one that cannot be looked at counts as written now. A tfckpt
    temporary whose process is gone is no save in progress."""
    if min_age <= 0:
        return set()
    store, now, busy = s.store, time.time(), set()
    for path, kind in s.orphans:
        if kind == KILLED_TFCKPT:
            continue
        try:
            if path.endswith(store.sep):
                top = path.rstrip(store.sep)
                entries = [store.join(top, n) for n in store.listdir(top)]
                times = [store.stat(e)[1] for e in entries if not store.isdir(e)]
                newest = max(times, default=0.0)
            else:
                newest = store.stat(path)[1]
        except FileNotFoundError:
            continue  # gone already: nothing to keep
        except (OSError, CheckpointError):
            newest = now
        if now - newest < min_age:
            busy.add(path)
    return busy


def _named_by(store: Storage, c: Stored, busy: set[str]) -> bool:
    """Whether a leftover in ``busy`` is one of checkpoint ``c``'s save (its part
    directory ``NAME_temp...``, a ``NAME.index.tempstate...``, an S3 part)."""
    for path in busy:
        name = store.basename(path.rstrip(store.sep))
        if name.startswith((f"{c.name}_temp", f"{c.name}.")):
            return True
    return False


def _manager_state(
    s: Scan, recent: list[Stored], preserved: list[Stored]
) -> tuple[str, list[str], list[float], float] | None:
    """(latest, names, timestamps, last preserved timestamp) of the state file a
    ``CheckpointManager`` would leave with ``recent`` listed and ``preserved`` kept for
    good; None when no numbered checkpoint is left (the state file stays as it is)."""
    if not recent:
        return None

    def stamp(c: Stored) -> float:
        listed = s.listed.get(c.name)
        return listed if listed else c.mtime

    times = [stamp(c) for c in recent]
    old = s.state.last_preserved_timestamp if s.state is not None else 0.0
    last = max([old, *(stamp(c) for c in preserved)])
    # A manager made on the directory forgets (keeps for good) every listed checkpoint
    # saved at or before this time: it must stay below the listed ones'.
    if not last or last >= min(times):
        last = min(times) - 1.0
    names = [c.state_name for c in recent]
    return names[-1], names, times, last


def _delete_checkpoint(store: Storage, c: Stored) -> None:
    """Delete a checkpoint's index (or V1 files) first: then it is no checkpoint, and
    what a crash leaves is data without an index, which the next prune removes."""
    for f in reversed(c.files):
        dirs.remove(store, f)


# --- cp and mv --------------------------------------------------------------------


def copy(src, dst, *, overwrite: bool = False, storage_options: StorageOptions | None = None):
    """Copy one checkpoint (``src`` a prefix) or a whole run (``src`` a directory: every
    checkpoint in it and its state file) to ``dst``, on any storage (a local path or an
    fsspec URL; ``storage_options`` apply to both).

    A checkpoint goes to the prefix ``dst``, or into ``dst`` under its own name when
    ``dst`` is an existing directory (or ends with ``/``); a run into the directory
    ``dst``. Each checkpoint is committed as any output is (data first, the index last);
    a run's state file comes after them, naming the copies as the source's named the
    originals: relative names stay relative, absolute ones into ``src`` point into
    ``dst`` when both are on one storage; a run whose state file cannot be read is refused
    (nothing copied). Something already at the destination is an
    error unless ``overwrite``: then each checkpoint there is replaced in one step (new
    data under names its old index does not use, then the index), and the state file
    last. Returns ``{"src", "dst", "checkpoints": [{"src", "dst", "bytes"}],
    "state_file", "dropped"}``.

    >>> copy("train", "s3://bucket/runs/train")["checkpoints"][-1]["dst"]
    's3://bucket/runs/train/ckpt-5'
    """
    return _transfer(src, dst, overwrite, storage_options, move=False)


def move(src, dst, *, overwrite: bool = False, storage_options: StorageOptions | None = None):
    """:func:`copy`, then every copy verified (each tensor's checksum read back, as
    ``tfckpt verify`` does), then the source deleted: its state file first (a moved
    checkpoint's entry is taken out of its directory's state file), then each
    checkpoint's index, then its data. Any failure before the deletion leaves the source
    as it was. A run whose state file cannot be read (or is no regular file) is refused
    before anything is copied: it would be left behind alone. Returns what :func:`copy`
    returns.

    >>> move("scratch/run7", "s3://bucket/runs/run7")["dst"]
    's3://bucket/runs/run7'
    """
    return _transfer(src, dst, overwrite, storage_options, move=True)


def _transfer(src, dst, overwrite: bool, storage_options, move: bool) -> dict:
    src, dst = normalize(src), normalize(dst)
    src_store = storage_for(src, storage_options)
    dst_store = storage_for(dst, storage_options)
    if src_store.isdir(src):
        source = scan(src_store, src_store.dir_path(src))
        if not source.checkpoints:
            raise CheckpointNotFoundError("no checkpoint in directory", path=src)
        if source.state_error is not None:
            # Without it the run would go without its state file, which a move leaves
            # behind alone: the whole run, or nothing.
            verb, done = ("move", "moved") if move else ("copy", "copied")
            raise CheckpointError(
                f"cannot {verb} the run, its state file cannot be read ({source.state_error}); "
                f"nothing was {done}: repair or remove the state file"
            )
        wanted = source.checkpoints
        target_dir = dst_store.dir_path(dst)
        run = True
    else:
        prefix = src[: -len(".index")] if src.endswith(".index") else src
        source = scan(src_store, src_store.dirname(prefix) or ".")
        found = source.by_name(src_store.basename(prefix))
        if found is None:
            raise CheckpointNotFoundError(
                "no checkpoint at this prefix (an .index, or V1 files)", path=src
            )
        wanted = [found]
        if dst.endswith(("/", dst_store.sep)) or dst_store.isdir(dst):
            target_dir = dst_store.dir_path(dst.rstrip("/" + dst_store.sep) or dst)
            new_name = found.name
        else:
            target_dir = dst_store.dirname(dst) or "."
            new_name = dst_store.basename(dst)
        run = False
    if dirs.same_place(src_store, source.directory, dst_store, target_dir) and (
        run or new_name == wanted[0].name
    ):
        raise CheckpointError("the destination is the source", path=dst)
    if run and src_store == dst_store and dirs.is_inside(src_store, source.directory, target_dir):
        raise CheckpointError("the destination is inside the source directory", path=dst)
    plan = [(c, c.name if run else new_name) for c in wanted]
    _refuse_existing(dst_store, target_dir, plan, run, overwrite)
    copied = []
    for c, name in plan:
        nbytes = _copy_checkpoint(src_store, c, dst_store, target_dir, name, overwrite)
        copied.append({"src": c.prefix, "dst": dst_store.join(target_dir, name), "bytes": nbytes})
    state, dropped = (None, [])
    if run and source.state is not None:
        state, dropped = _copied_state(source, dst_store, target_dir)
        if state is not None:
            dirs.replace_state_file(dst_store, target_dir, dirs.state_bytes(*state))
    result = {
        "src": source.directory if run else wanted[0].prefix,
        "dst": target_dir if run else copied[0]["dst"],
        "checkpoints": copied,
        "state_file": None if state is None else {"latest": state[0], "checkpoints": state[1]},
        "dropped": dropped,
    }
    if move:
        _verify_copies(copied, dst_store)
        _delete_source(source, wanted, run)
    return result


def _refuse_existing(store: Storage, directory: str, plan, run: bool, overwrite: bool) -> None:
    """A checkpoint or state file at the destination is refused without ``overwrite``; a
    V1 checkpoint (files replaced one by one, not at once) even with it."""
    for c, name in plan:
        prefix = store.join(directory, name)
        targets = [_renamed(store, directory, c, name, f) for f in c.files]
        taken = paths.checkpoint_exists(store, prefix) or any(store.exists(t) for t in targets)
        if taken and not overwrite:
            raise CheckpointWriteError(
                "a checkpoint of this name exists at the destination (pass --overwrite "
                "to replace it)",
                path=prefix,
            )
        if taken and (c.format == "V1" or store.isfile(prefix)):
            raise CheckpointWriteError(
                "cannot replace a V1 checkpoint in one step: remove the destination first",
                path=prefix,
            )
    state = store.join(directory, paths.STATE_FILENAME)
    if run and not overwrite and store.exists(state):
        raise CheckpointWriteError(
            "the destination has a state file already (pass --overwrite to replace it)",
            path=state,
        )


def _copy_checkpoint(
    src_store: Storage, c: Stored, dst_store: Storage, directory: str, name: str, overwrite: bool
) -> int:
    """Copy a checkpoint's files to ``name`` in ``directory`` through one :class:`Commit`:
    every file under a temporary name (locally) and moved into place, the index last; the
    bytes copied (index and data).

    Over a checkpoint there (``overwrite``), the data goes under a shard count no file of
    that prefix has (the index's header says so, and the extra shards are empty), so the
    old checkpoint stays whole until the new index replaces its own in one step; its data
    is deleted after.
    """
    prefix = dst_store.join(directory, name)
    copies = [(f, _renamed(dst_store, directory, c, name, f)) for f in c.files[:-1]]
    last = _renamed(dst_store, directory, c, name, c.files[-1])
    old = commit_files.data_files(dst_store, prefix) if overwrite else []
    index, extra = None, []
    if c.format == "V2":  # an index is small: stored in one request on an object store
        index = src_store.read_bytes(c.files[-1])
        count = dirs.index_shards(index, c.files[-1])
        copies = [(f, t) for f, t in copies if _shard_count(f) in (None, count)]
        fresh = commit_files.free_shard_count(old, count)
        if fresh != count:
            index = dirs.reheadered(index, c.files[-1], fresh)
            copies = [(f, _recounted(t, fresh)) for f, t in copies]
            extra = [paths.data_filename(prefix, k, fresh) for k in range(count, fresh)]
    commit = Commit(dst_store, last, overwrite=overwrite, what="a checkpoint")
    total = 0
    try:
        commit.make_directory(directory)
        for f, final in copies:
            n = dirs.copy_file(src_store, f, dst_store, commit.new_file(final))
            total += 0 if f.endswith(".meta") else n
        for final in extra:
            dst_store.write_new(commit.new_file(final), b"")
        if index is not None:
            commit.write_last(index)
            total += len(index)
        else:
            total += dirs.copy_file(src_store, c.files[-1], dst_store, commit.last_file())
        commit.publish(replace_data=overwrite)
    except OSError as e:
        commit.discard()
        raise CheckpointWriteError(f"cannot copy: {e.strerror or e}", path=prefix) from None
    except BaseException:
        commit.discard()
        raise
    kept = {t for _, t in copies} | set(extra)
    commit.remove_replaced([f for f in old if f not in kept])
    return total


def _renamed(store: Storage, directory: str, c: Stored, name: str, path: str) -> str:
    """Where a file of checkpoint ``c`` goes as a file of checkpoint ``name``."""
    base = re.split(r"[/\\]", path)[-1]
    return store.join(directory, name + base[len(c.name) :])


def _shard_count(path: str) -> int | None:
    parsed = paths.parse_data_filename(path)
    return None if parsed is None else parsed[2]


def _recounted(path: str, count: int) -> str:
    parsed = paths.parse_data_filename(path)
    return path if parsed is None else paths.data_filename(parsed[0], parsed[1], count)


def _copied_state(source: Scan, store: Storage, directory: str):
    """The state file of a copied run: the source's entries, each naming the copy as the
    source's named the original; entries of checkpoints not copied are dropped."""
    state = source.state
    assert state is not None
    src_store = source.store
    entries = list(state.all_model_checkpoint_paths)
    times = list(state.all_model_checkpoint_timestamps)
    latest_entry = state.model_checkpoint_path
    if len(times) != len(entries):
        times = []
    names, stamps, dropped = [], [], []
    latest = None
    for i, entry in enumerate([*entries, latest_entry]):
        name = _entry_name(src_store, source.directory, entry) if entry else None
        same = src_store.same_file_system(store)
        if name is None and same:
            new = entry  # a checkpoint elsewhere on this storage: still there, still named
        elif name is None or source.by_name(name) is None:
            if entry and entry not in dropped:
                dropped.append(entry)
            continue
        elif same and src_store.isabs(entry):
            # into the copy, absolute
            new = store.join(store.realpath(directory), source.checkpoints_named(name))
        else:
            new = source.checkpoints_named(name)  # relative, as CheckpointManager writes
        if i == len(entries):
            latest = new
        elif new not in names:
            names.append(new)
            if times:
                stamps.append(times[i])
    if latest is None:
        if not names:
            return None, dropped
        latest = names[-1]
    last = state.last_preserved_timestamp
    return (latest, names, stamps, last), dropped


def _verify_copies(copied: list[dict], store: Storage) -> None:
    from tfckpt.inspection.verify import verify

    for row in copied:
        opts = store.options
        report = verify(row["dst"], storage_options=opts)
        if report["problems"]:
            raise CheckpointError(
                f"the copy does not verify ({report['problems'][0]}); the source is left as it was",
                path=row["dst"],
            )


def _delete_source(source: Scan, moved: list[Stored], run: bool) -> None:
    """The source of a move deleted: the state file first (a run's), or the moved
    checkpoint's entry taken out of it; then each checkpoint, its index first."""
    store = source.store
    names = {c.name for c in moved}
    left = [c for c in source.checkpoints if c.name not in names and c.name in source.listed]
    if source.state is not None and (run or names & source.listed.keys()):
        if run or not left:
            dirs.remove_state_file(store, source.directory)
        else:
            latest = source.latest if source.latest in {c.name for c in left} else left[-1].name
            order = sorted(left, key=lambda c: c.name == latest)  # the latest last
            times = [source.listed.get(c.name) or c.mtime for c in order]
            state = dirs.state_bytes(
                order[-1].state_name,
                [c.state_name for c in order],
                times,
                source.state.last_preserved_timestamp,
            )
            dirs.replace_state_file(store, source.directory, state)
    for c in moved:
        _delete_checkpoint(store, c)
    if run:
        # What a move killed between a checkpoint's index and its data left (found again
        # by the run that finishes it); other files stay, and so does the directory then.
        for path, kind in source.orphans:
            if kind == DATA_WITHOUT_INDEX:
                dirs.remove(store, path)
        store.remove_dirs([source.directory])  # only if nothing else is left in it
