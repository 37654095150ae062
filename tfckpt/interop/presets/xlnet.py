"""hf-xlnet: XLNet releases (zihangdai/xlnet: xlnet_model.ckpt and xlnet_config.json, or a
run's model.ckpt-N and the config.json train.py writes) to transformers' XLNet classes.

The release keeps each relative-attention bias (``r_w_bias``, ``r_r_bias``, ``r_s_bias``)
and the segment embedding (``seg_embed``) as one tensor for all layers, ``[n_layer, ...]``
(``untie_r``); transformers keeps one a layer. The rules that cut them are made from the
checkpoint's shapes (:func:`source_rules`), the rest are the rules file's. With
``untie_r = false`` the release shares one bias of ``[n_head, d_head]`` among all layers,
which transformers' XLNet has no place for (4.57's converter could not load it either):
refused. The class follows from the heads the checkpoint holds: run_squad's
(``start_logits/``...) make XLNetForQuestionAnswering, run_race's (``logits/``)
XLNetForMultipleChoice, run_classifier's (``model/classification_<task>/``,
``model/regression_<task>/``) XLNetForSequenceClassification, pretraining's LM loss
XLNetLMHeadModel; none, XLNetModel. A fine-tuning graph has no ``mask_emb`` (only
pretraining's two-stream attention reads it); the preset writes it as zeros there, so
that the model loads whole (:func:`_mask_embedding`): no output of those classes reads it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

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

_SCOPE = "model/transformer/"
_BIASES = ("r_w_bias", "r_r_bias", "r_s_bias")
_SEGMENTS = "seg_embed"
MASK_EMB = "transformer.mask_emb"
_HEAD_RE = re.compile(r"^model/(classification|regression)_([^/]+)/logit/kernel$")
# xlnet_config.json's keys (xlnet.py's XLNetConfig) by transformers' names.
_KEYS = {
    "n_token": "vocab_size",
    "d_model": "d_model",
    "n_layer": "n_layer",
    "n_head": "n_head",
    "d_inner": "d_inner",
}
# modeling.py's activations by transformers' names: its gelu is the tanh approximation.
_ACTIVATIONS = {"gelu": "gelu_new", "relu": "relu"}
# summarize_sequence's kinds that transformers' XLNetSequenceSummary computes alike.
_SUMMARIES = ("last", "first", "mean")


def _refused(message: str) -> CheckpointError:
    return CheckpointError(f"hf-xlnet: {message}")


def _architecture(names) -> str:
    """The XLNet class whose weights ``names`` (the release's) are."""
    present = set(names)
    if "start_logits/dense/kernel" in present:
        return "XLNetForQuestionAnswering"
    if "logits/dense/kernel" in present:
        return "XLNetForMultipleChoice"
    if any(_HEAD_RE.match(n) for n in present):
        return "XLNetForSequenceClassification"
    if "model/lm_loss/bias" in present:
        return "XLNetLMHeadModel"
    return "XLNetModel"


def _architecture_of_new_names(shapes: Shapes) -> str:
    raise CheckpointError("hf-xlnet takes its architecture from the source's names")  # never asked


def source_rules(
    sources: Mapping[str, tuple[int, ...]], config: Mapping[str, Any]
) -> tuple[dict[str, Any], str]:
    """The rules that cut the release's per-model biases into transformers' per-layer ones
    (``sources``: the checkpoint's names and shapes), and the class the heads make."""
    first = sources.get(_SCOPE + "r_w_bias")
    if first is None:
        raise _refused(f"the checkpoint has no {_SCOPE}r_w_bias")
    if len(first) == 2:
        raise _refused(
            f"{_SCOPE}r_w_bias is {list(first)}: untie_r = false shares r_w_bias, r_r_bias "
            "and r_s_bias among all layers, and transformers' XLNet holds them a layer each "
            "(its 4.57 converter could not load such a checkpoint either)"
        )
    if len(first) != 3:
        raise _refused(f"{_SCOPE}r_w_bias is {list(first)}: expected [n_layer, n_head, d_head]")
    layers, heads_n, size = first
    want: dict[str, tuple[int, ...]] = {b: (layers, heads_n, size) for b in _BIASES}
    want[_SEGMENTS] = (layers, 2, heads_n, size)
    split: list[tuple[str, int, list[str]]] = []
    renames: dict[str, str] = {}
    reshape: list[tuple[str, list[int]]] = []
    for name, shape in want.items():
        got = sources.get(_SCOPE + name)
        if got is None:
            raise _refused(
                f"the checkpoint has no {_SCOPE}{name} (a graph built without seg_id), "
                "which every XLNet of transformers has"
            )
        if tuple(got) != shape:
            raise _refused(
                f"{_SCOPE}{name} is {list(got)}; {_SCOPE}r_w_bias {list(first)} makes it "
                f"{list(shape)}"
            )
        per_layer = [f"transformer.layer.{i}.rel_attn.{name}" for i in range(layers)]
        if layers > 1:
            split.append((f"^transformer\\.{name}$", 0, per_layer))
        else:
            renames[_SCOPE + name] = per_layer[0]
        reshape.append((f"^transformer\\.layer\\.\\d+\\.rel_attn\\.{name}$", list(shape[1:])))
    rules = {"split": split, "rename_exact": renames, "reshape": reshape}
    return rules, _architecture(sources)


def _config(config: Mapping[str, Any], shapes: Shapes, arch: str) -> dict:
    require(config, [*_KEYS, "d_head"], "the XLNet config")
    check_sizes(config, [*_KEYS, "d_head"])
    check_heads(config, "d_model", "n_head")
    if config["d_head"] != config["d_model"] // config["n_head"]:
        raise CheckpointError(
            f"d_head {config['d_head']}: transformers' XLNet takes d_model // n_head "
            f"({config['d_model'] // config['n_head']})"
        )
    if config.get("untie_r") is False:
        raise CheckpointError(
            "untie_r = false: the release shares the attention biases among all layers, "
            "which transformers' XLNet holds a layer each"
        )
    act = config.get("ff_activation", "relu")  # modeling.transformer_xl's default
    if act not in _ACTIVATIONS:
        raise CheckpointError(f"ff_activation {shown(act)}: not one of {', '.join(_ACTIVATIONS)}")
    summary = config.get("summary_type", "last")  # run_classifier's --summary_type
    if summary not in _SUMMARIES:
        raise CheckpointError(
            f"summary_type {shown(summary)}: transformers' XLNet summarizes with one of "
            f"{', '.join(_SUMMARIES)} ('attn' has weights of its own it has no place for)"
        )
    out: dict[str, Any] = {"architectures": [arch], "model_type": "xlnet"}
    out.update({new: config[old] for old, new in _KEYS.items()})
    out.update(
        d_head=config["d_head"],
        ff_activation=_ACTIVATIONS[act],
        layer_norm_eps=1e-12,  # tf.contrib.layers.layer_norm's
        attn_type="bi",  # XLNetModel's, in pretraining and fine-tuning alike
        bi_data=False,
        clamp_len=-1,
        same_length=False,
        summary_type=summary,
        summary_use_proj="sequence_summary.summary.weight" in shapes,
        summary_activation="tanh",
    )
    for key in ("dropout", "start_n_top", "end_n_top"):  # the run's flags, where given
        if key in config:
            out[key] = config[key]
    d = config["d_model"]
    n, h = config["n_head"], config["d_head"]
    check_shapes(
        shapes,
        {
            "transformer.word_embedding.weight": (config["n_token"], d),
            "transformer.layer.0.rel_attn.q": (d, n, h),
            "transformer.layer.0.ff.layer_1.weight": (config["d_inner"], d),
            "transformer.layer.0.rel_attn.r_w_bias": (n, h),
        },
    )
    check_layers(shapes, "transformer.layer.", config["n_layer"])
    if arch == "XLNetForSequenceClassification":
        labels = shapes["logits_proj.weight"][0]
        out.update(label_maps(labels))
        if labels == 1:
            out["problem_type"] = "regression"
    return out


def _mask_embedding(config: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """``transformer.mask_emb`` as zeros of ``[1, 1, d_model]`` (``config``: the written
    config.json), for a checkpoint without one (a fine-tuning graph's): the release
    stores one only where pretraining's query stream reads it; a stored one wins."""
    require(config, ["d_model"], "the XLNet config.json")
    check_sizes(config, ["d_model"])
    return {MASK_EMB: np.zeros((1, 1, config["d_model"]), np.float32)}


PRESET = Preset(
    "hf-xlnet",
    "XLNet (zihangdai/xlnet: pretraining, run_classifier, run_squad, run_race) to "
    "transformers' XLNetModel, XLNetLMHeadModel, XLNetForSequenceClassification, "
    "XLNetForQuestionAnswering and XLNetForMultipleChoice",
    (_SCOPE + "word_embedding/lookup_table",),
    ("xlnet_config.json", "config.json"),
    _architecture_of_new_names,
    _config,
    from_source=source_rules,
    requires=(_SCOPE + "r_w_bias",),
    made=_mask_embedding,
)
