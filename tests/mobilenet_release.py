"""Small MobileNet v1 and v2 checkpoints as tensorflow/models research/slim names them, and
their forward pass.

Run as a script (TensorFlow only, in a process of its own): ``python mobilenet_release.py
DIR`` writes, for each of ``VARIANTS``, ``DIR/VARIANT/FILE`` (the release's file name:
``mobilenet_v1_0.25_40.ckpt``) with slim's variable names and layouts, as
``nets/mobilenet_v1.py`` and ``nets/mobilenet/mobilenet_v2.py`` (with ``conv_blocks.py``'s
``expanded_conv``) create them: convolution ``weights`` [kh, kw, in, out], depthwise
``depthwise_weights`` [kh, kw, channels, 1], each followed by a ``BatchNorm`` with
``gamma``, ``beta``, ``moving_mean`` and ``moving_variance``, the logits' 1x1 convolution
``Logits/Conv2d_1c_1x1`` with ``weights`` and ``biases``; with what slim's
``train_image_classifier.py`` leaves beside them (``global_step``, the optimizer's slots of
every trainable variable: RMSProp's ``/RMSProp`` and ``/RMSProp_1``, or Momentum's
``/Momentum``; with ``--moving_average_decay`` an ``/ExponentialMovingAverage`` shadow of
every model variable, the moving statistics included), saved with ``tf.raw_ops.SaveV2``.
Then it computes the outputs for ``pixels()`` in TensorFlow from the checkpoint it wrote,
as slim's inference graph does (SAME padding, batch norm with the moving statistics and
epsilon 0.001, ReLU6; v1's average pool over the last feature map, whose 7x7 kernel
``_reduced_kernel_size_for_small_input`` cuts to its size, v2's ``global_pool``; v2's
residual where a block keeps its stride and depth; no activation after a projection):
once with the shadows in place of the variables (as slim's eval with
``--moving_average_decay`` restores them) and once with the raw variables, saved as
``DIR/VARIANT/outputs.npz`` (``logits``/``logits_raw``, or for a network without logits
``features``/``features_raw``, the last feature map, NHWC).
"""

from __future__ import annotations

import os
import sys

import numpy as np

VARIANTS = {
    # The released v1 layout at a quarter of the depth: 1001 classes (0: background),
    # RMSProp and moving averages, as slim's training leaves them.
    "v1": dict(version=1, multiplier=0.25, size=40, classes=1001, optimizer="rmsprop", ema=True),
    # v1's base network alone (no logits: a feature extractor), without moving averages.
    "v1-base": dict(version=1, multiplier=0.5, size=35, classes=0, optimizer="rmsprop", ema=False),
    # The released v2 layout at 0.35 (finegrain_classification_mode: the last layer keeps
    # 1280 channels), 1001 classes, RMSProp and moving averages.
    "v2": dict(
        version=2, multiplier=0.35, size=36, classes=1001, optimizer="rmsprop", ema=True,
        finegrain=True,
    ),
    # A fine-tuned v2 of 10 classes at 0.5, its last layer scaled too, trained with Momentum.
    "v2-head": dict(
        version=2, multiplier=0.5, size=33, classes=10, optimizer="momentum", ema=False,
        finegrain=False,
    ),
}  # fmt: skip
BATCH = 2
EMA = "/ExponentialMovingAverage"
_BN = ("gamma", "beta", "moving_mean", "moving_variance")

# mobilenet_v1.py's _CONV_DEFS after the first Conv(stride 2, depth 32): (stride, depth).
V1_DEFS = [(1, 64), (2, 128), (1, 128), (2, 256), (1, 256), (2, 512)]
V1_DEFS += [(1, 512)] * 5 + [(2, 1024), (1, 1024)]
# mobilenet_v2.py's V2_DEF: the expanded_convs after the first (stride, depth).
V2_DEFS = [(2, 24), (1, 24), (2, 32), (1, 32), (1, 32), (2, 64), (1, 64), (1, 64), (1, 64)]
V2_DEFS += [(1, 96), (1, 96), (1, 96), (2, 160), (1, 160), (1, 160), (1, 320)]


def file_name(variant: str) -> str:
    c = VARIANTS[variant]
    return f"mobilenet_v{c['version']}_{c['multiplier']}_{c['size']}.ckpt"


