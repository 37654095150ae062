"""hf-t5: Mesh TensorFlow T5, T5.1.1 and their descendants (model.ckpt-N,
operative_config.gin) to T5ForConditionalGeneration or MT5ForConditionalGeneration.

The descendants share T5.1.1's names and layouts: the LM-adapted T5.1.1 (t5.1.1.lm100k),
mT5 (google-research/multilingual-t5) and ByT5 (google-research/byt5). mT5 and ByT5 are
told apart by their vocabulary sizes, the only mark their checkpoints carry: mT5's
SentencePiece model of 250 000 pieces and 100 sentinels padded to 250 112 rows, ByT5's
3 special ids, 256 bytes and 125 sentinels (384 rows). An untied mT5 becomes
MT5ForConditionalGeneration (``model_type`` ``mt5``, tokenizer T5Tokenizer); ByT5 a T5
whose tokenizer is ByT5Tokenizer (as Google's own ports on the Hugging Face Hub are).

The checkpoint's shapes fix most of the model (vocabulary, widths, heads, layers, gated
feed-forward or not, tied logits or not); the operative config adds what shapes cannot
say (the activation, the norm's epsilon, the dropout rate) and is checked against them.
Its keys are gin's (``encoder/DenseReluDense.hidden_size``, the macros ``d_model``,
``d_ff``, ``d_kv``, ``num_heads``, ``num_layers``); ``--config-value`` may also give the
T5Config names ``feed_forward_proj``, ``tie_word_embeddings``, ``num_decoder_layers``,
``layer_norm_epsilon``, ``relative_attention_num_buckets`` and ``vocab_size``, which win
over the file's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tfckpt.errors import CheckpointError
from tfckpt.interop.presets.family import Preset, Shapes, shown
from tfckpt.interop.presets.ginfile import Macro, read_gin

# Where the setting is bound, first found first (keys without their module path:
# transformer.Unitransformer.d_model is Unitransformer.d_model). None counts as unset.
_WHERE = {
    "vocab_size": ("vocab_size",),
    "d_model": ("encoder/Unitransformer.d_model", "Unitransformer.d_model", "d_model"),
    "d_ff": ("encoder/DenseReluDense.hidden_size", "DenseReluDense.hidden_size", "d_ff"),
    "d_kv": ("encoder/SelfAttention.key_value_size", "SelfAttention.key_value_size", "d_kv"),
    "num_heads": ("encoder/SelfAttention.num_heads", "SelfAttention.num_heads", "num_heads"),
    "num_layers": (
        "encoder/make_layer_stack.num_layers",
        "make_layer_stack.num_layers",
        "num_layers",
    ),
    "num_decoder_layers": (
        "num_decoder_layers",
        "decoder/make_layer_stack.num_layers",
        "make_layer_stack.num_layers",
        "num_layers",
    ),
    "relative_attention_num_buckets": (
        "relative_attention_num_buckets",
        "encoder/SelfAttention.relative_attention_num_buckets",
        "SelfAttention.relative_attention_num_buckets",
    ),
    # sublayer_rms_norm since 2020; LayerStack's own norm before (the T5 release's).
    "layer_norm_epsilon": (
        "layer_norm_epsilon",
        "encoder/sublayer_rms_norm.epsilon",
        "sublayer_rms_norm.epsilon",
        "encoder/LayerStack.norm_epsilon",
        "LayerStack.norm_epsilon",
    ),
    "dropout_rate": ("dropout_rate",),
    "tie_word_embeddings": (
        "tie_word_embeddings",
        "decoder/Unitransformer.shared_embedding_and_softmax_weights",
        "Unitransformer.shared_embedding_and_softmax_weights",
    ),
}
_ACTIVATION = ("encoder/DenseReluDense.activation", "DenseReluDense.activation")
_DECODER_ACTIVATION = ("decoder/DenseReluDense.activation", "DenseReluDense.activation")
# Mesh TF's activations (functions of mtf) by transformers' names: mtf.gelu is the tanh
# approximation, transformers' gelu_new (and what its "gated-gelu" means).
_ACTIVATIONS = {"relu": "relu", "gelu": "gelu_new", "swish": "silu"}
_GATED = {"relu": "gated-relu", "gelu": "gated-gelu", "swish": "gated-silu"}

_EMBEDDING = "shared.weight"
_BIAS = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
_QUERY = "encoder.block.0.layer.0.SelfAttention.q.weight"
_WI = "encoder.block.0.layer.1.DenseReluDense.wi.weight"
_WI_0 = "encoder.block.0.layer.1.DenseReluDense.wi_0.weight"
_LM_HEAD = "lm_head.weight"

# Vocabulary sizes of releases whose checkpoints look like T5.1.1's (see the module's text).
MT5_VOCAB = 250_112
BYT5_VOCAB = 384
T5 = "T5ForConditionalGeneration"
MT5 = "MT5ForConditionalGeneration"


def _architecture(shapes: Shapes) -> str:
    """MT5ForConditionalGeneration for an untied model of mT5's vocabulary, else T5's.
    (MT5's class never scales the decoder's output by d_model**-0.5, which a tied Mesh
    TF model does: a tied one stays a T5, which does.)"""
    vocab = tuple(shapes.get(_EMBEDDING, (0,)))[:1]
    return MT5 if vocab == (MT5_VOCAB,) and _LM_HEAD in shapes else T5


def _short(key: str) -> str:
    """A gin key without the module path of its selector."""
    scope, slash, name = key.rpartition("/")
    return scope + slash + ".".join(name.split(".")[-2:])


def _lookup(config: Mapping[str, Any], keys) -> tuple[str, Any] | None:
    """The first of ``keys`` the config binds to other than None, macros followed:
    (its key and the macros it went through, as errors show them; its value)."""
    short = {_short(k): k for k in config}
    for want in keys:
        if want not in short:
            continue
        key = short[want]
        value, seen, shown = config[key], {key}, key
        while isinstance(value, Macro):
            if value.name not in short or short[value.name] in seen:
                raise CheckpointError(f"{shown} refers to %{value.name}, which is not set")
            seen.add(short[value.name])
            value, shown = config[short[value.name]], f"{shown} = %{value.name}"
        if value is not None:
            return shown, value
    return None


def _whole(found: tuple[str, Any]) -> int:
    key, value = found
    if not isinstance(value, int) or isinstance(value, bool):
        raise CheckpointError(f"{key} = {shown(value)}: expected a whole number")
    return value


def _agree(config: Mapping[str, Any], setting: str, derived: int, evidence: str) -> int:
    """``derived`` (from ``evidence``), checked against what the config says."""
    found = _lookup(config, _WHERE[setting])
    if found is not None and _whole(found) != derived:
        raise CheckpointError(
            f"{found[0]} = {found[1]} disagrees with the checkpoint: {evidence} "
            f"make {setting} {derived}"
        )
    return derived


def _feed_forward(config: Mapping[str, Any], gated: bool) -> str:
    """T5Config's feed_forward_proj: given, or from the DenseReluDense activation."""
    given = _lookup(config, ("feed_forward_proj",))
    if given is not None:
        proj = given[1]
        if not isinstance(proj, str) or not re.fullmatch(r"(gated-)?[a-z_]+", proj):
            raise CheckpointError(
                f"feed_forward_proj = {shown(proj)}: expected e.g. relu, gated-gelu"
            )
    else:
        found = _lookup(config, _ACTIVATION)
        other = _lookup(config, _DECODER_ACTIVATION)
        if found is not None and other is not None and found[1] != other[1]:
            raise CheckpointError(
                f"{found[0]} = {shown(found[1])} but {other[0]} = {shown(other[1])}: transformers' "
                "T5 has one activation for both"
            )
        if found is None and gated:
            raise CheckpointError(
                "the checkpoint's feed-forward layers are gated (wi_0, wi_1) and the config "
                "names no DenseReluDense.activation (give feed_forward_proj, e.g. gated-gelu)"
            )
        # Before DenseReluDense took an activation (2020) it was relu's alone.
        proj = "relu" if found is None else _activation(*found)
    if proj.startswith("gated-") != gated:
        kind = "gated (wi_0, wi_1)" if gated else "not gated (one wi)"
        raise CheckpointError(f"the feed-forward is {proj}, the checkpoint's is {kind}")
    return proj


