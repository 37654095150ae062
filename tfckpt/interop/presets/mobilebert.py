"""hf-mobilebert: Google's MobileBERT releases (google-research/google-research
mobilebert/: mobilebert.ckpt and its config, pretraining, run_classifier and run_squad
checkpoints) to transformers' MobileBertFor* and MobileBertModel.

The release keeps BERT's scopes and adds its own names (the markers below); a checkpoint
with none of them (no bottleneck, one feed-forward network, LayerNorm, no trigram input,
embeddings as wide as the layers) holds BERT's names and layout, and ``--preset auto``
takes it for ``hf-bert``'s. Its config file (``mobilebert_config.json``, or
``bert_config.json`` as the release's scripts name it) has ``modeling.BertConfig``'s keys,
whose defaults are not transformers': every setting is written out. transformers'
model holds two tensors the release may lack, which the preset makes (:func:`_made`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tfckpt.errors import CheckpointError
from tfckpt.interop.presets.family import (
    Preset,
    Shapes,
    check_layers,
    check_shapes,
    check_sizes,
    label_maps,
    require,
    shown,
)

# Names only MobileBERT's releases hold, any one of which every release but a plain
# BERT-shaped one has: the trigram input transformation (or the projection of narrow
# embeddings), the bottlenecks, NoNorm's FakeLayerNorm, the stacked FFNs, the MLM head's
# extra output columns.
MARKERS = (
    "bert/embeddings/embedding_transformation/kernel",
    "bert/encoder/layer_0/bottleneck/input/dense/kernel",
    "bert/embeddings/FakeLayerNorm/gamma",
    "bert/encoder/layer_0/ffn_layer_0/intermediate/dense/kernel",
    "cls/predictions/extra_output_weights",
)

_EMBEDDINGS = "mobilebert.embeddings."
_LAYER = "mobilebert.encoder.layer.0."
_TRANSFORM = _EMBEDDINGS + "embedding_transformation."
_EXTRA = "cls.predictions.dense.weight"
_POOLER = "mobilebert.pooler.dense.weight"
_WITH_POOLER = (
    "MobileBertForPreTraining",
    "MobileBertForNextSentencePrediction",
    "MobileBertForSequenceClassification",
    "MobileBertModel",
)
_WITH_MLM = ("MobileBertForPreTraining", "MobileBertForMaskedLM")

# modeling.BertConfig's settings transformers' MobileBertConfig shares, by the same names.
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
    "trigram_input",
    "use_bottleneck",
    "intra_bottleneck_size",
    "use_bottleneck_attention",
    "key_query_shared_bottleneck",
    "num_feedforward_networks",
    "normalization_type",
    "classifier_activation",
)
# modeling.BertConfig's defaults (embedding_size and intra_bottleneck_size: hidden_size).
_DEFAULTS: dict[str, Any] = {
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512,
    "type_vocab_size": 16,
    "initializer_range": 0.02,
    "trigram_input": False,
    "use_bottleneck": False,
    "use_bottleneck_attention": False,
    "key_query_shared_bottleneck": False,
    "num_feedforward_networks": 1,
    "normalization_type": "layer_norm",
    "classifier_activation": True,
}
_SWITCHES = (
    "trigram_input",
    "use_bottleneck",
    "use_bottleneck_attention",
    "key_query_shared_bottleneck",
    "classifier_activation",
)
# The release's activations (modeling.get_activation, lower-cased) by transformers' names:
# its "gelu" is the tanh approximation.
_ACTIVATIONS = {
    "gelu": "gelu_new",
    "relu": "relu",
    "relu6": "relu6",
    "tanh": "tanh",
    "linear": "linear",
}
_NORMS = ("layer_norm", "no_norm")


def _architecture(shapes: Shapes) -> str:
    """The MobileBERT class whose weights ``shapes`` (new names) are."""
    if "qa_outputs.weight" in shapes:
        return "MobileBertForQuestionAnswering"
    if "classifier.weight" in shapes:
        return "MobileBertForSequenceClassification"
    if "cls.predictions.bias" in shapes:
        if "cls.seq_relationship.weight" in shapes:
            return "MobileBertForPreTraining"
        return "MobileBertForMaskedLM"
    if "cls.seq_relationship.weight" in shapes:
        return "MobileBertForNextSentencePrediction"
    return "MobileBertModel"


def _settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The release's config with modeling.BertConfig's defaults, checked."""
    require(config, _KEYS[:5], "the MobileBERT config")
    s = {**_DEFAULTS, **config}
    s.setdefault("embedding_size", s["hidden_size"])
    s.setdefault("intra_bottleneck_size", s["hidden_size"])
    for key in ("embedding_size", "intra_bottleneck_size"):  # null: hidden_size, as the release
        if s[key] is None:
            s[key] = s["hidden_size"]
    check_sizes(
        s,
        (
            *_KEYS[:5],
            "max_position_embeddings",
            "type_vocab_size",
            "embedding_size",
            "intra_bottleneck_size",
            "num_feedforward_networks",
        ),
    )
    for key in _SWITCHES:
        if not isinstance(s[key], bool):
            raise CheckpointError(f"{key} must be true or false, not {shown(s[key])}")
    act = s["hidden_act"]
    if not isinstance(act, str) or act.lower() not in _ACTIVATIONS:
        raise CheckpointError(f"hidden_act {shown(act)}: not one of {', '.join(_ACTIVATIONS)}")
    s["hidden_act"] = _ACTIVATIONS[act.lower()]
    if s["normalization_type"] not in _NORMS:
        raise CheckpointError(
            f"normalization_type {shown(s['normalization_type'])}: transformers' MobileBERT "
            f"has {' and '.join(_NORMS)} only"
        )
    hidden, heads = s["hidden_size"], s["num_attention_heads"]
    inner = s["intra_bottleneck_size"] if s["use_bottleneck"] else hidden
    if inner % heads:
        what = "intra_bottleneck_size" if s["use_bottleneck"] else "hidden_size"
        raise CheckpointError(f"{what} {inner} is not a multiple of num_attention_heads {heads}")
    if s["use_bottleneck_attention"]:
        # The release takes the queries, keys and values from bottleneck/input then, and
        # makes no bottleneck/attention; transformers would make one.
        s["key_query_shared_bottleneck"] = False
    elif s["use_bottleneck"] and not s["key_query_shared_bottleneck"] and inner != hidden:
        raise CheckpointError(
            f"use_bottleneck without use_bottleneck_attention or key_query_shared_bottleneck: "
            f"the release attends from the hidden states (hidden_size {hidden}) with heads of "
            f"intra_bottleneck_size {inner} (the IB-BERT teacher's layout); transformers' "
            "MobileBERT takes queries and keys of intra_bottleneck_size only"
        )
    return s


