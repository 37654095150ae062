"""hf-electra, hf-electra-generator: Google's ELECTRA releases (model.ckpt, no config
file) to ElectraForPreTraining (the discriminator) and ElectraForMaskedLM (the generator).

The release ships no config: its sizes are in the code (configure_pretraining.py,
util/training_utils.py). The translator reads every size from the tensors' shapes, the
number of heads by the release's rule (hidden_size // 64, at least 1), and lays
``--config-value`` settings over them.
"""

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
    shown,
)

_LAYERS = "electra.encoder.layer."
_EMBEDDINGS = ("word", "position", "token_type")
_WORDS = "electra.embeddings.word_embeddings.weight"
_FFN_OUT = _LAYERS + "0.output.dense.weight"  # [hidden, intermediate]
# The release's activations by transformers' names: ELECTRA's "gelu" is the exact (erf)
# one (google-research/electra model/modeling.py), which transformers calls "gelu".
_ELECTRA_ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "tanh": "tanh", "linear": "linear"}
# The settings the release's BertConfig takes and ElectraConfig shares; those the
# shapes do not give are the release's defaults.
_DEFAULTS = {
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "initializer_range": 0.02,
}
_KEYS = (
    "vocab_size",
    "embedding_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
    *_DEFAULTS,
)


def _from_shapes(shapes: Shapes, network: str) -> dict[str, Any]:
    """The sizes the checkpoint's tensors (new names) give."""
    embeddings = [f"electra.embeddings.{k}_embeddings.weight" for k in _EMBEDDINGS]
    for name in embeddings:
        if name not in shapes:
            raise CheckpointError(f"the checkpoint has no {name.replace('.', '/')[:-7]}")
    if _FFN_OUT not in shapes:
        mind = " (the release trains a generator of its own)" if network == "generator" else ""
        raise CheckpointError(f"the checkpoint has no {network}/encoder/layer_0{mind}")
    (vocab, embedding), (positions, _), (types, _) = (shapes[n] for n in embeddings)
    hidden, intermediate = shapes[_FFN_OUT]
    layers = {n[len(_LAYERS) :].split(".")[0] for n in shapes if n.startswith(_LAYERS)}
    return {
        "vocab_size": vocab,
        "embedding_size": embedding,
        "hidden_size": hidden,
        "num_hidden_layers": len(layers),
        "num_attention_heads": max(1, hidden // 64),
        "intermediate_size": intermediate,
        "max_position_embeddings": positions,
        "type_vocab_size": types,
        **_DEFAULTS,
    }


def _electra_config(config: Mapping[str, Any], shapes: Shapes, arch: str) -> dict:
    unknown = sorted(set(config) - set(_KEYS))
    if unknown:
        raise CheckpointError(
            f"unknown ELECTRA setting(s) {', '.join(unknown)} (known: {', '.join(_KEYS)})"
        )
    network = "generator" if arch == "ElectraForMaskedLM" else "electra"
    settings = {**_from_shapes(shapes, network), **config}
    check_sizes(settings, _KEYS[:8])
    act = str(settings["hidden_act"]).lower()  # the release lowercases it
    if act not in _ELECTRA_ACTIVATIONS:
        raise CheckpointError(
            f"hidden_act {shown(act)}: not one of {', '.join(_ELECTRA_ACTIVATIONS)}"
        )
    if network == "generator" and act != "gelu":
        # transformers' generator head always applies gelu; the release's, hidden_act.
        raise CheckpointError(
            f"hidden_act {shown(act)}: transformers' ELECTRA generator takes gelu"
        )
    check_heads(settings, "hidden_size", "num_attention_heads")
    hidden = settings["hidden_size"]
    check_shapes(
        shapes,
        {
            _WORDS: (settings["vocab_size"], settings["embedding_size"]),
            _FFN_OUT: (hidden, settings["intermediate_size"]),
            "electra.embeddings.position_embeddings.weight": (
                settings["max_position_embeddings"],
                settings["embedding_size"],
            ),
            "electra.embeddings.token_type_embeddings.weight": (
                settings["type_vocab_size"],
                settings["embedding_size"],
            ),
        },
    )
    check_layers(shapes, _LAYERS, settings["num_hidden_layers"])
    if settings["embedding_size"] != hidden and "electra.embeddings_project.weight" not in shapes:
        raise CheckpointError(
            f"embedding_size {settings['embedding_size']} and hidden_size {hidden} differ, "
            f"but the checkpoint has no {network}/embeddings_project"
        )
    out: dict[str, Any] = {"architectures": [arch], "model_type": "electra"}
    out.update({k: settings[k] for k in _KEYS})
    out["hidden_act"] = _ELECTRA_ACTIVATIONS[act]
    out["layer_norm_eps"] = 1e-12  # the release's LayerNorm epsilon
    return out


PRESET = Preset(
    "hf-electra",
    "Google's ELECTRA (google-research/electra) discriminator to transformers' "
    "ElectraForPreTraining",
    ("electra/embeddings/word_embeddings",),
    (),
    lambda shapes: (
        "ElectraForPreTraining"
        if "discriminator_predictions.dense_prediction.weight" in shapes
        else "ElectraModel"
    ),
    _electra_config,
    needs_config=False,
)
# Only by name: a pretraining checkpoint is recognised as hf-electra's.
GENERATOR_PRESET = Preset(
    "hf-electra-generator",
    "Google's ELECTRA (google-research/electra) generator to transformers' ElectraForMaskedLM",
    (),
    (),
    lambda shapes: "ElectraForMaskedLM",
    _electra_config,
    needs_config=False,
)
