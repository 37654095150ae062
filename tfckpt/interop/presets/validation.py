"""The ``config.json`` a preset writes, checked as transformers takes it, before a byte is
written.

transformers' config classes are strict dataclasses: each setting has a type (an ``int``
size, a ``float`` epsilon, a ``float | int`` dropout rate, a ``str`` activation) and a
value of another type is refused when the config is loaded. What they take, the model
may still refuse when it is built: PyTorch's dropout takes a rate between 0 and 1, and
BERT's, ALBERT's, ELECTRA's and GPT-2's attention split the hidden size into
``num_attention_heads`` (``n_head``) equal parts. JSON itself has no NaN or infinity
(Python's writer would spell them anyway). :func:`config_json` checks all of that for the
model types the presets write (and, for any other, what holds for every config: finite
numbers, bounded nesting) and returns the file's bytes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from tfckpt.errors import CheckpointError
from tfckpt.interop.presets.family import MAX_CONFIG_BYTES, MAX_DEPTH, shown

# What each setting is, by transformers' config class of each model type: a size (a
# positive int), a rate (a number from 0 to 1, or None where the class allows it), a
# float, a string. A setting absent from the config is the class's default.
_SIZE, _RATE, _FLOAT, _STR = "size", "rate", "float", "str"
_BERT_LIKE = {
    **dict.fromkeys(
        (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
        ),
        _SIZE,
    ),
    **dict.fromkeys(
        ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"), _RATE
    ),
    **dict.fromkeys(("initializer_range", "layer_norm_eps"), _FLOAT),
    "hidden_act": _STR,
}
_KINDS: dict[str, dict[str, str]] = {
    "bert": _BERT_LIKE,
    "albert": {
        **_BERT_LIKE,
        **dict.fromkeys(("embedding_size", "num_hidden_groups", "inner_group_num"), _SIZE),
        "classifier_dropout_prob": _RATE,
    },
    "electra": {
        **_BERT_LIKE,
        "embedding_size": _SIZE,
        "summary_last_dropout": _RATE,
        "summary_type": _STR,
    },
    "roformer": {**_BERT_LIKE, "embedding_size": _SIZE},
    "mobilebert": {
        **_BERT_LIKE,
        **dict.fromkeys(
            ("embedding_size", "intra_bottleneck_size", "num_feedforward_networks"), _SIZE
        ),
        "normalization_type": _STR,
    },
    "gpt2": {
        **dict.fromkeys(("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"), _SIZE),
        "n_inner": _SIZE,  # or None: 4 * n_embd
        **dict.fromkeys(
            ("resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout"), _RATE
        ),
        **dict.fromkeys(("layer_norm_epsilon", "initializer_range"), _FLOAT),
        "activation_function": _STR,
    },
    "t5": {
        **dict.fromkeys(
            (
                "vocab_size",
                "d_model",
                "d_kv",
                "d_ff",
                "num_layers",
                "num_decoder_layers",
                "num_heads",
                "relative_attention_num_buckets",
                "relative_attention_max_distance",
            ),
            _SIZE,
        ),
        **dict.fromkeys(("dropout_rate", "classifier_dropout"), _RATE),
        **dict.fromkeys(("layer_norm_epsilon", "initializer_factor"), _FLOAT),
        "feed_forward_proj": _STR,
    },
}
_KINDS["mt5"] = _KINDS["t5"]  # MT5Config: T5Config's settings
_KINDS["gpt_neo"] = {
    **dict.fromkeys(
        (
            "vocab_size",
            "max_position_embeddings",
            "hidden_size",
            "num_layers",
            "num_heads",
            "window_size",
        ),
        _SIZE,
    ),
    "intermediate_size": _SIZE,  # or None: 4 * hidden_size
    **dict.fromkeys(("resid_dropout", "embed_dropout", "attention_dropout"), _RATE),
    **dict.fromkeys(("layer_norm_epsilon", "initializer_range"), _FLOAT),
    "activation_function": _STR,
}
_KINDS["openai-gpt"] = {
    **dict.fromkeys(("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"), _SIZE),
    **dict.fromkeys(("embd_pdrop", "attn_pdrop", "resid_pdrop"), _RATE),
    **dict.fromkeys(("layer_norm_epsilon", "initializer_range"), _FLOAT),
    "afn": _STR,
}
_KINDS["pegasus"] = {
    **dict.fromkeys(
        (
            "vocab_size",
            "max_position_embeddings",
            "d_model",
            "encoder_layers",
            "decoder_layers",
            "encoder_attention_heads",
            "decoder_attention_heads",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
        ),
        _SIZE,
    ),
    **dict.fromkeys(("dropout", "attention_dropout", "activation_dropout"), _RATE),
    "activation_function": _STR,
}
_KINDS["xlnet"] = {
    **dict.fromkeys(
        (
            "vocab_size",
            "d_model",
            "n_layer",
            "n_head",
            "d_inner",
            "d_head",
            "start_n_top",
            "end_n_top",
        ),
        _SIZE,
    ),
    **dict.fromkeys(("dropout", "summary_last_dropout"), _RATE),
    **dict.fromkeys(("layer_norm_eps", "initializer_range"), _FLOAT),
    **dict.fromkeys(("ff_activation", "attn_type", "summary_type", "summary_activation"), _STR),
}
_KINDS["mobilenet_v1"] = {
    **dict.fromkeys(("num_channels", "image_size", "min_depth"), _SIZE),
    **dict.fromkeys(("depth_multiplier", "initializer_range", "layer_norm_eps"), _FLOAT),
    "classifier_dropout_prob": _RATE,
    "hidden_act": _STR,
}
_KINDS["mobilenet_v2"] = {
    **_KINDS["mobilenet_v1"],
    **dict.fromkeys(("depth_divisible_by", "output_stride"), _SIZE),
    "expand_ratio": _FLOAT,
}
# Settings the class allows to be None (its default, or "derived from the others").
_NONE_ALLOWED = {"classifier_dropout", "n_inner", "num_decoder_layers", "intermediate_size"}
# (hidden size, heads): the attention splits the one into the other's number of parts.
_HEADS = {
    "bert": ("hidden_size", "num_attention_heads"),
    "albert": ("hidden_size", "num_attention_heads"),
    "electra": ("hidden_size", "num_attention_heads"),
    "roformer": ("hidden_size", "num_attention_heads"),
    "gpt2": ("n_embd", "n_head"),
    "gpt_neo": ("hidden_size", "num_heads"),
    "openai-gpt": ("n_embd", "n_head"),
    "pegasus": ("d_model", "encoder_attention_heads"),
    "xlnet": ("d_model", "n_head"),
}
_MAX_VALUES = 1_000_000  # strings, numbers, lists and objects in one config


def config_json(config: Mapping[str, Any]) -> bytes:
    """``config`` as the ``config.json`` transformers reads (UTF-8, indented), or a
    :class:`~tfckpt.CheckpointError` naming the setting transformers would refuse (its
    path inside the config: ``task_specific_params.summarization.max_length``). A float
    setting given as a whole number (``layer_norm_eps = 1``) is written as a float, as the
    class takes it."""
    out = dict(config)
    _check_values(out)
    model_type = out.get("model_type")
    kinds = _KINDS.get(model_type, {}) if isinstance(model_type, str) else {}
    for key, kind in kinds.items():
        if key in out:
            out[key] = _checked(key, out[key], kind)
    if model_type in _HEADS:
        hidden, heads = _HEADS[model_type]
        if hidden in out and heads in out and out[hidden] % out[heads]:
            raise CheckpointError(
                f"{hidden} {out[hidden]} is not a multiple of {heads} {out[heads]} "
                "(the attention splits it into equal heads)"
            )
    data = (json.dumps(out, indent=2, allow_nan=False) + "\n").encode()
    if len(data) > MAX_CONFIG_BYTES:
        raise CheckpointError(f"the config is larger than {MAX_CONFIG_BYTES >> 20} MiB")
    return data


def _checked(key: str, value: Any, kind: str) -> Any:
    if value is None and key in _NONE_ALLOWED:
        return value
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == _SIZE and not (number and isinstance(value, int) and value >= 1):
        raise CheckpointError(f"{key} must be a positive integer, not {shown(value)}")
    if kind == _RATE and not (number and 0 <= value <= 1):
        raise CheckpointError(f"{key} must be a rate from 0 to 1, not {shown(value)}")
    if kind == _FLOAT:
        if not number:
            raise CheckpointError(f"{key} must be a number, not {shown(value)}")
        return float(value)
    if kind == _STR and not isinstance(value, str):
        raise CheckpointError(f"{key} must be a string, not {shown(value)}")
    return value


def _check_values(config: Mapping[str, Any]) -> None:
    """An error for a value JSON cannot hold (NaN, infinity, a non-string key, an
    object), for nesting deeper than :data:`MAX_DEPTH` or more values than a config
    has; walked without recursion."""
    stack: list[tuple[str, Any, int]] = [("", config, 0)]
    seen = 0
    while stack:
        where, value, depth = stack.pop()
        seen += 1
        if seen > _MAX_VALUES:
            raise CheckpointError(f"the config holds more than {_MAX_VALUES} values")
        if isinstance(value, float) and not math.isfinite(value):
            raise CheckpointError(f"{where} is {value}: JSON holds finite numbers only")
        if value is None or isinstance(value, (str, int, float)):
            continue
        if not isinstance(value, (dict, list, tuple)):
            raise CheckpointError(f"{where} is a {type(value).__name__}, which JSON cannot hold")
        if depth >= MAX_DEPTH:
            raise CheckpointError(
                f"{where or 'the config'} is nested deeper than {MAX_DEPTH} levels"
            )
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise CheckpointError(
                        f"{where or 'the config'} has a key {shown(key)}: not text"
                    )
                stack.append((f"{where}.{key}" if where else key, item, depth + 1))
        else:
            stack.extend((f"{where}[{i}]", item, depth + 1) for i, item in enumerate(value))
