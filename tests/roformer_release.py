"""Small RoFormer checkpoints as the release (ZhuiyiTechnology/roformer, built with
bert4keras) stores them, and their outputs.

Run as a script (TensorFlow only, in a process of its own: transformers' PyTorch is
imported elsewhere): ``python roformer_release.py DIR`` writes, for each model of
``CONFIGS``, ``DIR/MODEL/bert_model.ckpt`` with the release's variable names and layouts
(bert4keras's mapping onto Google BERT's names, without
``bert/embeddings/position_embeddings``; ``bert/encoder/embedding_hidden_mapping_in``
where ``embedding_size`` differs from ``hidden_size``; dense kernels [in, out]; the Adam
moments ``adam_m``/``adam_v`` of every weight and ``global_step`` that a TF1 training run
of BERT's optimizer leaves; bert4keras's own converter writes the weights alone) with
``tf.raw_ops.SaveV2``, and ``DIR/MODEL/bert_config.json``; then computes the outputs for
the inputs in TensorFlow from the checkpoint it wrote, following bert4keras's RoFormer
(models.py ``RoFormer``, layers.py ``MultiHeadAttention`` with ``p_bias='rotary'``,
backend.py ``sinusoidal_embeddings`` and ``apply_rotary_position_embeddings``; token 0
masked as ``mask_zero`` masks it; gelu the exact one; LayerNorm epsilon 1e-12), saved as
``DIR/MODEL/outputs.npz``.
"""

from __future__ import annotations

import json
import math
import os
import sys

import numpy as np
from bert_release import INPUT_IDS, MASK, TOKEN_TYPES

_BASE = {
    "vocab_size": 50,
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "intermediate_size": 32,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 24,
    "type_vocab_size": 2,
    "initializer_range": 0.02,
}
CONFIGS = {
    # The released model: the MLM head (train.py's with_mlm), embeddings as wide as
    # the layers, 4 heads of 4.
    "mlm": {**_BASE, "num_attention_heads": 4},
    # Narrower embeddings projected to the layers (Embedding-Mapping), 2 heads of 8, and
    # a pooler (with_pool): the encoder alone.
    "encoder": {**_BASE, "num_attention_heads": 2, "embedding_size": 8},
}
FILE = "bert_model.ckpt"


def weights(model: str) -> dict[str, np.ndarray]:
    """The release's variables (names and layouts), random values."""
    rng = np.random.default_rng(23)
    c = CONFIGS[model]
    h, i = c["hidden_size"], c["intermediate_size"]
    e = c.get("embedding_size", h)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    out = {
        "bert/embeddings/word_embeddings": w(c["vocab_size"], e),
        "bert/embeddings/token_type_embeddings": w(c["type_vocab_size"], e),
        "bert/embeddings/LayerNorm/gamma": 1 + w(e),
        "bert/embeddings/LayerNorm/beta": w(e),
    }
    if e != h:
        out["bert/encoder/embedding_hidden_mapping_in/kernel"] = w(e, h)
        out["bert/encoder/embedding_hidden_mapping_in/bias"] = w(h)
    for n in range(c["num_hidden_layers"]):
        p = f"bert/encoder/layer_{n}/"
        for part in ("query", "key", "value"):
            out[p + f"attention/self/{part}/kernel"] = w(h, h)
            out[p + f"attention/self/{part}/bias"] = w(h)
        out[p + "attention/output/dense/kernel"] = w(h, h)
        out[p + "attention/output/dense/bias"] = w(h)
        out[p + "attention/output/LayerNorm/gamma"] = 1 + w(h)
        out[p + "attention/output/LayerNorm/beta"] = w(h)
        out[p + "intermediate/dense/kernel"] = w(h, i)
        out[p + "intermediate/dense/bias"] = w(i)
        out[p + "output/dense/kernel"] = w(i, h)
        out[p + "output/dense/bias"] = w(h)
        out[p + "output/LayerNorm/gamma"] = 1 + w(h)
        out[p + "output/LayerNorm/beta"] = w(h)
    if model == "mlm":
        out["cls/predictions/transform/dense/kernel"] = w(h, e)
        out["cls/predictions/transform/dense/bias"] = w(e)
        out["cls/predictions/transform/LayerNorm/gamma"] = 1 + w(e)
        out["cls/predictions/transform/LayerNorm/beta"] = w(e)
        out["cls/predictions/output_bias"] = w(c["vocab_size"])
    else:
        out["bert/pooler/dense/kernel"] = w(h, h)
        out["bert/pooler/dense/bias"] = w(h)
    for name in list(out):
        out[name + "/adam_m"] = np.zeros_like(out[name])
        out[name + "/adam_v"] = np.abs(out[name]) * 0.01
    out["global_step"] = np.array(1000, np.int64)
    return out


