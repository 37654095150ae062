"""hf-gpt2: OpenAI's GPT-2 releases (model.ckpt, hparams.json) to GPT2LMHeadModel."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tfckpt.interop.presets.family import (
    Preset,
    Shapes,
    check_heads,
    check_layers,
    check_shapes,
    check_sizes,
    require,
)

# hparams.json's keys, by transformers' GPT2Config names.
_GPT2_KEYS = {
    "n_vocab": "vocab_size",
    "n_ctx": "n_positions",
    "n_embd": "n_embd",
    "n_head": "n_head",
    "n_layer": "n_layer",
}


def _gpt2_config(config: Mapping[str, Any], shapes: Shapes, arch: str) -> dict:
    require(config, _GPT2_KEYS, "the GPT-2 hparams")
    check_sizes(config, _GPT2_KEYS)
    check_heads(config, "n_embd", "n_head")
    out: dict[str, Any] = {"architectures": [arch], "model_type": "gpt2"}
    out.update({new: config[old] for old, new in _GPT2_KEYS.items()})
    # The release's model.py: gelu's tanh approximation, layer norm epsilon 1e-5.
    out.update(activation_function="gelu_new", layer_norm_epsilon=1e-5)
    out.update(bos_token_id=config["n_vocab"] - 1, eos_token_id=config["n_vocab"] - 1)
    n = config["n_embd"]
    check_shapes(
        shapes,
        {
            "transformer.wte.weight": (config["n_vocab"], n),
            "transformer.wpe.weight": (config["n_ctx"], n),
            "transformer.h.0.attn.c_attn.weight": (n, 3 * n),
        },
    )
    check_layers(shapes, "transformer.h.", config["n_layer"], "the hparams")
    return out


PRESET = Preset(
    "hf-gpt2",
    "OpenAI's GPT-2 (openai/gpt-2) to transformers' GPT2LMHeadModel",
    ("model/wte",),
    ("hparams.json",),
    lambda shapes: "GPT2LMHeadModel",
    _gpt2_config,
)
