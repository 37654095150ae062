"""``tfckpt edit``: a checkpoint with some values set, filled, scaled, added, deleted,
resized or remapped to a new vocabulary, written through the one engine.

:func:`plan_edit` plans it from the index alone (tensors edited carry an
:data:`~tfckpt.rewrite.edits.Edit`, read in bounded pieces; the others are copied chunk
by chunk); :func:`edit` plans and executes. ``in_place`` commits over the source: the
new data files take a shard count no old file has, the new index replaces the old one
last, and only then are the old data files removed, so a failure or a kill at any
moment leaves the old checkpoint whole.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from tfckpt.errors import CheckpointError, did_you_mean, flag, option
from tfckpt.format import dtypes as _dt
from tfckpt.format.bundle import TensorInfo
from tfckpt.format.objectgraph import OBJECT_GRAPH_KEY, attribute_tensors
from tfckpt.format.optimizers import optimizer_state
from tfckpt.io import paths
from tfckpt.io.storage import StorageOptions
from tfckpt.rewrite.edits import (
    Fill,
    Literal,
    NpyFile,
    Rows,
    Scale,
    exact_cast,
    literal_array,
    open_npy,
    parse_init,
    read_regular,
)
from tfckpt.rewrite.engine import Summary, execute
from tfckpt.rewrite.options import Options
from tfckpt.rewrite.planner import (
    destination_storage,
    finished_plan,
    open_sources,
    resolve_destination,
    source_flat_names,
)
from tfckpt.rewrite.plans import Plan, PlannedTensor, PlannedTensors, Source
from tfckpt.rewrite.savedmodel import check_saved_model, saved_model_output, source_saved_models

# Options edit does not take: it writes each tensor in its own dtype, shape and name.
_NOT_TAKEN = (
    *("include", "exclude", "rename", "rename_exact", "cast", "permute", "reshape"),
    *("squeeze", "split", "concat", "name_map", "dtype_rules", "keep_dtype"),
)


# The largest vocabulary file read (its tokens are held), and the most rows an edit
# gives an axis (one 8-byte index each is held).
MAX_VOCAB_BYTES = 256 << 20
MAX_ROWS = 1 << 28

# A TF1 slot's last name part: the optimizer's name (CamelCase), maybe with _N.
_TF1_SLOT = re.compile(r"[A-Z][A-Za-z0-9]*(_[0-9]+)?")


@dataclass
class Edits:
    """What to change, as :func:`edit` takes it (see there)."""

    set: Mapping[str, object] = field(default_factory=dict)
    add: Mapping[str, object] = field(default_factory=dict)
    delete: Sequence[str] = ()
    fill: Mapping[str, object] = field(default_factory=dict)
    scale: Mapping[str, object] = field(default_factory=dict)
    resize: Mapping[str, object] = field(default_factory=dict)
    remap_rows: Sequence[str] = ()
    old_vocab: str | None = None
    new_vocab: str | None = None
    init: str = "zeros"
    axis: int = 0
    allow_no_overlap: bool = False


def edit(
    src,
    dst=None,
    *,
    set: Mapping[str, object] | None = None,  # noqa: A002 - the flag's name
    add: Mapping[str, object] | None = None,
    delete: str | Sequence[str] = (),
    fill: Mapping[str, object] | None = None,
    scale: Mapping[str, object] | None = None,
    resize: Mapping[str, object] | None = None,
    remap_rows: str | Sequence[str] = (),
    old_vocab: str | None = None,
    new_vocab: str | None = None,
    init: str = "zeros",
    axis: int = 0,
    allow_no_overlap: bool = False,
    in_place: bool = False,
    as_tf1: bool = False,
    options: Options | None = None,
    storage_options: StorageOptions | None = None,
    progress: Callable[[int], None] | None = None,
    **changes,
) -> Summary:
    """Write ``src`` with some tensors changed to ``dst`` (or over ``src``: ``in_place``).

    - ``set={name: value}``: a literal (a number, ``"true"``, a JSON list, or a numpy
      array) of the tensor's shape, or ``"@file.npy"``; cast to the tensor's dtype
      without loss (a decimal literal takes the dtype's nearest value).
    - ``add={name: "@file.npy" or array}``: a new tensor. A TF2 source refuses it (a new
      variable needs an object-graph node) unless ``as_tf1``, which writes no object graph.
    - ``delete=[regex, ...]``: tensors whose name (or TF2 flat name) the regex finds,
      with their optimizer slots (TF1: ``VAR/Adam``, ``VAR/Adam_1``, ``VAR/Momentum``...,
      any ``VAR/NAME`` or ``VAR/NAME_N`` of the variable's shape, ``NAME`` capitalised as
      TF1 optimizers' names are); in a TF2 checkpoint their objects go from the graph.
    - ``fill={name: "zeros" | "ones" | value}``, ``scale={name: factor}`` (floating point:
      the product in float64, rounded once to the dtype).
    - ``resize={regex: rows or "ROWS[:init]"}``: axis ``axis`` cut or grown to ``rows``.
    - ``remap_rows=[regex, ...]`` with ``old_vocab``, ``new_vocab`` (files, one token a
      line, read as TensorFlow reads them: see :func:`read_vocab`): indices along
      ``axis`` reordered by token, new tokens by ``init``, dropped ones removed, as
      TensorFlow's ``load_and_remap_matrix`` does. A new vocabulary none of whose tokens
      is in the old one is an error unless ``allow_no_overlap``; the summary's
      ``warnings`` say when fewer than half are.

    Resized and remapped variables take their optimizer slots along (TF1 ``VAR/Adam``...,
    TF2 slot variables), whose new rows are zeros. ``init``: ``zeros``, ``mean`` or
    ``normal:STD:SEED``. Names are checkpoint keys, or TF2 flat names.

    >>> tfckpt.edit("train/model.ckpt-7", "out/model.ckpt", set={"global_step": "0"})
    >>> tfckpt.edit("run/ckpt-3", in_place=True, delete=["^dense_2/"])
    """
    edits = Edits(
        set or {},
        add or {},
        [delete] if isinstance(delete, str) else list(delete),
        fill or {},
        scale or {},
        resize or {},
        [remap_rows] if isinstance(remap_rows, str) else list(remap_rows),
        old_vocab,
        new_vocab,
        init,
        axis,
        allow_no_overlap,
    )
    p = plan_edit(
        src,
        dst,
        edits,
        options,
        in_place=in_place,
        as_tf1=as_tf1,
        storage_options=storage_options,
        **changes,
    )
    try:
        return execute(p, progress=progress)
    finally:
        p.close()


def plan_edit(
    src,
    dst,
    edits: Edits,
    options: Options | None = None,
    *,
    in_place: bool = False,
    as_tf1: bool = False,
    storage_options: StorageOptions | None = None,
    **changes,
) -> Plan:
    """The plan of :func:`edit`, from the index alone (``.npy`` headers and vocabularies
    read too); nothing is written."""
    options = Options.of(options, **changes)
    for name in _NOT_TAKEN:
        if getattr(options, name) not in (None, (), [], {}):
            raise CheckpointError(f"edit does not take the option {name}")
    srcs = open_sources([src], storage_options)
    try:
        return _plan(srcs, dst, edits, options, in_place, as_tf1, storage_options, src)
    except BaseException:
        srcs[0].ckpt.close()
        raise


def _plan(
    srcs: list[Source],
    dst,
    edits: Edits,
    options: Options,
    in_place: bool,
    as_tf1: bool,
    storage_options: StorageOptions | None,
    given=None,
) -> Plan:
    s = srcs[0]
    label = s.ckpt.prefix
    sm = None
    if in_place:
        if dst is not None:
            raise CheckpointError(f"{flag('in-place')} takes no destination", path=label)
        store = s.ckpt.storage
        if not store.isfile(paths.index_filename(label)):
            raise CheckpointError(
                f"{flag('in-place')} rewrites a V2 checkpoint (prefix.index)", path=label
            )
        dst = label
        options = Options.of(options, overwrite=True)
    elif dst is None:
        raise CheckpointError(f"edit needs a destination, or {flag('in-place')}", path=label)
    else:
        store = destination_storage(dst, srcs, storage_options)
        sm = saved_model_output(given, srcs, dst, store, options)
        if sm is not None:
            dst = sm.variables_prefix(store)
        else:
            dst = resolve_destination(
                store,
                dst,
                srcs,
                options.overwrite,
                instead=f"write elsewhere, or {flag('in-place')}",
            )
    if as_tf1:
        s.graph = None
    ed = _Editor(s, label)
    dropped = ed.delete(edits.delete)
    planned = ed.planned()
    ed.values(planned, edits)
    ed.rows(planned, edits)
    for pt in ed.added(edits.add):
        planned.append(pt)
    graph = s.graph.serialize() if s.graph is not None else None
    p = finished_plan(srcs, dst, planned, dropped, graph, options, store)
    p.notes, p.warnings = ed.notes, ed.warnings
    p.saved_model = sm
    p.writes_saved_models = True
    p.from_saved_models = [] if in_place else source_saved_models(given, srcs)
    check_saved_model(p)
    return p


def _regexes(patterns: Iterable[str], what: str) -> list[re.Pattern]:
    out = []
    for p in patterns:
        try:
            out.append(re.compile(p))
        except (re.error, TypeError) as e:
            raise CheckpointError(f"bad {what} pattern {p!r}: {e}") from None
    return out


class _Editor:
    """The edits of one source, applied to its names, graph and planned tensors."""

    def __init__(self, s: Source, label: str):
        self.s = s
        self.label = label
        self.names = [n for n in s.ckpt.keys() if n != OBJECT_GRAPH_KEY]
        self.flat = source_flat_names(s) if s.graph is not None else {}
        self.by_flat = {f: n for n, f in self.flat.items()}
        self.edited: dict[str, str] = {}  # tensor -> the flag that edits it
        self.gone: dict[str, str] = {}  # tensor deleted -> why
        self.notes: list[str] = []  # said with the summary
        self.warnings: list[str] = []

    def err(self, message: str, tensor: str | None = None) -> CheckpointError:
        return CheckpointError(message, path=self.label, tensor=tensor)

    def resolve(self, name: str, what: str) -> str:
        """The tensor a flag names: a key, or a TF2 flat name."""
        found = name if name in self.s.ckpt and name != OBJECT_GRAPH_KEY else None
        found = found or self.by_flat.get(name)
        if found in self.gone:
            self.not_deleted([found], what)
        if found is None or found not in self.names:
            near = did_you_mean(name, [*self.names, *self.by_flat])
            raise self.err(f"{what}: no tensor {name!r}{near}")
        return found

    def matching(self, rx: re.Pattern, names: Iterable[str]) -> list[str]:
        return [n for n in names if rx.search(n) or (n in self.flat and rx.search(self.flat[n]))]

    def claim(self, name: str, what: str) -> None:
        if name in self.edited:
            raise self.err(f"{what} and {self.edited[name]} both edit it", name)
        self.edited[name] = what

    def delete(self, patterns: Sequence[str]) -> list[tuple[str, str, str]]:
        """Remove what ``patterns`` find (and, in a TF2 graph, their objects and slots)."""
        if not patterns:
            return []
        gone: dict[str, str] = {}
        for rx in _regexes(patterns, flag("delete")):
            hits = self.matching(rx, self.names)
            if not hits:
                raise self.err(f"{flag('delete')} {rx.pattern!r}: no tensor matches")
            for n in hits:
                gone.setdefault(n, f"deleted ({flag('delete')} {rx.pattern!r})")
        g = self.s.graph
        if g is None:  # a TF1 variable's slots are tensors of their own: they go with it
            for n in list(gone):
                for t in self.slots(n):
                    gone.setdefault(t, f"an optimizer slot of {n}, which was deleted")
        if g is not None:
            tied = {n: self.slots(n) for n in gone}  # before the graph loses them
            present = set(self.names)
            keys = g.checkpoint_keys()
            of_tensor = {t: k for k in keys for t in attribute_tensors(k, present)}
            ids = {keys[of_tensor[n]] for n in gone if n in of_tensor}
            for key in g.drop_nodes(ids):
                for t in attribute_tensors(key, present):
                    if t in present:
                        gone.setdefault(
                            t, "its object was deleted (a slot, or no longer reachable)"
                        )
            missing = g.missing_keys(present - set(gone))
            if missing:
                raise self.err(f"deleting leaves the object graph without {missing[0]!r}")
            self.no_listed_slots_left(tied, gone)
        self.names = [n for n in self.names if n not in gone]
        self.gone = gone
        return [(self.label, n, why) for n, why in gone.items()]

    def no_listed_slots_left(self, tied: Mapping[str, list[str]], gone: Mapping) -> None:
        """Refuse a deleted variable whose optimizer keeps its state in lists (Keras 3,
        tf.keras 2's own optimizers): its entries stay, and the lists are positional,
        so an optimizer of the model without the variable would not restore them."""
        for n, slots in tied.items():
            left = [t for t in slots if t not in gone]
            if left:
                raise self.err(
                    f"--delete: its optimizer keeps its state in lists ({left[0]!r}), "
                    "whose entries edit does not renumber; write the output with "
                    "--as-tf1, or graft it onto a template of the model without it",
                    n,
                )

    def planned(self) -> PlannedTensors:
        infos = self.s.ckpt.table(self.names)
        out = PlannedTensors()
        for k, n in enumerate(self.names):
            info = infos.info(k)
            out.add(0, n, n, info, info.dtype, info.nbytes)
        return out

    def whole(self, pt: PlannedTensor, what: str) -> np.dtype:
        """The numpy dtype of ``pt``, which an edit takes whole."""
        if pt.info.slices:
            raise self.err(f"{what}: takes whole tensors, not partitioned ones", pt.name)
        d = _dt.lookup(pt.info.dtype)
        if d.numpy is None or d is _dt.STRING:
            raise self.err(f"{what}: takes numeric and bool tensors, not {d.name}", pt.name)
        return np.dtype(d.numpy)

    def values(self, planned: PlannedTensors, edits: Edits) -> None:
        """``set``, ``fill`` and ``scale`` on the planned tensors they name."""
        by_name = {pt.name: pt for pt in planned}
        for kind, given in (("set", edits.set), ("fill", edits.fill), ("scale", edits.scale)):
            label = flag(kind)
            for name, value in given.items():
                pt = by_name[self.resolve(name, label)]
                what = f"{label} {name}"
                self.claim(pt.name, label)
                self.whole(pt, what)
                if kind == "set":
                    pt.edit = self.set_value(pt, value, what)
                elif kind == "fill":
                    pt.edit = self.fill_value(pt, value, what)
                else:
                    pt.edit = self.scale_value(pt, value, what)

    def set_value(self, pt: PlannedTensor, value, what: str):
        shape = pt.info.shape
        if isinstance(value, str) and value.startswith("@"):
            arr = open_npy(value[1:], what)
            if tuple(arr.shape) != shape:
                raise self.err(
                    f"{what}: {value[1:]} holds shape {list(arr.shape)}, the tensor has "
                    f"{list(shape)}",
                    pt.name,
                )
            return NpyFile(os.fspath(value[1:]))
        if isinstance(value, str):
            arr = literal_array(value, pt.info.dtype, what, self.label, pt.name)
        else:
            target = np.dtype(_dt.lookup(pt.info.dtype).array_dtype)
            arr = exact_cast(np.asarray(value), target, what, self.label, pt.name)
        if arr.shape != shape:
            raise self.err(
                f"{what}: the value has shape {list(arr.shape)}, the tensor {list(shape)}", pt.name
            )
        return Literal(np.ascontiguousarray(arr).tobytes())

    def fill_value(self, pt: PlannedTensor, value, what: str) -> Fill:
        text = {"zeros": "0", "ones": "1"}.get(str(value), str(value))
        if pt.info.dtype == "bool":
            text = {"0": "false", "1": "true"}.get(text, text)
        arr = literal_array(
            text.lower() if text in ("True", "False") else text,
            pt.info.dtype,
            what,
            self.label,
            pt.name,
        )
        if arr.shape != ():
            raise self.err(f"{what}: fills with zeros, ones or one number, not {value!r}", pt.name)
        return Fill(arr[()])

    def scale_value(self, pt: PlannedTensor, value, what: str) -> Scale:
        if not _dt.lookup(pt.info.dtype).is_floating:
            raise self.err(f"{what}: scales floating-point tensors, not {pt.info.dtype}", pt.name)
        try:
            factor = float(value)  # type: ignore[arg-type,unused-ignore]
        except (TypeError, ValueError):
            raise self.err(f"{what}: the factor {value!r} is not a number", pt.name) from None
        if not math.isfinite(factor):
            raise self.err(f"{what}: the factor must be finite", pt.name)
        return Scale(factor)

    def rows(self, planned: PlannedTensors, edits: Edits) -> None:
        """``resize`` and ``remap_rows``: each variable matched, and its slots."""
        by_name = {pt.name: pt for pt in planned}
        jobs: list[tuple[str, re.Pattern, Callable[[int], np.ndarray], str]] = []
        for pattern, spec in edits.resize.items():
            rows_text, _, init = str(spec).partition(":")
            what = f"{flag('resize')} {pattern}"
            if not rows_text.isdigit():
                raise self.err(f"{what}: takes REGEX=ROWS[:init], not ROWS {rows_text!r}")
            if int(rows_text) > MAX_ROWS:
                raise self.err(
                    f"{what}: {rows_text} rows is more than the {MAX_ROWS} an edit takes "
                    "along an axis"
                )
            rx = _regexes([pattern], flag("resize"))[0]
            jobs.append((what, rx, _resizer(int(rows_text)), init or edits.init))
        if edits.remap_rows:
            if edits.old_vocab is None or edits.new_vocab is None:
                raise self.err(
                    f"{flag('remap-rows')} needs {flag('old-vocab')} and {flag('new-vocab')}"
                )
            old_vocab = read_vocab(edits.old_vocab)
            new_vocab = read_vocab(edits.new_vocab)
            mapping = vocab_remapping(old_vocab, new_vocab)
            self.vocab_notes(old_vocab, new_vocab, mapping, edits)
            for rx in _regexes(edits.remap_rows, flag("remap-rows")):
                what = f"{flag('remap-rows')} {rx.pattern}"
                jobs.append(
                    (
                        what,
                        rx,
                        _checked_vocab(old_vocab, mapping, edits.old_vocab, what),
                        edits.init,
                    )
                )
        for what, rx, rows_for, init_text in jobs:
            init, std, seed = parse_init(init_text, what)
            hits = [n for n in self.matching(rx, by_name) if n not in self.slots_index()]
            if not hits:
                self.not_deleted(self.matching(rx, self.gone), what)
                raise self.err(f"{what}: no variable matches")
            for hit in hits:
                pt = by_name[hit]
                axis = self.axis(pt, edits.axis, what)
                rows = rows_for(pt.info.shape[axis])
                self.remap(pt, Rows(axis, rows, init, std, seed), what, init)
                self.no_loose_state(pt, axis, by_name, what)
                for slot in self.slots(pt.name):
                    if by_name[slot].info.shape != pt.info.shape:  # a factored one (Adafactor)
                        raise self.err(
                            f"{what}: its optimizer slot {slot!r} has shape "
                            f"{list(by_name[slot].info.shape)}, not the variable's "
                            f"{list(pt.info.shape)}: cannot take the same rows",
                            hit,
                        )
                    self.remap(by_name[slot], Rows(axis, rows), f"{what} (slot of {hit})", "zeros")

    def vocab_notes(
        self, old: list[bytes], new: list[bytes], mapping: np.ndarray, edits: Edits
    ) -> None:
        """How many new rows the old vocabulary gives (a note, a warning under half); an
        error when it gives none, unless ``edits.allow_no_overlap``."""
        kept = int(np.count_nonzero(mapping >= 0))
        what = flag("remap-rows")
        for path, tokens in ((edits.old_vocab, old), (edits.new_vocab, new)):
            if tokens[0].startswith(b"\xef\xbb\xbf"):
                self.warnings.append(
                    f"remap: {path} begins with a UTF-8 byte-order mark, which is part of "
                    f"its first token {token_text(tokens[0])!r} (as TensorFlow reads it)"
                )
        if kept == 0 and not edits.allow_no_overlap:
            raise self.err(
                f"{what}: no token of the new vocabulary {edits.new_vocab} is in the old one "
                f"{edits.old_vocab} (first tokens {token_text(new[0])!r} and "
                f"{token_text(old[0])!r}): every row would be new; "
                f"{option('allow_no_overlap=True', '--allow-no-overlap')} writes it anyway"
            )
        self.notes.append(
            f"remap: {kept} of {len(new)} rows from the old vocabulary, "
            f"{len(new) - kept} new; {len(old) - kept} old rows dropped"
        )
        if 2 * kept < len(new):
            self.warnings.append(
                f"remap: only {kept} of the {len(new)} tokens of {edits.new_vocab} are in "
                f"{edits.old_vocab}: the other rows are new ({edits.init}); are these the "
                "vocabularies the model was trained and will be used with?"
            )

    def not_deleted(self, names: Iterable[str], what: str) -> None:
        """Refuse an edit of a tensor that ``--delete`` removes."""
        for name in names:
            raise self.err(
                f"{what}: the same command deletes it ({self.gone[name]}); edit or delete "
                "a tensor, not both",
                name,
            )

    def no_loose_state(
        self, pt: PlannedTensor, axis: int, by_name: Mapping[str, PlannedTensor], what: str
    ) -> None:
        """Refuse when an optimizer holds a tensor tied to no variable that may hold this
        variable's rows (one of its dimensions that size: an Adafactor's factors), which
        would keep the old rows beside the new variable."""
        if self.s.graph is None:
            return
        if not hasattr(self, "_loose"):
            state = optimizer_state(self.s.graph)
            self._loose = sorted(k for k in state.other | state.untied if k in by_name)
        rows = pt.info.shape[axis]
        for key in self._loose:
            shape = by_name[key].info.shape
            if rows in shape:
                raise self.err(
                    f"{what}: the optimizer's {key!r} (shape {list(shape)}) is not a slot "
                    "tied to a variable, and may hold rows of this one (an optimizer "
                    "tfckpt does not know, e.g. Adafactor)",
                    pt.name,
                )

    def axis(self, pt: PlannedTensor, axis: int, what: str) -> int:
        shape = pt.info.shape
        if not -len(shape) <= axis < len(shape):
            raise self.err(f"{what}: axis {axis} is not one of shape {list(shape)}", pt.name)
        return axis % len(shape)

    def remap(self, pt: PlannedTensor, rows: Rows, what: str, init: str) -> None:
        dtype = self.whole(pt, what)
        self.claim(pt.name, what)
        if init != "zeros" and not _dt.lookup(pt.info.dtype).is_floating:
            raise self.err(f"{what}: init {init} takes floating-point tensors", pt.name)
        shape = list(pt.info.shape)
        shape[rows.axis] = len(rows.rows)
        pt.edit = rows
        pt.shape = tuple(shape)
        pt.bytes_out = math.prod(shape) * dtype.itemsize

    def slots_index(self) -> set[str]:
        """Every tensor that is some variable's optimizer slot."""
        if not hasattr(self, "_slot_set"):
            self._slot_set = {t for n in self.names for t in self.slots_of_name(n)}
        return self._slot_set

    def slots(self, name: str) -> list[str]:
        """The optimizer slots of the variable ``name``."""
        return [t for t in self.slots_of_name(name) if t != name]

    def slots_of_name(self, name: str) -> list[str]:
        """The optimizer slots of variable ``name``: TF2 slot variables of its node, or the
        entries of a Keras optimizer's lists that are its (see
        :func:`~tfckpt.format.optimizers.optimizer_state`); in a TF1 checkpoint the
        tensors ``NAME/SLOT`` of its shape, SLOT named as TF1 optimizers name them
        (``Adam``, ``Adam_1``, ``Momentum``, ``RMSProp_1``: capitalised, where a
        variable's own children are ``kernel``, ``bias``...)."""
        g = self.s.graph
        if g is None:
            if not hasattr(self, "_shapes"):
                self._shapes = {
                    n: i.shape for n, i in self.s.ckpt.table(self.names).infos().items()
                }
            shape = self._shapes.get(name)
            return [
                n
                for n in self.names
                if n.startswith(name + "/")
                and _TF1_SLOT.fullmatch(n[len(name) + 1 :])
                and self._shapes[n] == shape
            ]
        if not hasattr(self, "_slot_map"):
            # Slot variables, and the lists of Keras 3's and tf.keras 2's own optimizers
            # (``optimizer/_variables/N``), each tied to its variable as graft ties them.
            self._slot_map: dict[str, list[str]] = {}
            for slot, (var, _) in optimizer_state(g).slots.items():
                if slot in self.s.ckpt:
                    self._slot_map.setdefault(var, []).append(slot)
        return self._slot_map.get(name, [])

    def added(self, add: Mapping[str, object]) -> list[PlannedTensor]:
        """New tensors: ``add``'s, from ``.npy`` files or arrays."""
        out = []
        for name, value in add.items():
            what = f"{flag('add')} {name}"
            if self.s.graph is not None:
                raise self.err(
                    f"{what}: a new variable of a TF2 checkpoint needs an object-graph node; "
                    f"write a TF1 checkpoint with {option('as_tf1=True', '--as-tf1')}"
                )
            if not isinstance(name, str) or not name or name == OBJECT_GRAPH_KEY:
                raise self.err(f"{flag('add')}: {name!r} is not a tensor name")
            if name in self.names:
                raise self.err(f"{what}: the tensor exists (use {flag('set')})", name)
            if isinstance(value, str):
                path = value[1:] if value.startswith("@") else value
                arr = open_npy(path, what)
                edit: object = NpyFile(os.fspath(path))
            else:
                arr = np.ascontiguousarray(np.asarray(value))
                edit = Literal(arr.tobytes())
            try:
                dtype = _dt.lookup(arr.dtype)
            except ValueError:
                raise self.err(f"{what}: no TensorFlow dtype for {arr.dtype}", name) from None
            shape = tuple(int(n) for n in arr.shape)
            nbytes = math.prod(shape) * dtype.fixed_itemsize
            info = TensorInfo(name, dtype.name, shape, nbytes, 0, 0, None)
            out.append(PlannedTensor(0, name, name, info, dtype.name, nbytes, edit=edit))
        return out


def _resizer(n: int) -> Callable[[int], np.ndarray]:
    """The rows of a resize to ``n``: the first ``n`` old ones, then new ones."""

    def rows_for(old: int) -> np.ndarray:
        rows = np.arange(n, dtype=np.int64)
        rows[old:] = -1
        return rows

    return rows_for


def _checked_vocab(old_vocab: list[bytes], mapping: np.ndarray, path: str, what: str):
    def rows_for(old: int) -> np.ndarray:
        if old != len(old_vocab):
            raise CheckpointError(
                f"{what}: the old vocabulary has {len(old_vocab)} tokens, the tensor {old} rows",
                path=path,
            )
        return mapping

    return rows_for


def read_vocab(path) -> list[bytes]:
    """The tokens of a vocabulary file as TensorFlow's vocabulary readers take them
    (``GenerateVocabRemapping``, a ``TextFileInitializer``'s lines): one a line, the
    line's bytes without its ``\\n`` and one ``\\r`` before it (a Windows line end; a
    last line may end in either or neither). Spaces, tabs and a UTF-8 byte-order mark
    are part of a token, as there. An empty line or file, a token twice (TensorFlow
    refuses it in the old vocabulary, its lookup tables in any), or a file over
    :data:`MAX_VOCAB_BYTES` are errors."""
    path = os.fspath(path)
    lines = read_regular(path, "the vocabulary", MAX_VOCAB_BYTES).split(b"\n")
    last = lines.pop()  # what follows the last \n: nothing, or a line without one
    if last.endswith(b"\r"):
        last = last[:-1]
    if last:  # one that is empty ends the file, as in TensorFlow
        lines.append(last)
    tokens = [t[:-1] if t.endswith(b"\r") else t for t in lines]
    if not tokens:
        raise CheckpointError("the vocabulary is empty", path=path)
    seen: dict[bytes, int] = {}
    for i, tok in enumerate(tokens):
        if not tok:
            raise CheckpointError(
                f"line {i + 1} is empty (TensorFlow refuses a vocabulary with an empty line)",
                path=path,
            )
        if tok in seen:
            raise CheckpointError(
                f"token {token_text(tok)!r} is on lines {seen[tok] + 1} and {i + 1}", path=path
            )
        seen[tok] = i
    return tokens


def token_text(token: bytes) -> str:
    """A token as a message shows it (bytes that are no UTF-8 escaped)."""
    return token.decode("utf-8", "backslashreplace")


def vocab_remapping(old: Sequence[bytes], new: Sequence[bytes]) -> np.ndarray:
    """For each token of ``new``, its index in ``old``, or -1 (TensorFlow's
    ``generate_vocab_remapping``)."""
    index = {tok: i for i, tok in enumerate(old)}
    return np.array([index.get(tok, -1) for tok in new], dtype=np.int64)
