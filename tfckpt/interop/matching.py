"""Suggesting a rules file: which tensor of a source checkpoint becomes which name of a
target layout, for ``tfckpt export SRC OUT --rules FILE.toml`` once reviewed.

:func:`match` reads names, dtypes and shapes only (indexes and headers, never values):
of the source, a TensorFlow checkpoint (V1, V2, or TF2 by the readable names export
gives it); of the target, a safetensors file or the ``.index.json`` of sharded ones, an
npz, a TensorFlow checkpoint, or a weight list (``[[name, shape], ...]`` or
``{name: shape}``, in a ``.json`` file or given in Python: ``[(w.path, list(w.shape))
for w in model.weights]``). The source's training state (:data:`TRAINING_STATE`, a TF2
optimizer's) is proposed for ``exclude``, never paired; a target's is no name to fill.
How pairs are chosen, and what cannot be told, is :mod:`tfckpt.interop.pairing`'s text.

:meth:`Match.rules` is the rules file: per pair a comment (confidence, why) over an
exact ``[[map]]`` and the ``[[permute]]`` or ``[[reshape]]`` of its new name, and
``squeeze`` and ``exclude`` lists; the tensors no target takes are excluded and listed
at the end with the target names none fills. The text is read back and checked to do
what the pairs say before it is returned.

>>> m = match("bert/bert_model.ckpt", "hf/model.safetensors")
>>> m.write("bert.toml")  # review it, then
>>> tfckpt.export("bert/bert_model.ckpt", "out.safetensors", **load_rules("bert.toml"))
"""

from __future__ import annotations

import json
import operator
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library
    import tomli as tomllib

from tfckpt.checkpoint.opening import open_checkpoint
from tfckpt.errors import CheckpointError, CheckpointNotFoundError, option
from tfckpt.format import dtypes as _dt
from tfckpt.format.objectgraph import OBJECT_GRAPH_KEY
from tfckpt.interop.export import tf2_names
from tfckpt.interop.importing import tensor_file_entries
from tfckpt.interop.pairing import Pair, Tensor, pair
from tfckpt.io.commit import Commit
from tfckpt.io.storage import StorageOptions, normalize, storage_for
from tfckpt.rewrite.options import Options
from tfckpt.rewrite.rules import UNMAPPED, NameRules, ShapeRules
from tfckpt.rewrite.rulesfile import rules_from

# Training state by name: (regex on a source's readable name, what it is).
TRAINING_STATE = (
    (r"/adam_[mv]$", "Adam moment"),
    (r"/Adam(_\d+)?$", "Adam slot"),
    (r"AdamWeightDecayOptimizer", "Adam slot"),
    (r"/(Momentum|RMSProp|Adagrad|Adadelta|Ftrl|LAMB)(_\d+)?$", "optimizer slot"),
    (r"_slot_", "optimizer slot"),
    (r"(^|/)(global_step|save_counter)$", "step counter"),
    (r"(^|/)\w*_power$", "optimizer power"),
    (r"/ExponentialMovingAverage$", "moving average (tfckpt average --use-ema takes them)"),
)
_OPT = "optimizer state (export leaves it out)"