def forward(tf, reader, model: str) -> dict[str, np.ndarray]:
    """bert4keras's RoFormer (eval mode) on the inputs, from the checkpoint."""
    c = CONFIGS[model]
    assert ((INPUT_IDS != 0) == (MASK == 1)).all()  # bert4keras masks token 0

    def v(name):
        return tf.constant(reader.get_tensor(name))

    def layer_norm(x, scope):
        x = x - tf.reduce_mean(x, axis=-1, keepdims=True)
        std = tf.sqrt(tf.reduce_mean(tf.square(x), axis=-1, keepdims=True) + 1e-12)
        return x / std * v(scope + "/gamma") + v(scope + "/beta")

    def dense(x, scope):
        return tf.matmul(x, v(scope + "/kernel")) + v(scope + "/bias")

    def gelu(x):  # bert4keras's gelu: the exact one (erf)
        return 0.5 * x * (1.0 + tf.math.erf(x / math.sqrt(2.0)))

    batch, seq = INPUT_IDS.shape
    heads = c["num_attention_heads"]
    size = c["hidden_size"] // heads
    x = tf.gather(v("bert/embeddings/word_embeddings"), INPUT_IDS) + tf.gather(
        v("bert/embeddings/token_type_embeddings"), TOKEN_TYPES
    )
    x = layer_norm(x, "bert/embeddings/LayerNorm")
    if "embedding_size" in c:
        x = dense(x, "bert/encoder/embedding_hidden_mapping_in")
    # sinusoidal_embeddings: [sin(p w_0), cos(p w_0), sin(p w_1), ...], w_i = 10000^(-2i/d)
    positions = tf.range(seq, dtype=tf.float32)[None]
    freqs = tf.pow(10000.0, -2 * tf.range(size // 2, dtype=tf.float32) / size)
    angles = tf.einsum("...,d->...d", positions, freqs)
    table = tf.reshape(tf.stack([tf.sin(angles), tf.cos(angles)], axis=-1), [1, seq, size])
    table = table[:, :, None, :]  # aligned with [batch, seq, heads, size]
    cos_pos = tf.repeat(table[..., 1::2], 2, axis=-1)
    sin_pos = tf.repeat(table[..., ::2], 2, axis=-1)

    def rotate(t):
        turned = tf.reshape(tf.stack([-t[..., 1::2], t[..., ::2]], axis=4), tf.shape(t))
        return t * cos_pos + turned * sin_pos

    keys_mask = tf.cast(INPUT_IDS != 0, tf.float32)[:, None, None, :]
    for n in range(c["num_hidden_layers"]):
        p = f"bert/encoder/layer_{n}/"
        qw, kw, vw = (
            tf.reshape(dense(x, p + f"attention/self/{s}"), [batch, seq, heads, size])
            for s in ("query", "key", "value")
        )
        qw, kw = rotate(qw), rotate(kw)
        a = tf.einsum("bjhd,bkhd->bhjk", qw, kw) / size**0.5
        a = a * keys_mask - (1 - keys_mask) * 1e12  # sequence_masking with '-inf'
        o = tf.einsum("bhjk,bkhd->bjhd", tf.nn.softmax(a), vw)
        o = tf.reshape(o, [batch, seq, heads * size])
        x = layer_norm(dense(o, p + "attention/output/dense") + x, p + "attention/output/LayerNorm")
        f = dense(gelu(dense(x, p + "intermediate/dense")), p + "output/dense")
        x = layer_norm(f + x, p + "output/LayerNorm")
    out = {"last_hidden_state": x.numpy()}
    if model == "mlm":  # with_mlm='linear': logits
        t = gelu(dense(x, "cls/predictions/transform/dense"))
        t = layer_norm(t, "cls/predictions/transform/LayerNorm")
        logits = tf.matmul(t, v("bert/embeddings/word_embeddings"), transpose_b=True)
        out["logits"] = (logits + v("cls/predictions/output_bias")).numpy()
    return out


def main(directory: str) -> None:
    import tensorflow as tf
    from transform_helpers import save_v2

    for model in CONFIGS:
        where = os.path.join(directory, model)
        os.makedirs(where, exist_ok=True)
        prefix = os.path.join(where, FILE)
        values = weights(model)
        save_v2(prefix, {n: values[n] for n in sorted(values)})  # TensorFlow's SaveV2 op
        with open(os.path.join(where, "bert_config.json"), "w") as f:
            json.dump(CONFIGS[model], f, indent=2)
        outputs = forward(tf, tf.train.load_checkpoint(prefix), model)
        np.savez(os.path.join(where, "outputs.npz"), **outputs)


if __name__ == "__main__":
    main(sys.argv[1])