def _activation(key: str, value) -> str:
    names = [value] if isinstance(value, str) else value
    if isinstance(names, (list, tuple)) and len(names) == 2 and names[1] == "linear":
        table, act = _GATED, names[0]
    elif isinstance(names, (list, tuple)) and len(names) == 1:
        table, act = _ACTIVATIONS, names[0]
    else:
        table, act = {}, None
    if act not in table:
        raise CheckpointError(
            f"{key} = {shown(value)}: transformers' T5 takes one of {', '.join(_ACTIVATIONS)}, "
            "or one of them and 'linear' (gated)"
        )
    return table[act]


def _need(shapes: Shapes, name: str) -> tuple[int, ...]:
    if name not in shapes:
        raise CheckpointError(f"the checkpoint has no {name} (is it a Mesh TF T5?)")
    return tuple(shapes[name])


def _t5_config(config: Mapping[str, Any], shapes: Shapes, arch: str) -> dict:
    vocab, d_model = _need(shapes, _EMBEDDING)
    buckets, heads = _need(shapes, _BIAS)
    inner = _need(shapes, _QUERY)[0]
    gated = _WI_0 in shapes
    d_ff = _need(shapes, _WI_0 if gated else _WI)[0]
    for name in (_EMBEDDING, _BIAS):
        if 0 in shapes[name]:
            raise CheckpointError(f"{name} has the shape {list(shapes[name])}: no size may be 0")
    if inner < 1 or d_ff < 1:
        raise CheckpointError(f"{_QUERY} or the feed-forward's weights have a size of 0")
    if inner % heads:
        raise CheckpointError(f"{_QUERY} has {inner} rows, not a multiple of {heads} heads")
    layers = [
        len({n.split(".")[2] for n in shapes if n.startswith(f"{stack}.block.")})
        for stack in ("encoder", "decoder")
    ]
    tied = _LM_HEAD not in shapes
    out: dict[str, Any] = {
        "architectures": [arch],
        "model_type": "mt5" if arch == MT5 else "t5",
        "vocab_size": _agree(config, "vocab_size", vocab, f"{_EMBEDDING}'s {vocab} rows"),
        "d_model": _agree(config, "d_model", d_model, f"{_EMBEDDING}'s {d_model} columns"),
        "num_heads": _agree(config, "num_heads", heads, f"{_BIAS}'s {heads} columns"),
        "d_kv": _agree(config, "d_kv", inner // heads, f"{_QUERY}'s {inner} rows / {heads}"),
        "d_ff": _agree(config, "d_ff", d_ff, f"the feed-forward's {d_ff} rows"),
        "num_layers": _agree(config, "num_layers", layers[0], f"{layers[0]} encoder blocks"),
        "num_decoder_layers": _agree(
            config, "num_decoder_layers", layers[1], f"{layers[1]} decoder blocks"
        ),
        "relative_attention_num_buckets": _agree(
            config, "relative_attention_num_buckets", buckets, f"{_BIAS}'s {buckets} rows"
        ),
        "relative_attention_max_distance": 128,  # fixed in Mesh TF's bucketing
        "feed_forward_proj": _feed_forward(config, gated),
        "layer_norm_epsilon": 1e-6,  # Mesh TF's default
        "dropout_rate": 0.1,  # transformers' default, for fine-tuning
        "is_encoder_decoder": True,
        "tie_word_embeddings": tied,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "decoder_start_token_id": 0,
    }
    if arch == MT5:
        out["tokenizer_class"] = "T5Tokenizer"
    elif vocab == BYT5_VOCAB:
        out["tokenizer_class"] = "ByT5Tokenizer"
    for setting in ("layer_norm_epsilon", "dropout_rate"):
        found = _lookup(config, _WHERE[setting])
        if found is not None:
            if not isinstance(found[1], (int, float)) or isinstance(found[1], bool):
                raise CheckpointError(f"{found[0]} = {shown(found[1])}: expected a number")
            out[setting] = found[1]
    found = _lookup(config, _WHERE["tie_word_embeddings"])
    if found is not None and found[1] is not tied:
        has = "has no" if tied else "has its own"
        raise CheckpointError(
            f"{found[0]} = {shown(found[1])} disagrees with the checkpoint, which {has} "
            "decoder/logits/kernel"
        )
    _check_complete(shapes, out)
    return out


def _check_complete(shapes: Shapes, c: Mapping[str, Any]) -> None:
    """An error when a tensor the model has is missing, or has another shape."""
    want = _t5_shapes(c)
    missing = sorted(set(want) - set(shapes))
    if missing:
        more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        raise CheckpointError(
            f"the checkpoint lacks {', '.join(missing[:3])}{more}, which a T5 of this config has"
        )
    for name, shape in want.items():
        if tuple(shapes[name]) == shape:
            continue
        if ".block." in name:
            why = (
                "the first encoder block's sizes make it: transformers' T5 has the same sizes "
                "(heads, d_kv, d_ff) in every layer, which a release with wider layers "
                "(t5.1.n4w10) has not"
            )
        else:
            why = f"{_EMBEDDING}'s make it: transformers' T5 takes d_model and vocab_size from it"
        raise CheckpointError(
            f"{name} has the shape {list(shapes[name])}, not {list(shape)} as {why}"
        )


def _t5_shapes(c: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """T5ForConditionalGeneration's tensors for config ``c``, by name: their shapes."""
    d, inner, ff = c["d_model"], c["num_heads"] * c["d_kv"], c["d_ff"]
    out: dict[str, tuple[int, ...]] = {_EMBEDDING: (c["vocab_size"], d)}
    if not c["tie_word_embeddings"]:
        out["lm_head.weight"] = (c["vocab_size"], d)
    wi = ("wi_0", "wi_1") if c["feed_forward_proj"].startswith("gated-") else ("wi",)
    for stack, n in (("encoder", c["num_layers"]), ("decoder", c["num_decoder_layers"])):
        out[f"{stack}.final_layer_norm.weight"] = (d,)
        bias = f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        out[bias] = (c["relative_attention_num_buckets"], c["num_heads"])
        attentions = ("SelfAttention",) + (("EncDecAttention",) if stack == "decoder" else ())
        for i in range(n):
            block = f"{stack}.block.{i}.layer."
            for k, attention in enumerate(attentions):
                out[f"{block}{k}.layer_norm.weight"] = (d,)
                for m in "qkv":
                    out[f"{block}{k}.{attention}.{m}.weight"] = (inner, d)
                out[f"{block}{k}.{attention}.o.weight"] = (d, inner)
            ffn = f"{block}{len(attentions)}."
            out[ffn + "layer_norm.weight"] = (d,)
            for name in wi:
                out[f"{ffn}DenseReluDense.{name}.weight"] = (ff, d)
            out[ffn + "DenseReluDense.wo.weight"] = (d, ff)
    return out


PRESET = Preset(
    "hf-t5",
    "Mesh TensorFlow T5, T5.1.1, LM-adapted T5.1.1, mT5 and ByT5 "
    "(google-research/text-to-text-transfer-transformer, multilingual-t5, byt5) to "
    "transformers' T5ForConditionalGeneration or MT5ForConditionalGeneration",
    ("encoder/block_000/layer_000/SelfAttention/relative_attention_bias",),
    ("operative_config.gin",),
    _architecture,
    _t5_config,
    read=read_gin,
)
