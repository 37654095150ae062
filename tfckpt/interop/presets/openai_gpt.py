"""hf-openai-gpt: the original OpenAI GPT release (openai/finetune-transformer-lm's
``model/`` directory of numpy shards, read by :mod:`tfckpt.checkpoint.npyshards`) to
OpenAIGPTLMHeadModel.

The release has no config file: the sizes come from the shapes (``vocab_size`` the
token embedding's rows, ``n_positions`` the position embedding's, ``n_embd``,
``n_layer`` the blocks'), the rest from ``train.py``'s defaults, which trained it:
``n_head`` 12, ``afn`` gelu (its tanh approximation, which transformers' GPT names
``gelu``), dropout rates 0.1, layer-norm epsilon 1e-5. ``--config-value`` takes
``train.py``'s argument names (``n_head``, ``afn``, ``embd_pdrop``, ``attn_pdrop``,
``resid_pdrop``) for a model trained otherwise; ``n_embd``, ``n_layer``, ``n_vocab`` and
``n_ctx`` given are checked against the shapes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tfckpt.errors import CheckpointError
from tfckpt.interop.presets.family import (
    Preset,
    Shapes,
    check_heads,
    check_sizes,
    shown,
)

_TOKENS = "transformer.tokens_embed.weight"
_POSITIONS = "transformer.positions_embed.weight"
# train.py's argparse defaults, by its names.
_DEFAULTS: dict[str, Any] = {
    "n_head": 12,
    "afn": "gelu",
    "embd_pdrop": 0.1,
    "attn_pdrop": 0.1,
    "resid_pdrop": 0.1,
}
# train.py's act_fns by transformers' OpenAI GPT names (its ACT_FNS): train.py's gelu is
# the tanh approximation, which that model calls "gelu"; its swish is x * sigmoid(x).
_ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "swish": "swish"}


def _config(config: Mapping[str, Any], shapes: Shapes, arch: str) -> dict:
    settings = {**_DEFAULTS, **config}
    for key in ("embd_pdrop", "attn_pdrop", "resid_pdrop"):
        value = settings[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise CheckpointError(f"{key} must be a rate from 0 to 1, not {shown(value)}")
    if _TOKENS not in shapes or _POSITIONS not in shapes:
        raise CheckpointError("the checkpoint holds no model/we/tokens and model/we/positions")
    vocab, n = shapes[_TOKENS]
    positions = shapes[_POSITIONS][0]
    layers = {k.split(".")[2] for k in shapes if k.startswith("transformer.h.")}
    found = {"n_vocab": vocab, "n_ctx": positions, "n_embd": n, "n_layer": len(layers)}
    for key, value in found.items():
        if key in settings and settings[key] != value:
            raise CheckpointError(
                f"{key} {shown(settings[key])}: the checkpoint's shapes make it {value}"
            )
    settings.update(found)
    check_sizes(settings, ("n_head",))
    check_heads(settings, "n_embd", "n_head")
    afn = settings["afn"]
    if afn not in _ACTIVATIONS:
        raise CheckpointError(f"afn {shown(afn)}: not one of {', '.join(_ACTIVATIONS)}")
    return {
        "architectures": [arch],
        "model_type": "openai-gpt",
        "vocab_size": vocab,
        "n_positions": positions,
        "n_embd": n,
        "n_layer": len(layers),
        "n_head": settings["n_head"],
        "afn": _ACTIVATIONS[afn],
        "embd_pdrop": settings["embd_pdrop"],
        "attn_pdrop": settings["attn_pdrop"],
        "resid_pdrop": settings["resid_pdrop"],
        "layer_norm_epsilon": 1e-5,  # train.py's _norm
    }


PRESET = Preset(
    "hf-openai-gpt",
    "The original OpenAI GPT (openai/finetune-transformer-lm's numpy shards) to "
    "transformers' OpenAIGPTLMHeadModel",
    ("model/we/tokens",),
    (),
    lambda shapes: "OpenAIGPTLMHeadModel",
    _config,
    needs_config=False,
)
