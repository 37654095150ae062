"""hf-gpt-neo: EleutherAI's GPT-Neo (Mesh TensorFlow: model.ckpt-N and the run's
config.json) to GPTNeoForCausalLM.

The run's config is a gpt-neo ``configs/*.json``: ``n_vocab``, ``n_ctx``, ``n_embd``,
``n_head``, ``n_layer``, ``attention_types`` (``[[["global", "local"], 12]]``: kinds
repeated, one a layer), ``local_attention_radius`` (256 when absent, as
models/layers.py has it), ``activation_function`` and the dropout rates. Options of
gpt-neo that transformers' GPT-Neo has no place for (rotary or axial position
embeddings, an untied output layer, scale norm, ReZero, gated or macaron feed-forwards,
mixture-of-experts layers, memory key-values, shared layers, attention other than
global and local, masked-LM training) are refused, naming the setting.
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
    require,
    shown,
)

# The run's config keys, by transformers' GPTNeoConfig names.
_SIZES = {
    "n_vocab": "vocab_size",
    "n_ctx": "max_position_embeddings",
    "n_embd": "hidden_size",
    "n_head": "num_heads",
    "n_layer": "num_layers",
}
_RATES = {
    "res_dropout": "resid_dropout",
    "embed_dropout": "embed_dropout",
    "attn_dropout": "attention_dropout",
}
# models/activations.py's names (mtf's functions) by transformers': mtf.gelu is the tanh
# approximation, transformers' gelu_new.
_ACTIVATIONS = {
    "gelu": "gelu_new",
    "relu": "relu",
    "silu": "silu",
    "tanh": "tanh",
    "sigmoid": "sigmoid",
}
_KINDS = ("global", "local")
# Settings of gpt-neo whose models transformers' GPT-Neo cannot compute: what they do.
_UNSUPPORTED = {
    "rotary_emb": "rotary position embeddings",
    "axial_pos_emb": "axial position embeddings",
    "no_weight_tie": "an output layer of its own, without ln_f",
    "scalenorm": "scale norm",
    "rezero": "ReZero residuals",
    "mlp_glu": "a gated feed-forward",
    "macaron": "macaron feed-forwards",
    "moe_layers": "mixture-of-experts layers",
    "num_mem_kv": "memory key-values",
    "share_parameters": "one block shared by every layer",
    "mlm_training": "masked-LM (not causal) training",
}


def _attention_layers(value: Any, layers: int) -> list[str]:
    """gpt-neo's ``attention_types`` (``[[kinds, repeats], ...]``), one kind a layer,
    checked: transformers' GPT-Neo has global and local attention only."""
    form = 'expected [[["global", "local"], N], ...]'
    if not isinstance(value, list) or not value:
        raise CheckpointError(f"attention_types = {shown(value)}: {form}")
    out: list[str] = []
    for item in value:
        ok = isinstance(item, list) and len(item) == 2 and isinstance(item[0], list)
        repeats = item[1] if ok else None
        if not ok or isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
            raise CheckpointError(f"attention_types = {shown(value)}: {form}")
        for kind in item[0]:
            if kind not in _KINDS:
                raise CheckpointError(
                    f"attention_types has {shown(kind)} layers: transformers' GPT-Neo has "
                    "global and local attention only"
                )
        out += list(item[0]) * repeats
    if len(out) != layers:
        raise CheckpointError(f"attention_types names {len(out)} layers, n_layer is {layers}")
    return out


def _gpt_neo_config(config: Mapping[str, Any], shapes: Shapes, arch: str) -> dict:
    require(config, [*_SIZES, "attention_types"], "the GPT-Neo config")
    check_sizes(config, _SIZES)
    check_heads(config, "n_embd", "n_head")
    for key, what in _UNSUPPORTED.items():
        if config.get(key) not in (None, False, 0, [], ""):
            raise CheckpointError(
                f"{key} = {shown(config[key])}: the model has {what}, which transformers' "
                "GPT-Neo has not"
            )
    _attention_layers(config["attention_types"], config["n_layer"])
    radius = config.get("local_attention_radius", 256)
    check_sizes({"local_attention_radius": radius}, ["local_attention_radius"])
    act = config.get("activation_function", "gelu")
    if act not in _ACTIVATIONS:
        raise CheckpointError(
            f"activation_function = {shown(act)}: transformers' GPT-Neo takes one of "
            f"{', '.join(_ACTIVATIONS)} of gpt-neo's"
        )
    out: dict[str, Any] = {"architectures": [arch], "model_type": "gpt_neo"}
    out.update({new: config[old] for old, new in _SIZES.items()})
    out.update(
        attention_types=config["attention_types"],
        window_size=radius,
        activation_function=_ACTIVATIONS[act],
        layer_norm_epsilon=1e-5,  # layers.layer_norm's
        tie_word_embeddings=True,  # logits by wte (wte_final_einsum)
    )
    for old, new in _RATES.items():
        if old in config:
            out[new] = config[old]
    if "eos_id" in config:  # the dataset's end-of-text token
        out["bos_token_id"] = out["eos_token_id"] = config["eos_id"]
    n = config["n_embd"]
    check_shapes(
        shapes,
        {
            "transformer.wte.weight": (config["n_vocab"], n),
            "transformer.wpe.weight": (config["n_ctx"], n),
            "transformer.h.0.attn.attention.q_proj.weight": (n, n),
            "transformer.h.0.mlp.c_fc.weight": (4 * n, n),
        },
    )
    check_layers(shapes, "transformer.h.", config["n_layer"], "the config")
    return out


PRESET = Preset(
    "hf-gpt-neo",
    "EleutherAI's GPT-Neo (EleutherAI/gpt-neo, Mesh TensorFlow) to transformers' GPTNeoForCausalLM",
    ("gpt2/wte",),
    ("config.json",),
    lambda shapes: "GPTNeoForCausalLM",
    _gpt_neo_config,
)
