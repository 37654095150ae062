"""hf-albert: Google's ALBERT releases (model.ckpt, albert_config.json) to AlbertFor*."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tfckpt.errors import CheckpointError
from tfckpt.interop.presets.family import (
    Preset,
    Shapes,
    check_heads,
    check_layers,
    check_shapes,
    check_sizes,
    label_maps,
    require,
    shown,
)

_GROUPS = "albert.encoder.albert_layer_groups."
_MAPPING = "albert.encoder.embedding_hidden_mapping_in.weight"


def _albert_architecture(shapes: Shapes) -> str:
    """The AlbertFor* class whose weights ``shapes`` (new names) are."""
    if "qa_outputs.weight" in shapes:
        return "AlbertForQuestionAnswering"
    if "classifier.weight" in shapes:
        return "AlbertForSequenceClassification"
    if "predictions.bias" in shapes:
        if "sop_classifier.classifier.weight" in shapes:
            return "AlbertForPreTraining"
        return "AlbertForMaskedLM"
    return "AlbertModel"


# albert_config.json's keys that AlbertConfig shares (the release's others, such as
# net_structure_type or down_scale_factor, are not read by its modeling.py).
_ALBERT_KEYS = (
    "vocab_size",
    "embedding_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "num_hidden_groups",
    "inner_group_num",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
)
# The release's activations by transformers' names: its "gelu" is the tanh approximation
# (google-research/albert modeling.py), which transformers calls "gelu_new".
_ALBERT_ACTIVATIONS = {"gelu": "gelu_new", "relu": "relu", "tanh": "tanh", "linear": "linear"}


def _albert_config(config: Mapping[str, Any], shapes: Shapes, arch: str) -> dict:
    require(config, _ALBERT_KEYS[:6], "the ALBERT config")
    check_sizes(config, _ALBERT_KEYS[:8])
    out: dict[str, Any] = {"architectures": [arch], "model_type": "albert"}
    out.update({k: config[k] for k in _ALBERT_KEYS if k in config})
    out.setdefault("num_hidden_groups", 1)
    out.setdefault("inner_group_num", 1)
    act = str(config.get("hidden_act", "gelu")).lower()  # the release lowercases it
    if act not in _ALBERT_ACTIVATIONS:
        raise CheckpointError(
            f"hidden_act {shown(act)}: not one of {', '.join(_ALBERT_ACTIVATIONS)}"
        )
    out["hidden_act"] = _ALBERT_ACTIVATIONS[act]
    out["layer_norm_eps"] = 1e-12  # the release's LayerNorm epsilon
    hidden, embedding = config["hidden_size"], config["embedding_size"]
    check_heads(config, "hidden_size", "num_attention_heads")
    if _MAPPING not in shapes:
        # The release projects only when the widths differ; transformers always does.
        raise CheckpointError(
            "the checkpoint has no bert/encoder/embedding_hidden_mapping_in (embedding_size "
            "equals hidden_size), which transformers' AlbertModel always applies"
        )
    layer = f"{_GROUPS}0.albert_layers.0."
    check_shapes(
        shapes,
        {
            "albert.embeddings.word_embeddings.weight": (config["vocab_size"], embedding),
            _MAPPING: (hidden, embedding),
            layer + "ffn.weight": (config["intermediate_size"], hidden),
        },
    )
    check_layers(shapes, _GROUPS, out["num_hidden_groups"], unit="groups (num_hidden_groups)")
    check_layers(
        shapes,
        f"{_GROUPS}0.albert_layers.",
        out["inner_group_num"],
        unit="inner groups (inner_group_num)",
    )
    if arch == "AlbertForSequenceClassification":
        out.update(label_maps(shapes["classifier.weight"][0]))
    return out


PRESET = Preset(
    "hf-albert",
    "Google's ALBERT (google-research/albert: pretraining, run_classifier, "
    "run_squad_v1) to transformers' AlbertFor*",
    # BERT's outer scope, ALBERT's shared layers: no BERT checkpoint has this name.
    ("bert/encoder/transformer/group_0/inner_group_0/attention_1/self/query/kernel",),
    ("albert_config.json",),
    _albert_architecture,
    _albert_config,
    # run_squad_v1's checkpoints keep the pretraining's pooler, which these lack.
    {a: ("^bert/pooler/",) for a in ("AlbertForQuestionAnswering", "AlbertForMaskedLM")},
)