@dataclass
class Match:
    """What :func:`match` found: ``pairs`` (in the target's order), the source's training
    state (``excluded``: name, why), its tensors no target name takes (``unpaired``) and
    the target's names no source fills (``unfilled``); ``exclude``: the patterns that
    leave the training state out; ``order_trust``: how far both sides store tensors in
    one order (0 to 1: how much order weighed); ``cast``: the one dtype the target holds
    when it differs from the source's."""

    source: str
    target: str
    pairs: list[Pair]
    excluded: list[tuple[str, str]]
    exclude: list[str]
    unpaired: list[Tensor]
    unfilled: list[Tensor]
    order_trust: float = 0.0
    cast: str | None = None

    def rules(self, min_confidence: float = 0.0) -> str:
        """The rules file (TOML): ``exclude`` (training state, then the unpaired),
        ``squeeze``, and per pair a comment (confidence, why) over its ``[[map]]``
        (exact, anchored) and ``[[permute]]``/``[[reshape]]`` on its new name. Pairs
        under ``min_confidence`` are written commented out, their tensors left unmapped,
        so that an export names them until they are reviewed. Checked by loading it."""
        if not self.pairs:
            raise CheckpointError(f"no tensor fits a name of {self.target}", path=self.source)
        low = sum(p.confidence < 0.5 for p in self.pairs)
        held = sum(p.confidence < min_confidence for p in self.pairs)
        if held == len(self.pairs):
            best = max((p.confidence for p in self.pairs), default=0.0)
            raise CheckpointError(
                f"no pair reaches confidence {min_confidence:g} (the highest is {best:.2f}): "
                "a rules file without one would rename nothing",
                path=self.source,
            )
        out = [
            f"# Suggested by tfckpt match: {_c(self.source)} -> {_c(self.target)}",
            f"# {len(self.pairs)} pairs ({low} under confidence 0.5, {held} commented out "
            f"under {min_confidence:g}), {len(self.excluded)} training state, "
            f"{len(self.unpaired)} unpaired, {len(self.unfilled)} target names unfilled;",
            f"# Both store their tensors in one order to {self.order_trust:.2f} (0: order only"
            " broke ties).",
            "# Review the pairs, lowest confidence first; then try the file with",
            "#   tfckpt export SRC OUT.safetensors --rules THIS.toml --dry-run",
            f"description = {_toml(f'{self.source} to {self.target}, by tfckpt match')}",
        ]
        if self.cast:
            out.append(f"cast = {_toml(self.cast)}")
        exclude = [f"    {_toml(p)}," for p in self.exclude]
        if exclude:
            exclude.insert(0, "    # training state: not weights")
        if self.unpaired:
            exclude.append("    # unpaired: no target name fits (listed at the end)")
            exclude += [f"    {_toml(_exact(t.name))}," for t in self.unpaired]
        squeeze = [f"    {_toml(_exact(p.target.name))}," for p in self.pairs if p.squeeze]
        for key, lines in (("exclude", exclude), ("squeeze", squeeze)):
            if lines:
                out += [f"{key} = [", *lines, "]"]
        for p in self.pairs:
            lines = [
                "[[map]]",
                f"match = {_toml(_exact(p.source.name))}",
                f"to = {_toml(p.target.name.replace(chr(92), chr(92) * 2))}",
            ]
            if p.permute:
                lines += ["[[permute]]", f"match = {_toml(_exact(p.target.name))}"]
                lines.append(f"axes = {list(p.permute)}")
            if p.reshape:
                lines += ["[[reshape]]", f"match = {_toml(_exact(p.target.name))}"]
                lines.append(f"shape = {list(p.reshape)}")
            out += ["", f"# {p.confidence:.2f}  {_c(p.why)}"]
            if p.confidence < min_confidence:
                out.append("# under the confidence asked for: uncomment once reviewed")
                lines = ["# " + line for line in lines]
            out += lines
        for title, tensors in (
            ("Source tensors no target name takes (excluded above)", self.unpaired),
            ("Target names no source tensor fills", self.unfilled),
        ):
            if tensors:
                out += ["", f"# {title}:"]
                out += [f"#   {_c(t.name)}  {_shape(t.shape)}" for t in tensors]
        text = "\n".join(out) + "\n"
        self._check(text, min_confidence)
        return text

    def _check(self, text: str, min_confidence: float) -> None:
        """The file read back must do what the pairs say: a safeguard against a name
        the TOML or the regexes could not carry."""
        options = Options(**rules_from(tomllib.loads(text), "the rules written"))
        naming, shaping = NameRules.of(options), ShapeRules.of(options)
        for p in self.pairs:
            s, t = p.source, p.target
            got = naming.drop_reason(s.name)
            if p.confidence < min_confidence:
                ok = got == UNMAPPED
            else:
                _, shape = shaping.decide(t.name, s.shape)
                ok = got is None and naming.new_name(s.name) == t.name
                ok = ok and (shape or s.shape) == t.shape
            if not ok:
                raise CheckpointError("the rules written would not give this pair", tensor=s.name)
        left = [t.name for t in self.unpaired] + [n for n, why in self.excluded if why != _OPT]
        for name in left:
            if naming.drop_reason(name) != "excluded":
                raise CheckpointError("the rules written would not exclude it", tensor=name)

    def write(
        self,
        path,
        *,
        min_confidence: float = 0.0,
        overwrite: bool = False,
        storage_options: StorageOptions | None = None,
    ) -> str:
        """Write :meth:`rules` to ``path`` (made visible at once, by the commit every
        writer uses); an existing file is replaced only with ``overwrite``. The path."""
        path = normalize(path)
        store = storage_for(path, storage_options)
        if store.exists(path) and not overwrite:
            raise CheckpointError(
                f"the rules file already exists (use {option('overwrite=True', '--overwrite')})",
                path=path,
            )
        data = self.rules(min_confidence).encode("utf-8")
        commit = Commit(store, path, overwrite=overwrite, what="a rules file")
        try:
            directory = store.dirname(path)
            if directory and not store.isdir(directory):
                commit.make_directory(directory)
            commit.write_last(data)
            commit.publish()
        except BaseException:
            commit.discard()
            raise
        return path

    def to_dict(self) -> dict:
        """The match as plain data (``--json``)."""

        def tensor(t: Tensor) -> dict:
            return {"name": t.name, "shape": list(t.shape), "dtype": t.dtype}

        return {
            "source": self.source,
            "target": self.target,
            "order_trust": round(self.order_trust, 4),
            "cast": self.cast,
            "pairs": [
                {
                    "source": p.source.name,
                    "target": p.target.name,
                    "confidence": round(p.confidence, 4),
                    "transform": p.transform,
                    "permute": list(p.permute) if p.permute else None,
                    "shape": list(p.source.shape),
                    "new_shape": list(p.target.shape),
                    "why": p.why,
                }
                for p in self.pairs
            ],
            "excluded": [{"name": n, "why": why} for n, why in self.excluded],
            "unpaired": [tensor(t) for t in self.unpaired],
            "unfilled": [tensor(t) for t in self.unfilled],
        }