def _make_divisible(v: float, divisor: int = 8, min_value: int | None = None) -> int:
    """mobilenet.py's: the nearest multiple of divisor, not 10% under v."""
    min_value = divisor if min_value is None else min_value
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


def layers(variant: str) -> list[tuple[str, str, int, tuple[int, ...], str]]:
    """(scope, kind, stride, kernel shape, activation) of every convolution, in order: kind
    ``conv`` or ``depthwise``; activation ``relu6`` or ``none``; a scope ending ``+`` adds
    the block's input (v2's residual)."""
    c = VARIANTS[variant]
    dm = c["multiplier"]
    out: list[tuple[str, str, int, tuple[int, ...], str]] = []
    if c["version"] == 1:
        depth = max(int(32 * dm), 8)  # mobilenet_v1_base's depth(), min_depth 8
        out.append(("MobilenetV1/Conv2d_0", "conv", 2, (3, 3, 3, depth), "relu6"))
        for i, (stride, d) in enumerate(V1_DEFS, start=1):
            new = max(int(d * dm), 8)
            scope = f"MobilenetV1/Conv2d_{i}"
            out.append((scope + "_depthwise", "depthwise", stride, (3, 3, depth, 1), "relu6"))
            out.append((scope + "_pointwise", "conv", 1, (1, 1, depth, new), "relu6"))
            depth = new
        return out
    depth = _make_divisible(32 * dm)  # depth_multiplier(): divisible by 8, min_depth 8
    out.append(("MobilenetV2/Conv", "conv", 2, (3, 3, 3, depth), "relu6"))
    first = _make_divisible(16 * dm)  # expansion 1: no expand layer
    out.append(("MobilenetV2/expanded_conv/depthwise", "depthwise", 1, (3, 3, depth, 1), "relu6"))
    out.append(("MobilenetV2/expanded_conv/project", "conv", 1, (1, 1, depth, first), "none"))
    depth = first
    for k, (stride, d) in enumerate(V2_DEFS, start=1):
        new = _make_divisible(d * dm)
        inner = _make_divisible(depth * 6)  # expand_input_by_factor(6)
        scope = f"MobilenetV2/expanded_conv_{k}/"
        residual = "+" if stride == 1 and new == depth else ""
        out.append((scope + "expand", "conv", 1, (1, 1, depth, inner), "relu6"))
        out.append((scope + "depthwise", "depthwise", stride, (3, 3, inner, 1), "relu6"))
        out.append((scope + "project" + residual, "conv", 1, (1, 1, inner, new), "none"))
        depth = new
    last = 1280 / dm if c["finegrain"] and dm < 1 else 1280
    out.append(
        ("MobilenetV2/Conv_1", "conv", 1, (1, 1, depth, _make_divisible(last * dm)), "relu6")
    )
    return out


def weights(variant: str, ema: bool | None = None) -> dict[str, np.ndarray]:
    """The variant's variables (random values) with what its training leaves beside them."""
    c = VARIANTS[variant]
    rng = np.random.default_rng(41)
    model: dict[str, np.ndarray] = {}
    for scope, kind, _, shape, _ in layers(variant):
        scope = scope.rstrip("+")
        fan_in = shape[0] * shape[1] * (1 if kind == "depthwise" else shape[2])
        leaf = "depthwise_weights" if kind == "depthwise" else "weights"
        model[f"{scope}/{leaf}"] = rng.normal(0, np.sqrt(2 / fan_in), shape).astype(np.float32)
        n = shape[2] if kind == "depthwise" else shape[3]
        bn = scope + "/BatchNorm/"
        model[bn + "gamma"] = rng.uniform(0.6, 1.4, n).astype(np.float32)
        model[bn + "beta"] = rng.normal(0.1, 0.2, n).astype(np.float32)
        model[bn + "moving_mean"] = rng.normal(0.2, 0.3, n).astype(np.float32)
        model[bn + "moving_variance"] = rng.uniform(0.5, 2.0, n).astype(np.float32)
    if c["classes"]:
        depth = layers(variant)[-1][3][3]
        logits = f"MobilenetV{c['version']}/Logits/Conv2d_1c_1x1/"
        model[logits + "weights"] = rng.normal(0, 0.2, (1, 1, depth, c["classes"])).astype(
            np.float32
        )
        model[logits + "biases"] = rng.normal(0, 0.5, c["classes"]).astype(np.float32)
    out = dict(model)
    trainable = [n for n in model if not n.endswith(("moving_mean", "moving_variance"))]
    for name in trainable:
        if c["optimizer"] == "rmsprop":  # tf.train.RMSPropOptimizer: ms, then momentum
            out[name + "/RMSProp"] = np.square(model[name]) * 0.1 + 1e-3
            out[name + "/RMSProp_1"] = model[name] * 0.01
        else:
            out[name + "/Momentum"] = model[name] * 0.02
    if c["ema"] if ema is None else ema:  # every model variable's shadow
        for name, value in model.items():
            jitter = rng.uniform(-0.15, 0.15, value.shape).astype(np.float32)
            if name.endswith("moving_variance"):
                out[name + EMA] = value * (1 + jitter)
            else:
                out[name + EMA] = value + jitter * (np.abs(value) + 0.05)
    out["global_step"] = np.array(20000, np.int64)
    return out