def _config(config: Mapping[str, Any], shapes: Shapes, arch: str) -> dict:
    s = _settings(config)
    hidden, emb, inner = s["hidden_size"], s["embedding_size"], s["intra_bottleneck_size"]
    if not s["use_bottleneck"]:
        inner = hidden
    out: dict[str, Any] = {"architectures": [arch], "model_type": "mobilebert"}
    out.update({k: s[k] for k in _KEYS})
    out["layer_norm_eps"] = 1e-12  # the release's LayerNorm epsilon
    check_shapes(
        shapes,
        {
            _EMBEDDINGS + "word_embeddings.weight": (s["vocab_size"], emb),
            _EMBEDDINGS + "position_embeddings.weight": (s["max_position_embeddings"], hidden),
            _EMBEDDINGS + "token_type_embeddings.weight": (s["type_vocab_size"], hidden),
            _TRANSFORM + "weight": (hidden, emb * (3 if s["trigram_input"] else 1)),
            _LAYER + "bottleneck.input.dense.weight": (inner, hidden),
            _LAYER + "attention.self.query.weight": (inner, inner),
            _LAYER + "attention.self.value.weight": (
                inner,
                inner if s["use_bottleneck_attention"] else hidden,
            ),
            _LAYER + "intermediate.dense.weight": (s["intermediate_size"], inner),
            _EXTRA: (hidden - emb, s["vocab_size"]),
        },
    )
    transformed = s["trigram_input"] or emb != hidden
    _check_held(
        shapes,
        _TRANSFORM + "weight",
        transformed,
        "bert/embeddings/embedding_transformation",
        "trigram_input is on or embedding_size differs from hidden_size",
    )
    _check_held(
        shapes,
        _LAYER + "bottleneck.input.dense.weight",
        s["use_bottleneck"],
        "bert/encoder/layer_0/bottleneck/input",
        "use_bottleneck is on",
    )
    _check_held(
        shapes,
        _LAYER + "bottleneck.attention.dense.weight",
        s["use_bottleneck"] and s["key_query_shared_bottleneck"],
        "bert/encoder/layer_0/bottleneck/attention",
        "use_bottleneck and key_query_shared_bottleneck are on (and use_bottleneck_attention off)",
    )
    if arch in _WITH_POOLER:
        _check_held(
            shapes,
            _POOLER,
            s["classifier_activation"],
            "bert/pooler",
            "classifier_activation is on",
        )
    if arch in _WITH_MLM and emb != hidden:
        _check_held(
            shapes,
            _EXTRA,
            True,
            "cls/predictions/extra_output_weights",
            "embedding_size differs from hidden_size",
        )
    check_layers(
        shapes,
        _LAYER + "ffn.",
        s["num_feedforward_networks"] - 1,
        "num_feedforward_networks",
        "feed-forward networks before the last",
    )
    check_layers(shapes, "mobilebert.encoder.layer.", s["num_hidden_layers"])
    if arch == "MobileBertForSequenceClassification":
        out.update(label_maps(shapes["classifier.weight"][0]))
    return out


