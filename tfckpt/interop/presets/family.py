"""What a preset is (:class:`Preset`) and the checks its config translators share.

Each family's module (``bert.py``, ``gpt2.py``...) makes one ``Preset`` of its rules
file (beside this module, named as the preset) and a translator of the release's
config into the ``config.json`` transformers reads.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tfckpt.errors import CheckpointError
from tfckpt.rewrite.rulesfile import load_rules

HERE = os.path.dirname(os.path.abspath(__file__))
Shapes = Mapping[str, tuple[int, ...]]  # new name -> shape written


# A release's config is a few kilobytes (one with a label map for every class of
# ImageNet-21k, a megabyte), nested a few levels deep.
MAX_CONFIG_BYTES = 8 << 20
MAX_DEPTH = 32
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(r"[\[\]{}]")


class Refused(ValueError):
    """Text that is JSON, but not what a config may hold (too deep, not a finite number)."""


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise Refused(f"{text} is not a finite number")
    return value


def _constant(name: str):
    raise Refused(f"{name} is not a number JSON has (a config holds finite numbers)")


def parse_json(text: str | bytes) -> Any:
    """JSON ``text``, with what a config may not hold refused (:class:`Refused`): nesting
    deeper than :data:`MAX_DEPTH` (looked for before parsing, which would otherwise
    recurse as deep), ``NaN``, ``Infinity`` and numbers too large for a float. Other
    errors are ``json``'s ``ValueError``."""
    if isinstance(text, bytes):
        if len(text) > MAX_CONFIG_BYTES:
            raise Refused(f"larger than {MAX_CONFIG_BYTES >> 20} MiB")
        text = text.decode(json.detect_encoding(text), "surrogatepass")  # as json.loads does
    depth = 0
    for bracket in _BRACKETS.finditer(_STRINGS.sub('""', text)):
        depth += 1 if bracket.group() in "[{" else -1
        if depth > MAX_DEPTH:
            raise Refused(f"nested deeper than {MAX_DEPTH} levels")
    return json.loads(text, parse_float=_finite, parse_constant=_constant)


def read_json(data: bytes) -> dict[str, Any]:
    """A JSON config file's object (``ValueError`` when it is not one; :class:`Refused`
    when it holds what a config may not: see :func:`parse_json`)."""
    value = parse_json(data)
    if not isinstance(value, dict):
        raise ValueError("the config must be a JSON object")
    return value


@dataclass(frozen=True)
class Preset:
    """One family's rules and config translation (see the package's text)."""

    name: str
    description: str
    markers: tuple[str, ...]  # source names that recognise the family (any of them)
    config_files: tuple[str, ...]  # the release's config, looked for beside the checkpoint
    architecture: Callable[[Shapes], str]  # the transformers class the weights make
    translate: Callable[[Mapping[str, Any], Shapes, str], dict]  # -> config.json
    # Per architecture, the source tensors it has no place for (left out): regexes.
    unused: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # The release's config file's contents -> its settings (ValueError when unreadable).
    read: Callable[[bytes], dict[str, Any]] = read_json
    # False: the translator makes the config from the shapes (and --config-value) alone.
    needs_config: bool = True
    # Recognises the family's names where no single name does (``--preset auto``).
    recognises: Callable[[list[str]], bool] | None = None
    # For a family whose names follow a convention, not a list: the rules made from the
    # source's names and shapes and the release's config, and the architecture it names.
    from_source: (
        Callable[[Mapping[str, tuple[int, ...]], Mapping[str, Any]], tuple[dict, str]] | None
    ) = None
    # Names every source of the family holds besides a marker: what tells it from a
    # family whose names are a subset of its own (RoFormer's: BERT's, less the
    # position embeddings).
    requires: tuple[str, ...] = ()
    # Names no source of the family holds, any of which tells it is of a family whose
    # names include its own (MobileBERT's: BERT's, with its bottlenecks and stacked FFNs).
    rejects: tuple[str, ...] = ()
    # Tensors the transformers model holds that the release computes rather than stores
    # (RoFormer's sinusoidal position table), made from the written config.json's
    # settings: {new name: float32 array}. A tensor the source holds wins over a made
    # one of the same name (XLNet's mask_emb, which only pretraining's graph has).
    made: Callable[[Mapping[str, Any]], dict[str, np.ndarray]] | None = None
    # Rows of written tensors the transformers model needs zero where the release's are
    # not (PEGASUS's padding token's embedding: transformers embeds the decoder's start
    # token, the padding id, where the release feeds zeros), from the written
    # config.json's settings: {new name: row indices along the first axis}.
    zeroed: Callable[[Mapping[str, Any]], dict[str, tuple[int, ...]]] | None = None

    @property
    def rules_file(self) -> str:
        return os.path.join(HERE, f"{self.name}.toml")

    def rules(self) -> dict[str, Any]:
        """The :class:`~tfckpt.Options` fields of the preset's rules file."""
        return load_rules(self.rules_file)

    def knows(self, names: list[str]) -> bool:
        """Whether the source ``names`` are of this preset's family."""
        present = set(names)
        if any(r not in present for r in self.requires):
            return False
        if any(r in present for r in self.rejects):
            return False
        if any(m in present for m in self.markers):
            return True
        return self.recognises is not None and self.recognises(names)


def shown(value: Any) -> str:
    """``repr(value)`` as an error shows it: at most 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_shapes(shapes: Shapes, want: Mapping[str, tuple[int, ...]]) -> None:
    """An error when the config gives a tensor another shape than the checkpoint."""
    for name, shape in want.items():
        if name in shapes and tuple(shapes[name]) != tuple(shape):
            raise CheckpointError(
                f"the config gives {name} the shape {list(shape)}, the checkpoint "
                f"{list(shapes[name])}"
            )


def check_layers(
    shapes: Shapes, prefix: str, want: int, what: str = "the config", unit: str = "layers"
) -> None:
    """An error when the tensors named ``prefix<N>.`` hold another number of layers
    (or of other ``unit``s: ALBERT's groups)."""
    layers = {n[len(prefix) :].split(".")[0] for n in shapes if n.startswith(prefix)}
    if len(layers) != want:
        raise CheckpointError(f"{what} says {want} {unit}, the checkpoint holds {len(layers)}")


def require(config: Mapping[str, Any], keys, what: str) -> None:
    """An error naming every key of ``keys`` that ``config`` lacks."""
    missing = [k for k in keys if k not in config]
    if missing:
        raise CheckpointError(
            f"{what} lacks {', '.join(missing)} (give them with --config-value KEY=VALUE)"
        )


def check_sizes(config: Mapping[str, Any], keys) -> None:
    """An error naming the first of ``keys`` in ``config`` that is not a positive integer."""
    for key in keys:
        value = config.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"{key} must be a positive integer, not {shown(value)}")


def check_heads(config: Mapping[str, Any], hidden: str, heads: str) -> None:
    """An error when ``config[heads]`` does not divide ``config[hidden]`` (both checked
    positive integers): the attention splits the hidden size into equal heads."""
    if config[hidden] % config[heads]:
        raise CheckpointError(
            f"{hidden} {config[hidden]} is not a multiple of {heads} {config[heads]}"
        )


def label_maps(labels: int) -> dict[str, dict]:
    """A classifier's ``id2label`` and ``label2id`` for ``labels`` classes, as
    transformers names them when a config gives no names."""
    return {
        "id2label": {str(i): f"LABEL_{i}" for i in range(labels)},
        "label2id": {f"LABEL_{i}": i for i in range(labels)},
    }
