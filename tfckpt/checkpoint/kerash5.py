"""Where a Keras 2 HDF5 file keeps its weights: layers, weight names, datasets, in order.

``model.save_weights("w.h5")`` (tf.keras 2, and Hugging Face's ``tf_model.h5``) lists
its layers in the root attribute ``layer_names``; each layer is a group whose
attribute ``weight_names`` lists its weights (``dense/kernel:0``), each a dataset at
``<layer>/<weight name>``; weights made by the model itself, outside every layer, are
in ``top_level_model_weights``. ``model.save("m.h5")`` puts the same under
``model_weights/`` beside ``optimizer_weights/``, a group with ``weight_names`` alone.
An attribute too long for an HDF5 object header is split into ``layer_names0``,
``layer_names1``... One layer's weights may also be another's (a layer shared by
two, as Hugging Face's heads share the embeddings): each lists it again. A layer
``layer_names`` lists twice (Keras writes no such file, but its loader pairs each
entry with the model's next layer) is listed twice, its group read once: reading a
list is linear in its length, however it repeats.

Only hard links are followed: a soft link, an external link (to another file) or a
user-defined one is refused where it is met, before anything behind it is opened.
Attributes are read only after their stored size is checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np
from h5py import h5a, h5l

from tfckpt.errors import CorruptCheckpointError, UnsupportedCheckpointError

MODEL_WEIGHTS = "model_weights"
OPTIMIZER_WEIGHTS = "optimizer_weights"
TOP_LEVEL = "top_level_model_weights"
# A names attribute larger than this is no list Keras wrote (it splits at 64 KiB).
_ATTRIBUTE_BYTES = 16 << 20


@dataclass
class Weight:
    """One weight as a layer lists it: its name (``dense/kernel:0``) and its dataset."""

    layer: str  # the layer's group name ("" in a group of weights alone)
    name: str
    path: str  # the dataset's path in the file
    dataset: Any  # the open h5py.Dataset


@dataclass
class Layout:
    """The layers of a Keras weights group, in the order it lists them, each with its
    weights in order (layers without weights included: Keras counts them too)."""

    group: str  # the group's path in the file ("/" for a save_weights file)
    layers: list[tuple[str, list[Weight]]]
    layered: bool  # False: one group of weights (optimizer_weights, or one layer's group)
    keras_version: str | None
    backend: str | None


def read_layout(f: h5py.File, inner: str, path: str) -> Layout:
    """The Keras weights in ``f`` (opened from ``path``): in the file's root (a
    ``save_weights`` file, or the ``model_weights`` of a whole model), or in the group
    ``inner`` names (``optimizer_weights``, one layer's group)."""
    where = "/"
    group: Any = f
    for part in _parts(inner, path, "the path inside the file"):
        where = _join(where, part)
        group = _group(_child(group, part, where, path), where, path)
    if not inner and not _has_names(f, "layer_names"):
        if _link_type(f, MODEL_WEIGHTS) is None:
            raise UnsupportedCheckpointError(_not_keras2(f), path=path)
        where = _join(where, MODEL_WEIGHTS)
        group = _group(_child(f, MODEL_WEIGHTS, where, path), where, path)
    version, backend = _text_attr(group, "keras_version"), _text_attr(group, "backend")
    if version is None and group is not f:
        version, backend = _text_attr(f, "keras_version"), _text_attr(f, "backend")
    names = _names(group, "layer_names", where, path)
    if names is None:
        weights = _names(group, "weight_names", where, path)
        if weights is None:
            raise UnsupportedCheckpointError(
                f"group {where} lists neither layers (layer_names) nor weights (weight_names)",
                path=path,
            )
        layer = "" if inner.rpartition("/")[2] == OPTIMIZER_WEIGHTS else inner.rpartition("/")[2]
        listed = [(layer, _weights(group, layer, where, weights, path))]
        return Layout(where, listed, False, version, backend)
    # A name listed again is the same layer again (Keras pairs each entry with a model
    # layer in order): its group is read once, and every entry shares one tuple.
    read: dict[str, tuple[str, list[Weight]]] = {}
    for name in dict.fromkeys(names):
        at = _join(where, name)
        layer = _group(_child(group, name, at, path), at, path)
        listed_names = _names(layer, "weight_names", at, path)
        if listed_names is None:
            raise CorruptCheckpointError(f"layer group {at} has no weight_names", path=path)
        read[name] = (name, _weights(layer, name, at, listed_names, path))
    layers = [read[name] for name in names]
    if _link_type(group, TOP_LEVEL) is not None and TOP_LEVEL not in read:
        at = _join(where, TOP_LEVEL)
        top = _group(_child(group, TOP_LEVEL, at, path), at, path)
        listed_names = _names(top, "weight_names", at, path) or []
        layers.append((TOP_LEVEL, _weights(top, TOP_LEVEL, at, listed_names, path)))
    return Layout(where, layers, True, version, backend)


def _weights(group, layer: str, where: str, names: list[str], path: str) -> list[Weight]:
    out = []
    found: dict[str, Weight] = {}  # a name listed again is the same dataset, looked up once
    for name in names:
        if name in found:
            out.append(found[name])
            continue
        at, node = where, group
        for part in _parts(name, path, f"weight name {name!r} of {where}"):
            if not isinstance(node, h5py.Group):
                raise CorruptCheckpointError(f"{at} is a dataset, not a group", path=path)
            at = _join(at, part)
            node = _child(node, part, at, path)
        if not isinstance(node, h5py.Dataset):
            raise CorruptCheckpointError(
                f"weight {name!r} of {where}: {at} is not a dataset", path=path
            )
        found[name] = Weight(layer, name, at, node)
        out.append(found[name])
    return out


def _parts(name: str, path: str, what: str) -> list[str]:
    if not name:
        return []
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise CorruptCheckpointError(f"{what} is no plain HDF5 path", path=path)
    return parts


def _join(where: str, name: str) -> str:
    return f"{where.rstrip('/')}/{name}"


def _link_type(group, name: str) -> int | None:
    try:
        return group.id.links.get_info(name.encode()).type
    except (KeyError, ValueError, RuntimeError, OSError):
        return None


_LINK_KINDS = {
    h5l.TYPE_SOFT: "a soft link",
    h5l.TYPE_EXTERNAL: "an external link (to another file)",
}


def _child(group, name: str, where: str, path: str):
    """``group[name]`` if a hard link names it; else an error saying what is there."""
    kind = _link_type(group, name)
    if kind is None:
        raise CorruptCheckpointError(f"{where} does not exist", path=path)
    if kind != h5l.TYPE_HARD:
        what = _LINK_KINDS.get(kind, "a user-defined link")
        raise UnsupportedCheckpointError(
            f"{where} is {what}: refused (tfckpt follows no link)", path=path
        )
    try:
        return group[name]
    except (KeyError, ValueError, RuntimeError, OSError) as e:
        raise CorruptCheckpointError(f"{where} cannot be opened: {e}", path=path) from None


def _group(node, where: str, path: str):
    if not isinstance(node, h5py.Group):
        raise CorruptCheckpointError(f"{where} is not a group", path=path)
    return node


def _has_names(group, name: str) -> bool:
    return _attr_exists(group, name) or _attr_exists(group, f"{name}0")


def _attr_exists(obj, name: str) -> bool:
    try:
        return bool(h5a.exists(obj.id, name.encode()))
    except (KeyError, ValueError, RuntimeError, OSError):
        return False


def _names(group, name: str, where: str, path: str) -> list[str] | None:
    """A list of names Keras wrote as the attribute ``name`` (or split over ``name0``,
    ``name1``...); None when there is none."""
    if _attr_exists(group, name):
        return _read_names(group, name, where, path)
    if not _attr_exists(group, f"{name}0"):
        return None
    out: list[str] = []
    k = 0
    while _attr_exists(group, f"{name}{k}"):
        out += _read_names(group, f"{name}{k}", where, path)
        k += 1
    return out


def _read_names(group, name: str, where: str, path: str) -> list[str]:
    what = f"attribute {name} of {where}"
    try:
        stored = _attr_bytes(group, name)
    except (KeyError, ValueError, RuntimeError, OSError) as e:
        raise CorruptCheckpointError(f"{what} cannot be read: {e}", path=path) from None
    if stored > _ATTRIBUTE_BYTES:
        raise CorruptCheckpointError(f"{what} takes {stored} bytes: no list of names", path=path)
    try:
        value = group.attrs[name]
    except (KeyError, ValueError, RuntimeError, OSError, TypeError) as e:
        raise CorruptCheckpointError(f"{what} cannot be read: {e}", path=path) from None
    value = np.asarray(value)
    if value.size == 0:
        return []  # Keras writes an empty list as an empty array of floats
    if value.ndim != 1:
        raise CorruptCheckpointError(f"{what} is not a list of names", path=path)
    if value.dtype.kind == "S":
        # Fixed-length strings, as Keras writes them: each distinct name decoded once,
        # in numpy, however often a hostile list repeats it.
        distinct, index = np.unique(value, return_inverse=True)
        names = [_name(item, what, path) for item in distinct.tolist()]
        return [names[k] for k in index.tolist()]
    decoded: dict[bytes | str, str] = {}
    out = []
    for item in value.tolist():
        if not isinstance(item, (bytes, str)):
            out.append(_name(item, what, path))  # an error
        elif item in decoded:
            out.append(decoded[item])
        else:
            out.append(decoded.setdefault(item, _name(item, what, path)))
    return out


def _name(item, what: str, path: str) -> str:
    """One element of a names attribute, as text; an error unless a non-empty name."""
    if isinstance(item, bytes):
        try:
            item = item.decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptCheckpointError(
                f"{what} holds a name that is not UTF-8", path=path
            ) from None
    if not isinstance(item, str) or not item:
        raise CorruptCheckpointError(f"{what} holds {item!r}, not a name", path=path)
    return item


def _attr_bytes(obj, name: str) -> int:
    """What an attribute's elements take as stored (from its dataspace and type alone)."""
    attr = h5a.open(obj.id, name.encode())
    return attr.get_space().get_simple_extent_npoints() * attr.get_type().get_size()


def _text_attr(obj, name: str) -> str | None:
    """A short text attribute (``keras_version``), or None."""
    if not _attr_exists(obj, name):
        return None
    try:
        if _attr_bytes(obj, name) > 4096:
            return None
        value = obj.attrs[name]
    except (KeyError, ValueError, RuntimeError, OSError, TypeError):
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def _not_keras2(f) -> str:
    """Why a file without ``layer_names`` is no Keras 2 weights file, in words."""
    if _link_type(f, "layers") is not None or _link_type(f, "vars") is not None:
        return (
            "a Keras 3 .weights.h5 file (layers/.../vars), not Keras 2 weights: "
            "load it with Keras 3 (model.load_weights)"
        )
    return "an HDF5 file without Keras weights (no layer_names, no model_weights group)"


def read_shard(f: h5py.File, path: str) -> list[Weight]:
    """The weights of one shard of Hugging Face's sharded TF weights (see
    :mod:`tfckpt.format.hfindex`): the root's ``layer_names`` lists datasets, each by its
    path in the file."""
    names = _names(f, "layer_names", "/", path)
    if names is None:
        raise UnsupportedCheckpointError(
            "no shard of Hugging Face's TF weights: no layer_names at its root", path=path
        )
    return _weights(f, "", "/", names, path)
