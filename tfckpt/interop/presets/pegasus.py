"""hf-pegasus: PEGASUS (google-research/pegasus: model.ckpt-N, pre-trained or fine-tuned
on a summarization set) to PegasusForConditionalGeneration.

The release ships no config file: its hyperparameters are in its code (params/
public_params.py: 16 encoder and 16 decoder layers of 1024, 16 heads, a filter of 4096,
ReLU, dropout 0.1; the vocabulary of its SentencePiece model, 96 103 ids, padding 0 and
end 1). The checkpoint's shapes give the vocabulary, the widths and the layers; the
number of heads, which no shape shows, is the release's 16 unless ``--config-value
num_heads=N`` says otherwise. ``max_position_embeddings`` (the size of the position
tables transformers keeps; the release computes its timing signal for any length) is
1024, the longest input of the release's tasks, unless given. Settings given by the
release's hyperparameter names (``hidden_size``, ``filter_size``, ``num_encoder_layers``,
``num_decoder_layers``, ``vocab_size``) are checked against the checkpoint.

What transformers' model holds and the release does not store is made from the written
config (:func:`_made`): the zero biases of the attention projections (the release's
have none), ``final_logits_bias`` (zeros), and the encoder's and decoder's position
tables, computed as the release's timing signal is (``layers/timing.py``: timescales
10000^(-i/(d/2-1)), in float32 steps; transformers' own initialisation divides by d/2
instead, which the table stored overrides). The padding token's embedding row is written
zero (:func:`_zeroed`): transformers embeds the decoder's start token, the padding id,
where the release feeds a zero vector; as transformers' own converter did, this gives
the padding token the logit 0. One difference remains in transformers' model itself: its
LayerNorms divide by sqrt(var + 1e-5), the release's (tf.contrib's layer_norm) by
sqrt(var + 1e-12), which PegasusConfig cannot set.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from tfckpt.errors import CheckpointError
from tfckpt.interop.presets.family import (
    Preset,
    Shapes,
    check_heads,
    check_layers,
    check_sizes,
    require,
    shown,
)

_QUERY = "encoder/layer_0/self_attention/q_proj/kernel"
_EMBEDDINGS = "embeddings/weights"
SHARED = "model.shared.weight"
POSITIONS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")
ARCHITECTURE = "PegasusForConditionalGeneration"

# The release's hyperparameters (public_params.py) where the checkpoint cannot say.
_HEADS = 16
_MAX_POSITIONS = 1024
_DROPOUT = 0.1
# Its hyperparameter names that the checkpoint's shapes fix: the new name and axis.
_FIXED = {
    "vocab_size": (SHARED, 0),
    "hidden_size": (SHARED, 1),
    "filter_size": ("model.encoder.layers.0.fc1.weight", 0),
}

_STACKS = {"encoder": "num_encoder_layers", "decoder": "num_decoder_layers"}
# What --config-value may give: the release's hyperparameter names.
_KNOWN = ("num_heads", "max_position_embeddings", "dropout", *_FIXED, *_STACKS.values())


def _architecture(shapes: Shapes) -> str:
    return ARCHITECTURE


def _layers(shapes: Shapes, stack: str) -> int:
    prefix = f"model.{stack}.layers."
    return len({n[len(prefix) :].split(".")[0] for n in shapes if n.startswith(prefix)})


def _config(config: Mapping[str, Any], shapes: Shapes, arch: str) -> dict:
    if SHARED not in shapes or len(shapes[SHARED]) != 2:
        raise CheckpointError(f"the checkpoint has no {_EMBEDDINGS} of [vocab, hidden_size]")
    vocab, hidden = shapes[SHARED]
    unknown = sorted(set(config) - set(_KNOWN))
    if unknown:
        raise CheckpointError(
            f"{', '.join(unknown)}: not a setting of the release's (known: {', '.join(_KNOWN)})"
        )
    settings = {"num_heads": _HEADS, "max_position_embeddings": _MAX_POSITIONS, **config}
    check_sizes(settings, ("num_heads", "max_position_embeddings", *_FIXED, *_STACKS.values()))
    for key, (name, axis) in _FIXED.items():
        if key in settings and name in shapes and settings[key] != shapes[name][axis]:
            raise CheckpointError(
                f"{key} {settings[key]}: the checkpoint's {name} has the shape {list(shapes[name])}"
            )
    layers = {}
    for stack, key in _STACKS.items():
        layers[stack] = _layers(shapes, stack)
        if not layers[stack]:
            raise CheckpointError(f"the checkpoint has no {stack} layers ({stack}/layer_0/...)")
        if key in settings:
            check_layers(shapes, f"model.{stack}.layers.", settings[key])
    heads = settings["num_heads"]
    check_heads({"hidden_size": hidden, "num_heads": heads}, "hidden_size", "num_heads")
    if hidden % 2:
        raise CheckpointError(
            f"hidden_size {hidden} is odd: the release's timing signal is sines and cosines "
            "of half of it each"
        )
    dropout = settings.get("dropout", _DROPOUT)
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)):
        raise CheckpointError(f"dropout must be a number, not {shown(dropout)}")
    ffn = {s: shapes.get(f"model.{s}.layers.0.fc1.weight", (0,))[0] for s in _STACKS}
    out: dict[str, Any] = {
        "architectures": [arch],
        "model_type": "pegasus",
        "vocab_size": vocab,
        "d_model": hidden,
        "encoder_layers": layers["encoder"],
        "decoder_layers": layers["decoder"],
        "encoder_attention_heads": heads,
        "decoder_attention_heads": heads,
        "encoder_ffn_dim": ffn["encoder"],
        "decoder_ffn_dim": ffn["decoder"],
        "max_position_embeddings": settings["max_position_embeddings"],
        "activation_function": "relu",
        # The release applies its one dropout rate everywhere (residuals, attention
        # weights, the ReLU's output).
        "dropout": dropout,
        "attention_dropout": dropout,
        "activation_dropout": dropout,
        "scale_embedding": True,  # the embedding times sqrt(hidden_size)
        "is_encoder_decoder": True,
        "tie_word_embeddings": True,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "decoder_start_token_id": 0,
        "forced_eos_token_id": 1,
    }
    _check_complete(shapes, out)
    return out


def _stored_shapes(c: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """The tensors of PegasusForConditionalGeneration of config ``c`` that the release
    stores (by new name): their shapes."""
    d = c["d_model"]
    out: dict[str, tuple[int, ...]] = {SHARED: (c["vocab_size"], d)}
    for stack in _STACKS:
        out[f"model.{stack}.layer_norm.weight"] = out[f"model.{stack}.layer_norm.bias"] = (d,)
        ff = c[f"{stack}_ffn_dim"]
        attentions = ("self_attn",) + (("encoder_attn",) if stack == "decoder" else ())
        for i in range(c[f"{stack}_layers"]):
            layer = f"model.{stack}.layers.{i}."
            for attention in attentions:
                for m in ("q_proj", "k_proj", "v_proj", "out_proj"):
                    out[f"{layer}{attention}.{m}.weight"] = (d, d)
                for p in ("weight", "bias"):
                    out[f"{layer}{attention}_layer_norm.{p}"] = (d,)
            for p in ("weight", "bias"):
                out[f"{layer}final_layer_norm.{p}"] = (d,)
            out[f"{layer}fc1.weight"], out[f"{layer}fc1.bias"] = (ff, d), (ff,)
            out[f"{layer}fc2.weight"], out[f"{layer}fc2.bias"] = (d, ff), (d,)
    return out


def _check_complete(shapes: Shapes, c: Mapping[str, Any]) -> None:
    """An error when a tensor the model has is missing, or has another shape (every
    layer as wide as the first: transformers' Pegasus has one width)."""
    want = _stored_shapes(c)
    missing = sorted(set(want) - set(shapes))
    if missing:
        more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        raise CheckpointError(
            f"the checkpoint lacks {', '.join(missing[:3])}{more}, which a PEGASUS of "
            f"{c['encoder_layers']} encoder and {c['decoder_layers']} decoder layers has"
        )
    for name, shape in want.items():
        if tuple(shapes[name]) != shape:
            raise CheckpointError(
                f"{name} has the shape {list(shapes[name])}, not {list(shape)} as "
                f"{SHARED} and the first layer's feed-forward make it"
            )


def timing_signal(positions: int, width: int) -> np.ndarray:
    """The release's timing signal (``layers/timing.py``) for positions 0 to
    ``positions - 1``: [sin(p·s_i) for i < n, then cos(p·s_i)], n = width/2,
    s_i = exp(-i·ln(10000)/max(n-1, 1)), computed in float32 steps as the release's
    graph does (the increment, the exponent's argument, each angle rounded to float32;
    exp, sin and cos rounded once from float64)."""
    n = width // 2
    increment = np.float32(math.log(1.0e4)) / np.float32(max(n - 1, 1))
    exponent = np.arange(n, dtype=np.float32) * -increment
    scales = np.exp(exponent.astype(np.float64)).astype(np.float32)
    angles = np.arange(positions, dtype=np.float32)[:, None] * scales[None, :]
    angles64 = angles.astype(np.float64)
    table = np.concatenate([np.sin(angles64), np.cos(angles64)], axis=1)
    return table.astype(np.float32)


def _made(config: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """What the written ``config`` (config.json) makes that the release does not store:
    zero biases of every attention projection, ``final_logits_bias``, the two position
    tables (see the module's text)."""
    keys = ("vocab_size", "d_model", "encoder_layers", "decoder_layers")
    require(config, (*keys, "max_position_embeddings"), "the PEGASUS config.json")
    check_sizes(config, (*keys, "max_position_embeddings"))
    d = config["d_model"]
    table = timing_signal(config["max_position_embeddings"], d)
    out = {POSITIONS[0]: table, POSITIONS[1]: table}
    zeros = np.zeros(d, np.float32)
    for stack in _STACKS:
        attentions = ("self_attn",) + (("encoder_attn",) if stack == "decoder" else ())
        for i in range(config[f"{stack}_layers"]):
            for attention in attentions:
                for m in ("q_proj", "k_proj", "v_proj", "out_proj"):
                    out[f"model.{stack}.layers.{i}.{attention}.{m}.bias"] = zeros
    out["final_logits_bias"] = np.zeros((1, config["vocab_size"]), np.float32)
    return out


def _zeroed(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """The padding token's row of the shared embedding (see the module's text)."""
    pad = config.get("pad_token_id", 0)
    if isinstance(pad, bool) or not isinstance(pad, int) or pad < 0:
        raise CheckpointError(f"pad_token_id must be a token id, not {shown(pad)}")
    return {SHARED: (pad,)}


PRESET = Preset(
    "hf-pegasus",
    "PEGASUS (google-research/pegasus) to transformers' PegasusForConditionalGeneration",
    (_QUERY,),
    (),
    _architecture,
    _config,
    needs_config=False,
    requires=(_EMBEDDINGS,),
    made=_made,
    zeroed=_zeroed,
)