def _check_held(shapes: Shapes, name: str, wanted: bool, source: str, when: str) -> None:
    """An error when the checkpoint holds ``name`` (the release's ``source``) and the
    config says it has none, or the other way round: the release makes it where ``when``."""
    if wanted and name not in shapes:
        raise CheckpointError(f"the config says {when}, but the checkpoint has no {source}")
    if not wanted and name in shapes:
        raise CheckpointError(
            f"the checkpoint has {source}, which the release makes only where {when}; "
            "the config says otherwise"
        )


def _made(config: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """What transformers' model holds and a release may not, for ``config`` (a written
    config.json): the embeddings' transformation where the release has none (trigram
    input off, embeddings as wide as the layers; transformers keeps the layer and skips
    it, so it is written as the identity), and the MLM head's extra output columns where
    there are none (an empty [0, vocab_size] matrix)."""
    keys = ("hidden_size", "embedding_size", "vocab_size", "trigram_input")
    require(config, keys, "the MobileBERT config.json")
    hidden, emb = config["hidden_size"], config["embedding_size"]
    out: dict[str, np.ndarray] = {}
    if not config["trigram_input"] and emb == hidden:
        out[_TRANSFORM + "weight"] = np.eye(hidden, dtype=np.float32)
        out[_TRANSFORM + "bias"] = np.zeros(hidden, np.float32)
    if emb == hidden and set(config.get("architectures") or ()) & set(_WITH_MLM):
        out[_EXTRA] = np.zeros((0, config["vocab_size"]), np.float32)
    return out


PRESET = Preset(
    "hf-mobilebert",
    "Google's MobileBERT (google-research/google-research mobilebert: pretraining and "
    "distillation, run_classifier, run_squad) to transformers' MobileBertFor*",
    MARKERS,
    ("mobilebert_config.json", "bert_config.json"),
    _architecture,
    _config,
    # add_pooling_layer=False: run_squad's checkpoints keep the pretraining's pooler.
    {a: ("^bert/pooler/",) for a in ("MobileBertForQuestionAnswering", "MobileBertForMaskedLM")},
    made=_made,
)
