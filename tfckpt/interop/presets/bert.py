"""hf-bert: Google's BERT releases (bert_model.ckpt, bert_config.json) to BertFor*."""

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
from tfckpt.interop.presets.mobilebert import MARKERS as MOBILEBERT_MARKERS


def _bert_architecture(shapes: Shapes) -> str:
    """The BertFor* class whose weights ``shapes`` (new names) are."""
    if "qa_outputs.weight" in shapes:
        return "BertForQuestionAnswering"
    if "classifier.weight" in shapes:
        return "BertForSequenceClassification"
    if "cls.predictions.bias" in shapes:
        if "cls.seq_relationship.weight" in shapes:
            return "BertForPreTraining"
        return "BertForMaskedLM"
    return "BertModel"


# bert_config.json's keys are BertConfig's own names.
_BERT_KEYS = (
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
)
# The release's activations by transformers' names: its "gelu" is the tanh approximation
# (google-research/bert modeling.py), which transformers calls "gelu_new".
_BERT_ACTIVATIONS = {"gelu": "gelu_new", "relu": "relu", "tanh": "tanh"}


def _bert_config(config: Mapping[str, Any], shapes: Shapes, arch: str) -> dict:
    require(config, _BERT_KEYS[:5], "the BERT config")
    check_sizes(config, (*_BERT_KEYS[:5], "max_position_embeddings", "type_vocab_size"))
    check_heads(config, "hidden_size", "num_attention_heads")
    out: dict[str, Any] = {"architectures": [arch], "model_type": "bert"}
    out.update({k: config[k] for k in _BERT_KEYS if k in config})
    act = config.get("hidden_act", "gelu")
    if act not in _BERT_ACTIVATIONS:
        raise CheckpointError(f"hidden_act {shown(act)}: not one of {', '.join(_BERT_ACTIVATIONS)}")
    out["hidden_act"] = _BERT_ACTIVATIONS[act]
    out["layer_norm_eps"] = 1e-12  # the release's LayerNorm epsilon
    check_shapes(
        shapes,
        {
            "bert.embeddings.word_embeddings.weight": (config["vocab_size"], config["hidden_size"]),
            "bert.encoder.layer.0.intermediate.dense.weight": (
                config["intermediate_size"],
                config["hidden_size"],
            ),
        },
    )
    check_layers(shapes, "bert.encoder.layer.", config["num_hidden_layers"])
    if arch == "BertForSequenceClassification":
        out.update(label_maps(shapes["classifier.weight"][0]))
    return out


PRESET = Preset(
    "hf-bert",
    "Google's BERT (google-research/bert: pretraining, run_classifier, run_squad) "
    "to transformers' BertFor*",
    # Not bert/embeddings/*: ALBERT's checkpoints have those too (its layers are not layer_N).
    ("bert/encoder/layer_0/attention/self/query/kernel",),
    ("bert_config.json",),
    _bert_architecture,
    _bert_config,
    # run_squad's checkpoints keep the pretraining's pooler, which these lack.
    {a: ("^bert/pooler/",) for a in ("BertForQuestionAnswering", "BertForMaskedLM")},
    # RoFormer's (and NEZHA's) releases have BERT's names less these.
    requires=("bert/embeddings/position_embeddings",),
    # MobileBERT's releases have BERT's names and these.
    rejects=MOBILEBERT_MARKERS,
)
