"""hf-mobilenet-v1, hf-mobilenet-v2: MobileNet v1 and v2 of tensorflow/models research/slim
(``nets/mobilenet_v1.py``, ``nets/mobilenet/mobilenet_v2.py``: the
``mobilenet_v{1,2}_<multiplier>_<size>.ckpt`` releases, or a run of slim's
``train_image_classifier.py``) to transformers' MobileNetV{1,2}ForImageClassification and
MobileNetV{1,2}Model.

The releases ship no config file: the sizes are in the code, the depth multiplier and the
image size in the file's name. The translator finds the depth multiplier (and v2's
``finegrained_output``) from the tensors' shapes: the releases' multipliers are tried, and
one given with ``--config-value depth_multiplier=...`` is checked; every tensor's shape
must be the one transformers' model of those settings has. ``image_size`` (224 unless
given) is what transformers' image processor crops to; the model itself pools whatever
size it is given, as slim's does at the size it was trained for.

slim's training (``--moving_average_decay``) keeps an ExponentialMovingAverage shadow of
every model variable (the batch norm's moving statistics included), and slim's eval
restores the shadows in place of the variables. So does the export, where the checkpoint
holds them; ``--config-value ema=false`` takes the raw variables instead (transformers
4.57's converter of v1 did; its converter of v2 took the shadows of the trained weights
and the raw moving statistics). transformers keeps a ``num_batches_tracked`` counter in
each batch norm, which TensorFlow has no counterpart of: the export writes 0, as a
model transformers builds has.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from tfckpt.errors import CheckpointError
from tfckpt.interop.presets.family import Preset, Shapes, check_sizes, label_maps, shown

EMA = "/ExponentialMovingAverage"
_BATCH_NORM = (
    ("BatchNorm/gamma", "normalization.weight"),
    ("BatchNorm/beta", "normalization.bias"),
    ("BatchNorm/moving_mean", "normalization.running_mean"),
    ("BatchNorm/moving_variance", "normalization.running_var"),
)
_CLASSIFIER = "classifier.weight"
# slim's ReLU6 and batch norm epsilon (mobilenet_v1_arg_scope; slim.batch_norm's default
# under mobilenet.training_scope), and the dropout its training applies before the logits
# (transformers takes the rate dropped, slim the rate kept: 0.999 and 0.8).
_COMMON = {"hidden_act": "relu6", "tf_padding": True, "layer_norm_eps": 0.001}
_V1_DROPOUT = 0.001
_V2_DROPOUT = 0.2

# mobilenet_v1.py's _CONV_DEFS: the depthwise layers' strides (the depth doubles at each
# stride 2, and at the first layer).
_V1_STRIDES = (1, 2, 1, 2, 1, 2, 1, 1, 1, 1, 1, 2, 1)
_V1_MULTIPLIERS = (1.0, 0.75, 0.5, 0.25)  # the releases'
# mobilenet_v2.py's V2_DEF: each expanded_conv's output depth, the first one's first.
_V2_DEPTHS = (16, 24, 24, 32, 32, 32, 64, 64, 64, 64, 96, 96, 96, 160, 160, 160, 320)
_V2_MULTIPLIERS = (1.0, 1.4, 1.3, 0.75, 0.5, 0.35)  # the releases'


def _modules(version: int) -> list[tuple[str, str, str]]:
    """(slim scope, transformers module, the scope's kernel leaf) of every convolution."""
    if version == 1:
        out = [("MobilenetV1/Conv2d_0", "mobilenet_v1.conv_stem", "weights")]
        for k in range(1, 14):
            scope, module = f"MobilenetV1/Conv2d_{k}", "mobilenet_v1.layer."
            out.append((f"{scope}_depthwise", f"{module}{2 * k - 2}", "depthwise_weights"))
            out.append((f"{scope}_pointwise", f"{module}{2 * k - 1}", "weights"))
        return out
    stem = "mobilenet_v2.conv_stem."
    out = [
        ("MobilenetV2/Conv", stem + "first_conv", "weights"),
        ("MobilenetV2/expanded_conv/expand", stem + "expand_1x1", "weights"),
        ("MobilenetV2/expanded_conv/depthwise", stem + "conv_3x3", "depthwise_weights"),
        ("MobilenetV2/expanded_conv/project", stem + "reduce_1x1", "weights"),
    ]
    for k in range(1, 17):
        scope, module = f"MobilenetV2/expanded_conv_{k}/", f"mobilenet_v2.layer.{k - 1}."
        out.append((scope + "expand", module + "expand_1x1", "weights"))
        out.append((scope + "depthwise", module + "conv_3x3", "depthwise_weights"))
        out.append((scope + "project", module + "reduce_1x1", "weights"))
    out.append(("MobilenetV2/Conv_1", "mobilenet_v2.conv_1x1", "weights"))
    return out


def _names(version: int) -> dict[str, str]:
    """Every slim variable of the family by its transformers name."""
    out = {}
    for scope, module, leaf in _modules(version):
        out[f"{scope}/{leaf}"] = f"{module}.convolution.weight"
        for old, new in _BATCH_NORM:
            out[f"{scope}/{old}"] = f"{module}.{new}"
    logits = f"MobilenetV{version}/Logits/Conv2d_1c_1x1/"
    out[logits + "weights"] = _CLASSIFIER
    out[logits + "biases"] = "classifier.bias"
    return out


def _ema(config: Mapping[str, Any], name: str) -> bool | None:
    """The ``ema`` setting: True, False, or None (not given: the shadows where there are)."""
    value = config.get("ema")
    if value is not None and not isinstance(value, bool):
        raise CheckpointError(
            f"{name}: ema = {shown(value)}: expected true (the ExponentialMovingAverage "
            "shadows, as slim's eval restores them) or false (the raw variables)"
        )
    return value


def _source_rules(version: int, name: str) -> Callable[..., tuple[dict, str]]:
    names = _names(version)
    logits = f"MobilenetV{version}/Logits/Conv2d_1c_1x1/weights"

    def rules(sources: Mapping[str, tuple[int, ...]], config: Mapping[str, Any]):
        """The name map of ``sources``' variables, of their shadows where ``ema`` (by
        default where the checkpoint holds them), and the architecture they make."""
        ema = _ema(config, name)
        shadowed = [n for n in names if n in sources and n + EMA in sources]
        if ema and not shadowed:
            raise CheckpointError(
                f"{name}: ema = true, but the checkpoint holds no ExponentialMovingAverage "
                "shadows of the model's variables"
            )
        take = set(shadowed) if ema is not False else set()
        maps = [(re.escape(old + EMA if old in take else old), new) for old, new in names.items()]
        if take:  # the variables the shadows stand in for
            exclude = ["^(?:" + "|".join(re.escape(n) for n in sorted(take)) + ")$"]
        else:
            exclude = [re.escape(EMA) + "$"]
        arch = "ForImageClassification" if logits in sources else "Model"
        return {"name_map": maps, "exclude": exclude}, f"MobileNetV{version}{arch}"

    return rules


def _counters(modules: list[str]) -> dict[str, np.ndarray]:
    """transformers' batch norm counters of ``modules``: 0, as in a model it builds."""
    return {f"{m}.normalization.num_batches_tracked": np.zeros((), np.int64) for m in modules}


def _v1_made(config: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return _counters([m for _, m, _ in _modules(1)])


def _v2_made(config: Mapping[str, Any]) -> dict[str, np.ndarray]:
    first = config.get("first_layer_is_expansion", True)
    skip = {"mobilenet_v2.conv_stem.expand_1x1"} if first else set()
    return _counters([m for _, m, _ in _modules(2) if m not in skip])


def _conv(want: dict, module: str, shape: tuple[int, ...]) -> None:
    want[f"{module}.convolution.weight"] = shape
    for _, leaf in _BATCH_NORM:
        want[f"{module}.{leaf}"] = (shape[0],)


def _v1_shapes(s: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor of transformers' MobileNetV1 of settings ``s``."""
    dm, least = s["depth_multiplier"], s["min_depth"]
    depth = 32
    out = max(int(depth * dm), least)
    want: dict[str, tuple[int, ...]] = {}
    _conv(want, "mobilenet_v1.conv_stem", (out, s["num_channels"], 3, 3))
    for i, stride in enumerate(_V1_STRIDES):
        channels = out
        if stride == 2 or i == 0:
            depth *= 2
            out = max(int(depth * dm), least)
        _conv(want, f"mobilenet_v1.layer.{2 * i}", (channels, 1, 3, 3))
        _conv(want, f"mobilenet_v1.layer.{2 * i + 1}", (out, channels, 1, 1))
    if s.get("num_labels"):
        want[_CLASSIFIER] = (s["num_labels"], out)
        want["classifier.bias"] = (s["num_labels"],)
    return want


def _divisible(value: float, divisor: int, least: int) -> int:
    """slim's (and transformers') _make_divisible: the nearest multiple of ``divisor``, at
    least ``least``, and not 10% under ``value``."""
    new = max(least, int(value + divisor / 2) // divisor * divisor)
    return int(new + divisor if new < 0.9 * value else new)


def _v2_shapes(s: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor of transformers' MobileNetV2 of settings ``s``."""
    dm, by, least = s["depth_multiplier"], s["depth_divisible_by"], s["min_depth"]

    def scaled(depth: int) -> int:
        return _divisible(int(round(depth * dm)), by, least)

    depths = [scaled(d) for d in _V2_DEPTHS]
    first = scaled(32)
    want: dict[str, tuple[int, ...]] = {}
    stem = "mobilenet_v2.conv_stem."
    _conv(want, stem + "first_conv", (first, s["num_channels"], 3, 3))
    if not s["first_layer_is_expansion"]:
        _conv(want, stem + "expand_1x1", (first, first, 1, 1))
    _conv(want, stem + "conv_3x3", (first, 1, 3, 3))
    _conv(want, stem + "reduce_1x1", (depths[0], first, 1, 1))
    for i in range(16):
        inner = _divisible(int(round(depths[i] * s["expand_ratio"])), by, least)
        layer = f"mobilenet_v2.layer.{i}."
        _conv(want, layer + "expand_1x1", (inner, depths[i], 1, 1))
        _conv(want, layer + "conv_3x3", (inner, 1, 3, 3))
        _conv(want, layer + "reduce_1x1", (depths[i + 1], inner, 1, 1))
    last = 1280 if s["finegrained_output"] and dm < 1 else scaled(1280)
    _conv(want, "mobilenet_v2.conv_1x1", (last, depths[-1], 1, 1))
    if s.get("num_labels"):
        want[_CLASSIFIER] = (s["num_labels"], last)
        want["classifier.bias"] = (s["num_labels"],)
    return want


def _differences(want: Mapping[str, tuple[int, ...]], shapes: Shapes) -> list[str]:
    """How the checkpoint's ``shapes`` differ from ``want``, tensor by tensor."""
    out = []
    for name, shape in want.items():
        if name not in shapes:
            out.append(f"the checkpoint has no {name}")
        elif tuple(shapes[name]) != tuple(shape):
            out.append(f"{name} is {list(shapes[name])} there, {list(shape)} here")
    extra = [n for n in shapes if n not in want]
    return out + [f"the checkpoint has {n}, which these settings have not" for n in extra]


def _settings(
    config: Mapping[str, Any],
    shapes: Shapes,
    fixed: dict[str, Any],
    tried: dict[str, tuple],
    expected: Callable[[Mapping[str, Any]], dict],
) -> dict[str, Any]:
    """``fixed`` with the first combination of ``tried``'s values (each key's given value
    alone where ``config`` has it) whose model has exactly the checkpoint's shapes; an
    error naming how the checkpoint differs from the nearest when none has."""
    choices: list[dict[str, Any]] = [dict(fixed)]
    for key, values in tried.items():
        options = (config[key],) if key in config else values
        choices = [{**c, key: v} for c in choices for v in options]
    found = []
    for settings in choices:
        differences = _differences(expected(settings), shapes)
        if not differences:
            return settings
        found.append((len(differences), differences[0], settings))
    _, first, nearest = min(found, key=lambda f: f[0])
    said = ", ".join(f"{k} {shown(nearest[k])}" for k in tried)
    free = [k for k in tried if k not in config]
    if not free:
        how = f"with {said}, {first}"
    else:
        how = (
            f"no {' and '.join(free)} of the releases' makes these shapes (the nearest, "
            f"{said}: {first})"
        )
    hint = f" (give {', '.join(free)} with --config-value KEY=VALUE)" if free else ""
    raise CheckpointError(f"transformers' model of the checkpoint: {how}{hint}")


def _positive(config: Mapping[str, Any], key: str) -> None:
    value = config.get(key, 1)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise CheckpointError(f"{key} must be a positive number, not {shown(value)}")


def _common(config: Mapping[str, Any], shapes: Shapes, stem: str) -> dict[str, Any]:
    """The settings both versions take from the config and the shapes."""
    check_sizes(config, ("image_size", "min_depth"))
    _positive(config, "depth_multiplier")
    if stem not in shapes or len(shapes[stem]) != 4:
        raise CheckpointError(f"the checkpoint has no {stem} of 4 axes")
    out = {"num_channels": shapes[stem][1], "min_depth": config.get("min_depth", 8)}
    if _CLASSIFIER in shapes:
        if len(shapes[_CLASSIFIER]) != 2:
            raise CheckpointError(
                f"{_CLASSIFIER} is {list(shapes[_CLASSIFIER])}: the logits make at least 2 "
                "classes of at least 2 channels"
            )
        out["num_labels"] = shapes[_CLASSIFIER][0]
    return out


def _written(arch: str, model_type: str, settings: dict, config, dropout: float) -> dict:
    out: dict[str, Any] = {"architectures": [arch], "model_type": model_type}
    labels = settings.pop("num_labels", None)
    out.update(settings)
    out.update(_COMMON, image_size=config.get("image_size", 224))
    out["classifier_dropout_prob"] = dropout
    if labels:
        out.update(label_maps(labels))
    return out


def _v1_config(config: Mapping[str, Any], shapes: Shapes, arch: str) -> dict:
    _ema(config, "hf-mobilenet-v1")
    fixed = _common(config, shapes, "mobilenet_v1.conv_stem.convolution.weight")
    settings = _settings(config, shapes, fixed, {"depth_multiplier": _V1_MULTIPLIERS}, _v1_shapes)
    return _written(arch, "mobilenet_v1", settings, config, _V1_DROPOUT)


def _v2_config(config: Mapping[str, Any], shapes: Shapes, arch: str) -> dict:
    _ema(config, "hf-mobilenet-v2")
    fixed = _common(config, shapes, "mobilenet_v2.conv_stem.first_conv.convolution.weight")
    check_sizes(config, ("depth_divisible_by", "output_stride"))
    _positive(config, "expand_ratio")
    fixed.update(
        depth_divisible_by=config.get("depth_divisible_by", 8),
        expand_ratio=config.get("expand_ratio", 6.0),
        first_layer_is_expansion="mobilenet_v2.conv_stem.expand_1x1.convolution.weight"
        not in shapes,
        output_stride=config.get("output_stride", 32),
    )
    tried = {"depth_multiplier": _V2_MULTIPLIERS, "finegrained_output": (True, False)}
    if not isinstance(config.get("finegrained_output", True), bool):
        raise CheckpointError(
            f"finegrained_output must be true or false, not {shown(config['finegrained_output'])}"
        )
    settings = _settings(config, shapes, fixed, tried, _v2_shapes)
    return _written(arch, "mobilenet_v2", settings, config, _V2_DROPOUT)


def _architecture(shapes: Shapes) -> str:
    raise CheckpointError("the MobileNet presets take the architecture from the names")


V1_PRESET = Preset(
    "hf-mobilenet-v1",
    "MobileNet v1 (tensorflow/models research/slim) to transformers' "
    "MobileNetV1ForImageClassification and MobileNetV1Model",
    ("MobilenetV1/Conv2d_0/weights",),
    (),
    _architecture,
    _v1_config,
    needs_config=False,
    from_source=_source_rules(1, "hf-mobilenet-v1"),
    made=_v1_made,
)
V2_PRESET = Preset(
    "hf-mobilenet-v2",
    "MobileNet v2 (tensorflow/models research/slim) to transformers' "
    "MobileNetV2ForImageClassification and MobileNetV2Model",
    ("MobilenetV2/Conv/weights",),
    (),
    _architecture,
    _v2_config,
    needs_config=False,
    from_source=_source_rules(2, "hf-mobilenet-v2"),
    made=_v2_made,
)
