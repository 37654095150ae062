"""Hugging Face's index of sharded TensorFlow weights (``tf_model.h5.index.json``), parsed
and checked before any shard is opened.

transformers' TF ``save_pretrained(..., max_shard_size=...)`` (up to release 4.57) cut
``model.weights``, in order, into shards ``tf_model-00001-of-0000N.h5`` and wrote the
index ``{"metadata": {"total_size": ...}, "weight_map": {weight name: shard file}}``,
the weight names as Keras gives them (``tf_bert_model/bert/.../weight:0``). Each shard is
an HDF5 file whose root attribute ``layer_names`` lists its datasets, each at the weight's
name less its first component (the model's scope) unless the name holds ``model.`` or
has one component (:func:`dataset_name`).

The index comes from the file: a shard file must be a plain name in the index's own
directory (no separator, no ``..``), every weight maps to one file, and a key the JSON
repeats is refused, not overwritten.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tfckpt.errors import CorruptCheckpointError

INDEX_NAME = "tf_model.h5.index.json"
INDEX_SUFFIX = ".h5.index.json"
# A weight map of more names than this is no index of a model (and reading it is bounded).
MAX_INDEX_BYTES = 64 << 20


@dataclass(frozen=True)
class ShardIndex:
    """The weights of a sharded TF model: ``weight_map`` maps each weight's name (with
    ``:0``, as the index spells it) to its shard file; ``files`` lists the files once
    each, in the order the index first names them."""

    weight_map: dict[str, str]
    files: list[str]


def dataset_name(weight: str) -> str:
    """Where transformers put weight ``weight`` in its shard: its name less the model's
    scope (its first component), unless it holds ``model.`` or has one component."""
    if "model." in weight or "/" not in weight:
        return weight
    return weight.split("/", 1)[1]


def _no_repeats(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {key!r} twice (a weight in two shards?)")
        out[key] = value
    return out


def parse_index(data: bytes, path: str) -> ShardIndex:
    """The index ``data`` (the bytes of ``path``), checked: an error naming the file for
    anything transformers did not write."""
    if len(data) > MAX_INDEX_BYTES:
        raise CorruptCheckpointError(
            f"{len(data)} bytes: more than an index of weights takes", path=path
        )
    try:
        doc = json.loads(data.decode("utf-8"), object_pairs_hook=_no_repeats)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CorruptCheckpointError(f"not an index of shards: {e}", path=path) from None
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CorruptCheckpointError(
            "not an index of shards: no weight_map of weight names to files", path=path
        )
    files: dict[str, None] = {}
    for name, file in weight_map.items():
        if not isinstance(file, str) or not name:
            raise CorruptCheckpointError(
                f"weight_map maps {name!r} to {file!r}, not to a file name", path=path
            )
        if file in files:
            continue
        if (
            not file
            or file in (".", "..")
            or any(c in file for c in "/\\\0")
            or (len(file) > 1 and file[1] == ":")
        ):
            raise CorruptCheckpointError(
                f"weight_map names the shard {file!r} (for {name!r}): a shard must be a "
                "file in the index's own directory",
                path=path,
            )
        files[file] = None
    return ShardIndex(dict(weight_map), list(files))
