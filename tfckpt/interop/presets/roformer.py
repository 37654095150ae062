"""hf-roformer: RoFormer releases (ZhuiyiTechnology/roformer: bert_model.ckpt,
bert_config.json, trained with bert4keras) to RoFormerModel and RoFormerForMaskedLM.

The checkpoint holds Google BERT's names less the position embeddings, which is what
tells it from a BERT release (``hf-bert`` requires them). NEZHA's releases
(huawei-noah) hold the same names; their config says ``use_relative_position``, and
transformers 5 has no NEZHA model, so such a config is refused. transformers keeps the
rotary embedding's sinusoidal table as a weight; the preset computes it from the
written config (:func:`_sinusoidal_table`), as transformers' model initialises it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tfckpt.errors import CheckpointError
from tfckpt.interop.presets.family import (
    Preset,
    Shapes,
    check_heads,
    check_layers,
    check_shapes,
    check_sizes,
    require,
    shown,
)

_QUERY = "bert/encoder/layer_0/attention/self/query/kernel"
_POSITIONS = "bert/embeddings/position_embeddings"
_WORDS = "roformer.embeddings.word_embeddings.weight"
_PROJECT = "roformer.embeddings_project.weight"
TABLE = "roformer.encoder.embed_positions.weight"

# bert_config.json's keys that RoFormerConfig shares (bert4keras reads the same names).
_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
    "embedding_size",
)
# bert4keras's activations by transformers' names: its "gelu" is the exact (erf) one.
_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_erf": "gelu",
    "gelu_tanh": "gelu_new",
    "relu": "relu",
    "tanh": "tanh",
    "swish": "swish",
    "linear": "linear",
}
# bert4keras's defaults where bert_config.json says nothing.
_DEFAULTS = {"max_position_embeddings": 512, "type_vocab_size": 2}


def _architecture(shapes: Shapes) -> str:
    """The RoFormer class whose weights ``shapes`` (new names) are."""
    return "RoFormerForMaskedLM" if "cls.predictions.bias" in shapes else "RoFormerModel"


def _recognises(names: list[str]) -> bool:
    """BERT's layer names without BERT's position embeddings."""
    present = set(names)
    return _QUERY in present and _POSITIONS not in present


def _config(config: Mapping[str, Any], shapes: Shapes, arch: str) -> dict:
    if config.get("use_relative_position"):
        raise CheckpointError(
            "use_relative_position: this is a NEZHA config (huawei-noah), not RoFormer's; "
            "transformers 5 has no NEZHA model"
        )
    require(config, _KEYS[:5], "the RoFormer config")
    settings = {**_DEFAULTS, **config}
    check_sizes(settings, (*_KEYS[:5], "max_position_embeddings", "type_vocab_size"))
    check_heads(settings, "hidden_size", "num_attention_heads")
    hidden, heads = settings["hidden_size"], settings["num_attention_heads"]
    for key in ("attention_head_size", "attention_key_size"):
        if settings.get(key) not in (None, hidden // heads):
            raise CheckpointError(
                f"{key} {shown(settings[key])}: transformers' RoFormer takes hidden_size // "
                f"num_attention_heads ({hidden // heads})"
            )
    embedding = settings.get("embedding_size") or hidden
    check_sizes({"embedding_size": embedding}, ("embedding_size",))
    if (hidden // heads) % 2:
        raise CheckpointError(
            f"hidden_size // num_attention_heads is {hidden // heads}: the rotary embedding "
            "rotates pairs of a head's dimensions, so it must be even"
        )
    act = str(settings.get("hidden_act", "gelu")).lower()
    if act not in _ACTIVATIONS:
        raise CheckpointError(f"hidden_act {shown(act)}: not one of {', '.join(_ACTIVATIONS)}")
    out: dict[str, Any] = {"architectures": [arch], "model_type": "roformer"}
    out.update({k: settings[k] for k in _KEYS if k in settings})
    out["embedding_size"] = embedding
    out["hidden_act"] = _ACTIVATIONS[act]
    out["layer_norm_eps"] = 1e-12  # bert4keras's LayerNormalization epsilon
    out["rotary_value"] = False  # the release rotates queries and keys only
    check_shapes(
        shapes,
        {
            _WORDS: (settings["vocab_size"], embedding),
            "roformer.encoder.layer.0.intermediate.dense.weight": (
                settings["intermediate_size"],
                hidden,
            ),
            _PROJECT: (hidden, embedding),
        },
    )
    if embedding != hidden and _PROJECT not in shapes:
        raise CheckpointError(
            f"embedding_size {embedding} and hidden_size {hidden} differ, but the checkpoint "
            "has no bert/encoder/embedding_hidden_mapping_in"
        )
    if embedding == hidden and _PROJECT in shapes:
        raise CheckpointError(
            "the checkpoint has bert/encoder/embedding_hidden_mapping_in, which transformers' "
            f"RoFormer applies only where embedding_size differs from hidden_size ({hidden})"
        )
    check_layers(shapes, "roformer.encoder.layer.", settings["num_hidden_layers"])
    return out


def _sinusoidal_table(config: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """transformers' position table for ``config`` (a written config.json): row p holds
    sin(p·ω_i) for i < d/2, then cos(p·ω_i), ω_i = 10000^(-2i/d), d the head size
    (computed in float64, stored in float32, as RoFormer's model initialises it)."""
    keys = ("max_position_embeddings", "hidden_size", "num_attention_heads")
    require(config, keys, "the RoFormer config.json")
    check_sizes(config, keys)
    positions = config["max_position_embeddings"]
    width = config["hidden_size"] // config["num_attention_heads"]
    angles = np.arange(positions, dtype=np.float64)[:, None] / np.power(
        10000.0, 2 * np.arange(width // 2, dtype=np.float64) / width
    )
    table = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
    return {TABLE: table.astype(np.float32)}


PRESET = Preset(
    "hf-roformer",
    "RoFormer (ZhuiyiTechnology/roformer, bert4keras) to transformers' RoFormerModel and "
    "RoFormerForMaskedLM",
    (),
    ("bert_config.json",),
    _architecture,
    _config,
    recognises=_recognises,
    made=_sinusoidal_table,
)