def match(src, target, *, storage_options: StorageOptions | None = None) -> Match:
    """Pair the tensors of the checkpoint ``src`` with the names of ``target`` (see the
    module's text for what a target may be and how pairs are chosen).

    >>> m = match("gpt2/model.ckpt", "hf/gpt2/")  # model.safetensors there
    >>> p = m.pairs[2]
    >>> p.source.name, p.target.name, p.transform
    ('model/h0/attn/c_attn/w', 'h.0.attn.c_attn.weight', 'squeeze')
    """
    label = normalize(src)
    found, optimizer = checkpoint_tensors(src, storage_options)
    sources, excluded, patterns = _without_training_state(found, optimizer)
    if isinstance(target, str) or hasattr(target, "__fspath__"):
        target_label = normalize(target)
        targets = target_tensors(target, storage_options)
    else:
        target_label = "the weight list given"
        targets = weight_list(target, target_label)
    pairs, trust = pair(sources, targets)
    paired_s = {p.source.name for p in pairs}
    paired_t = {p.target.name for p in pairs}
    unpaired = [s for s in sources if s.name not in paired_s]
    kept = paired_s | {s.name for s in unpaired}
    exclude: list[str] = []
    for pattern in patterns:  # one pattern for a kind of slot, unless it would catch a weight
        rx = re.compile(pattern)
        if any(rx.search(n) for n in kept):
            exclude += [_exact(n) for n, _ in excluded if rx.search(n) and n not in optimizer]
        else:
            exclude.append(pattern)
    return Match(
        label,
        target_label,
        sorted(pairs, key=lambda p: p.target.order),
        excluded,
        list(dict.fromkeys(exclude)),
        unpaired,
        [t for t in targets if t.name not in paired_t],
        trust,
        _cast(pairs),
    )


def checkpoint_tensors(path, storage_options=None) -> tuple[list[Tensor], set[str]]:
    """A checkpoint's tensors by the names export gives them (a TF2 tensor's readable
    one), in the order their values are stored; and the names of a TF2 optimizer's
    state, which export leaves out. Read from the index alone."""
    with open_checkpoint(path, mmap=False, storage_options=storage_options) as ckpt:
        readable: dict[str, str] = {}
        optimizer: set[str] = set()
        if OBJECT_GRAPH_KEY in ckpt:
            readable, optimizer = tf2_names(ckpt, keep_keys=False)
        infos = [ckpt.info(k) for k in ckpt.keys() if k != OBJECT_GRAPH_KEY]
    stored = sorted(
        range(len(infos)),
        key=lambda k: (infos[k].shard is None, infos[k].shard or 0, infos[k].offset or 0, k),
    )
    out = []
    for rank, k in enumerate(stored):
        i = infos[k]
        out.append(Tensor(readable.get(i.name, i.name), tuple(i.shape), i.dtype, rank))
    return out, {readable.get(k, k) for k in optimizer}