def pixels(variant: str) -> np.ndarray:
    """A batch of images as slim's preprocessing gives them: NHWC, in [-1, 1]."""
    size = VARIANTS[variant]["size"]
    rng = np.random.default_rng(5)
    return rng.uniform(-1, 1, (BATCH, size, size, 3)).astype(np.float32)


def forward(tf, reader, variant: str, shadows: bool) -> np.ndarray:
    """The logits (or, without logits, the last feature map) slim's inference computes."""
    c = VARIANTS[variant]
    names = set(reader.get_variable_to_shape_map())

    def v(name):  # variables_to_restore: the shadow in place of the variable
        return tf.constant(
            reader.get_tensor(name + EMA if shadows and name + EMA in names else name)
        )

    x = tf.constant(pixels(variant))
    block_input = x
    for scope, kind, stride, _, act in layers(variant):
        residual = scope.endswith("+")
        scope = scope.rstrip("+")
        if scope.endswith("/expand") or (kind == "depthwise" and "expanded_conv/" in scope):
            block_input = x
        if kind == "depthwise":
            w = v(scope + "/depthwise_weights")
            x = tf.nn.depthwise_conv2d(x, w, [1, stride, stride, 1], "SAME")
        else:
            x = tf.nn.conv2d(x, v(scope + "/weights"), [1, stride, stride, 1], "SAME")
        bn = scope + "/BatchNorm/"
        x = tf.nn.batch_normalization(
            x, v(bn + "moving_mean"), v(bn + "moving_variance"), v(bn + "beta"), v(bn + "gamma"),
            0.001,
        )  # fmt: skip
        if act == "relu6":
            x = tf.nn.relu6(x)
        if residual:
            x = block_input + x
    if not c["classes"]:
        return x.numpy()
    if c["version"] == 1:  # AvgPool_1a: the 7x7 kernel cut to the map, VALID
        h, w = x.shape[1], x.shape[2]
        k = [1, min(h, 7), min(w, 7), 1]
        x = tf.nn.avg_pool2d(x, k, [1, 2, 2, 1], "VALID")
    else:  # global_pool
        x = tf.nn.avg_pool2d(x, [1, x.shape[1], x.shape[2], 1], [1, 1, 1, 1], "VALID")
    logits = f"MobilenetV{c['version']}/Logits/Conv2d_1c_1x1/"
    x = tf.nn.conv2d(x, v(logits + "weights"), [1, 1, 1, 1], "SAME") + v(logits + "biases")
    return tf.squeeze(x, [1, 2]).numpy()


def main(directory: str) -> None:
    import tensorflow as tf
    from transform_helpers import save_v2

    for variant, c in VARIANTS.items():
        where = os.path.join(directory, variant)
        os.makedirs(where, exist_ok=True)
        prefix = os.path.join(where, file_name(variant))
        values = weights(variant)
        save_v2(prefix, {n: values[n] for n in sorted(values)})  # TensorFlow's SaveV2 op
        reader = tf.train.load_checkpoint(prefix)
        key = "logits" if c["classes"] else "features"
        outputs = {key: forward(tf, reader, variant, True)}
        outputs[key + "_raw"] = forward(tf, reader, variant, False)
        np.savez(os.path.join(where, "outputs.npz"), **outputs)


if __name__ == "__main__":
    main(sys.argv[1])
