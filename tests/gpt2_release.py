"""A small GPT-2 checkpoint as openai/gpt-2's code names it, and its forward pass.

Run as a script (TensorFlow only, in a process of its own): ``python gpt2_release.py
DIR`` writes ``DIR/model.ckpt`` with the release's variable names and layouts (every
projection a [1, n_in, n_out] convolution weight; the Adam slots and step a TF1
fine-tuning run leaves) with ``tf.raw_ops.SaveV2``, and ``DIR/hparams.json``; then
computes the language model's logits for ``INPUT_IDS`` in TensorFlow from the checkpoint,
following the release's model.py (layer norm epsilon 1e-5, gelu's tanh approximation,
causal attention), saved as ``DIR/outputs.npz``.
"""

from __future__ import annotations

import json
import math
import os
import sys

import numpy as np

HPARAMS = {"n_vocab": 40, "n_ctx": 16, "n_embd": 16, "n_head": 4, "n_layer": 2}
INPUT_IDS = np.array([[3, 17, 5, 9, 31, 2], [8, 1, 1, 22, 14, 39]], np.int64)


def weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    h = HPARAMS
    n = h["n_embd"]

    def w(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    out = {"model/wte": w(h["n_vocab"], n), "model/wpe": w(h["n_ctx"], n)}
    for i in range(h["n_layer"]):
        p = f"model/h{i}/"
        out[p + "ln_1/g"], out[p + "ln_1/b"] = 1 + w(n), w(n)
        out[p + "attn/c_attn/w"], out[p + "attn/c_attn/b"] = w(1, n, 3 * n), w(3 * n)
        out[p + "attn/c_proj/w"], out[p + "attn/c_proj/b"] = w(1, n, n), w(n)
        out[p + "ln_2/g"], out[p + "ln_2/b"] = 1 + w(n), w(n)
        out[p + "mlp/c_fc/w"], out[p + "mlp/c_fc/b"] = w(1, n, 4 * n), w(4 * n)
        out[p + "mlp/c_proj/w"], out[p + "mlp/c_proj/b"] = w(1, 4 * n, n), w(n)
    out["model/ln_f/g"], out["model/ln_f/b"] = 1 + w(n), w(n)
    for name in list(out):  # tf.compat.v1.train.AdamOptimizer's slots
        out[name + "/Adam"] = np.zeros_like(out[name])
        out[name + "/Adam_1"] = np.abs(out[name]) * 0.01
    out["beta1_power"] = np.array(0.9, np.float32)
    out["beta2_power"] = np.array(0.999, np.float32)
    out["global_step"] = np.array(400, np.int64)
    return out


def forward(tf, reader) -> np.ndarray:
    """The release's model (model.py), its logits."""
    h = HPARAMS

    def v(name):
        return tf.constant(reader.get_tensor(name))

    def norm(x, scope):
        u = tf.reduce_mean(x, axis=-1, keepdims=True)
        s = tf.reduce_mean(tf.square(x - u), axis=-1, keepdims=True)
        return (x - u) * tf.math.rsqrt(s + 1e-5) * v(scope + "/g") + v(scope + "/b")

    def conv1d(x, scope):
        w = v(scope + "/w")[0]
        return tf.einsum("bsi,io->bso", x, w) + v(scope + "/b")

    def gelu(x):
        return 0.5 * x * (1 + tf.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * tf.pow(x, 3))))

    batch, seq = INPUT_IDS.shape
    heads, width = h["n_head"], h["n_embd"] // h["n_head"]
    x = tf.gather(v("model/wte"), INPUT_IDS) + v("model/wpe")[:seq]
    causal = tf.constant(np.tril(np.ones((seq, seq), np.float32)))

    def split(t):
        return tf.transpose(tf.reshape(t, [batch, seq, heads, width]), [0, 2, 1, 3])

    for i in range(h["n_layer"]):
        p = f"model/h{i}/"
        q, k, val = tf.split(conv1d(norm(x, p + "ln_1"), p + "attn/c_attn"), 3, axis=2)
        w = tf.matmul(split(q), split(k), transpose_b=True) * (1 / math.sqrt(width))
        w = w * causal - 1e10 * (1 - causal)
        a = tf.matmul(tf.nn.softmax(w), split(val))
        a = tf.reshape(tf.transpose(a, [0, 2, 1, 3]), [batch, seq, heads * width])
        x = x + conv1d(a, p + "attn/c_proj")
        m = conv1d(gelu(conv1d(norm(x, p + "ln_2"), p + "mlp/c_fc")), p + "mlp/c_proj")
        x = x + m
    x = norm(x, "model/ln_f")
    return tf.matmul(x, v("model/wte"), transpose_b=True).numpy()


def main(directory: str) -> None:
    import tensorflow as tf
    from transform_helpers import save_v2

    os.makedirs(directory, exist_ok=True)
    prefix = os.path.join(directory, "model.ckpt")
    values = weights()
    save_v2(prefix, {n: values[n] for n in sorted(values)})  # TensorFlow's SaveV2 op
    with open(os.path.join(directory, "hparams.json"), "w") as f:
        json.dump(HPARAMS, f)
    np.savez(
        os.path.join(directory, "outputs.npz"), logits=forward(tf, tf.train.load_checkpoint(prefix))
    )


if __name__ == "__main__":
    main(sys.argv[1])