def target_tensors(target, storage_options=None) -> list[Tensor]:
    """The names to fill: a safetensors file or index (or a directory holding
    ``model.safetensors[.index.json]``, as Hugging Face saves), an npz, a weight list
    (``.json``), else a checkpoint (without its training state)."""
    path = normalize(target)
    store = storage_for(path, storage_options)
    if store.isdir(path):
        for name in ("model.safetensors.index.json", "model.safetensors"):
            if store.isfile(store.join(path, name)):
                path = store.join(path, name)
                break
    if path.endswith((".safetensors", ".index.json", ".npz", ".json")):
        if not store.isfile(path):
            raise CheckpointNotFoundError("no such file", path=path)
        if not path.endswith(".json") or path.endswith(".index.json"):
            entries = tensor_file_entries(path, storage_options=storage_options)
            return [Tensor(e.name, tuple(e.shape), e.dtype, k) for k, e in enumerate(entries)]
        try:
            data = json.loads(store.read_bytes(path))
        except (ValueError, RecursionError) as e:
            raise CheckpointError(f"not a JSON weight list: {e}", path=path) from None
        return weight_list(data, path)
    found, optimizer = checkpoint_tensors(path, storage_options)
    return _without_training_state(found, optimizer)[0]


def weight_list(data, label: str) -> list[Tensor]:
    """``[[name, shape], ...]`` or ``{name: shape}`` as tensors of unknown dtype; anything
    else is an error naming ``label``."""
    items = list(data.items()) if isinstance(data, Mapping) else data
    if not isinstance(items, Sequence) or isinstance(items, (str, bytes)) or not items:
        raise CheckpointError(
            "a weight list is [[name, shape], ...] or {name: shape}, with at least one", path=label
        )
    out: dict[str, Tensor] = {}
    for k, item in enumerate(items):
        try:
            name, shape = item
            if not isinstance(name, str) or isinstance(shape, (str, bytes)):
                raise TypeError
            if any(isinstance(d, bool) for d in shape):
                raise TypeError
            dims = tuple(operator.index(d) for d in shape)
            if any(d < 0 for d in dims):
                raise TypeError
        except (TypeError, ValueError):
            raise CheckpointError(
                f"weight list entry {k + 1} is not a name and a shape of sizes: {str(item)[:80]}",
                path=label,
            ) from None
        if name in out:
            raise CheckpointError("the weight list names it twice", path=label, tensor=name)
        out[name] = Tensor(name, dims, None, k)
    return list(out.values())


def _without_training_state(
    tensors: list[Tensor], optimizer: set[str]
) -> tuple[list[Tensor], list[tuple[str, str]], list[str]]:
    """The tensors that are not training state; those that are (name, why); the
    :data:`TRAINING_STATE` patterns that found some."""
    kept: list[Tensor] = []
    excluded: list[tuple[str, str]] = []
    fired: dict[str, None] = {}
    for t in tensors:
        if t.name in optimizer:
            excluded.append((t.name, _OPT))
            continue
        hit = next(((rx, why) for rx, why in TRAINING_STATE if re.search(rx, t.name)), None)
        if hit is None:
            kept.append(t)
        else:
            excluded.append((t.name, f"training state: {hit[1]}"))
            fired[hit[0]] = None
    return kept, excluded, list(fired)


def _cast(pairs: list[Pair]) -> str | None:
    """The target's floating-point dtype, when it holds one alone and the source differs."""
    floats = [
        (p.source.dtype, p.target.dtype)
        for p in pairs
        if _floating(p.source.dtype) and _floating(p.target.dtype)
    ]
    wanted = {t for _, t in floats}
    if len(wanted) == 1 and any(s != t for s, t in floats):
        return wanted.pop()
    return None


def _floating(dtype: str | None) -> bool:
    return dtype is not None and _dt.lookup(dtype).kind == "float"


def _shape(shape) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


def _exact(name: str) -> str:
    return "^" + re.escape(name) + "$"


def _c(text: str) -> str:
    """``text`` safe in a comment: what is not printable escaped."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in str(text))


def _toml(text: str) -> str:
    """A TOML string of ``text``: literal where it can be (regexes read as written)."""
    if any(0xD800 <= ord(c) <= 0xDFFF for c in text):
        raise CheckpointError("a name that is not UTF-8 cannot be written in a rules file")
    if "'" not in text and all(c.isprintable() for c in text):
        return f"'{text}'"
    special = {'"': '\\"', "\\": "\\\\"}
    escaped = "".join(special.get(c, c if c.isprintable() else f"\\U{ord(c):08x}") for c in text)
    return f'"{escaped}"'
