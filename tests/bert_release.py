"""A small BERT checkpoint as google-research/bert's training writes it, and its forward pass.

Run as a script (TensorFlow only, in a process of its own: transformers' PyTorch is
imported elsewhere): ``python bert_release.py DIR HEAD`` writes ``DIR/bert_model.ckpt``
with the release's variable names and layouts (dense kernels [in, out], the Adam
moments ``adam_m``/``adam_v`` of every weight and ``global_step``, as a training run
leaves them) with ``tf.raw_ops.SaveV2``, and ``DIR/bert_config.json``; then computes
the model's outputs for ``INPUTS`` in TensorFlow from the checkpoint it wrote, following
the release's modeling.py definition (its gelu is the tanh approximation), and saves
them as ``DIR/outputs.npz``. ``HEAD`` is ``pretraining``, ``classifier`` or ``squad``.
"""

from __future__ import annotations

import json
import math
import os
import sys

import numpy as np

CONFIG = {
    "vocab_size": 50,
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 32,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 24,
    "type_vocab_size": 2,
    "initializer_range": 0.02,
}
INPUT_IDS = np.array([[2, 7, 11, 3, 9, 0], [5, 1, 4, 8, 0, 0]], np.int64)
TOKEN_TYPES = np.array([[0, 0, 0, 1, 1, 0], [0, 0, 1, 1, 0, 0]], np.int64)
MASK = np.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]], np.int64)
LABELS = 3  # run_classifier's


def weights(head: str) -> dict[str, np.ndarray]:
    """The release's variables (names and layouts), random values."""
    rng = np.random.default_rng(11)
    c = CONFIG
    h, i = c["hidden_size"], c["intermediate_size"]

    def w(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    out = {
        "bert/embeddings/word_embeddings": w(c["vocab_size"], h),
        "bert/embeddings/token_type_embeddings": w(c["type_vocab_size"], h),
        "bert/embeddings/position_embeddings": w(c["max_position_embeddings"], h),
        "bert/embeddings/LayerNorm/gamma": 1 + w(h),
        "bert/embeddings/LayerNorm/beta": w(h),
        "bert/pooler/dense/kernel": w(h, h),
        "bert/pooler/dense/bias": w(h),
    }
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
    if head == "pretraining":
        out["cls/predictions/transform/dense/kernel"] = w(h, h)
        out["cls/predictions/transform/dense/bias"] = w(h)
        out["cls/predictions/transform/LayerNorm/gamma"] = 1 + w(h)
        out["cls/predictions/transform/LayerNorm/beta"] = w(h)
        out["cls/predictions/output_bias"] = w(c["vocab_size"])
        out["cls/seq_relationship/output_weights"] = w(2, h)
        out["cls/seq_relationship/output_bias"] = w(2)
    elif head == "classifier":
        out["output_weights"] = w(LABELS, h)
        out["output_bias"] = w(LABELS)
    elif head == "squad":
        out["cls/squad/output_weights"] = w(2, h)
        out["cls/squad/output_bias"] = w(2)
    # What AdamWeightDecayOptimizer leaves: two moments per weight, and the step.
    for name in list(out):
        out[name + "/adam_m"] = np.zeros_like(out[name])
        out[name + "/adam_v"] = np.abs(out[name]) * 0.01
    out["global_step"] = np.array(1000, np.int64)
    return out


def forward(tf, reader, head: str) -> dict[str, np.ndarray]:
    """The release's forward pass (modeling.py, eval mode), from the checkpoint."""
    c = CONFIG

    def v(name):
        return tf.constant(reader.get_tensor(name))

    def layer_norm(x, scope):
        mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + 1e-12) * v(scope + "/gamma") + v(scope + "/beta")

    def dense(x, scope):
        return tf.matmul(x, v(scope + "/kernel")) + v(scope + "/bias")

    def gelu(x):
        return x * 0.5 * (1.0 + tf.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * tf.pow(x, 3))))

    batch, seq = INPUT_IDS.shape
    heads, width = c["num_attention_heads"], c["hidden_size"] // c["num_attention_heads"]
    x = (
        tf.gather(v("bert/embeddings/word_embeddings"), INPUT_IDS)
        + tf.gather(v("bert/embeddings/token_type_embeddings"), TOKEN_TYPES)
        + v("bert/embeddings/position_embeddings")[:seq]
    )
    x = layer_norm(x, "bert/embeddings/LayerNorm")
    adder = (1.0 - tf.cast(MASK[:, None, None, :], tf.float32)) * -10000.0

    def split(t):
        return tf.transpose(tf.reshape(t, [batch, seq, heads, width]), [0, 2, 1, 3])

    for n in range(c["num_hidden_layers"]):
        p = f"bert/encoder/layer_{n}/"
        q, k, val = (split(dense(x, p + f"attention/self/{s}")) for s in ("query", "key", "value"))
        scores = tf.matmul(q, k, transpose_b=True) / math.sqrt(width) + adder
        ctx = tf.matmul(tf.nn.softmax(scores), val)
        ctx = tf.reshape(tf.transpose(ctx, [0, 2, 1, 3]), [batch, seq, heads * width])
        attn = layer_norm(
            dense(ctx, p + "attention/output/dense") + x, p + "attention/output/LayerNorm"
        )
        inter = gelu(dense(attn, p + "intermediate/dense"))
        x = layer_norm(dense(inter, p + "output/dense") + attn, p + "output/LayerNorm")
    pooled = tf.tanh(dense(x[:, 0], "bert/pooler/dense"))
    out = {"last_hidden_state": x.numpy(), "pooler_output": pooled.numpy()}
    if head == "pretraining":
        t = gelu(dense(x, "cls/predictions/transform/dense"))
        t = layer_norm(t, "cls/predictions/transform/LayerNorm")
        logits = tf.matmul(t, v("bert/embeddings/word_embeddings"), transpose_b=True)
        out["prediction_logits"] = (logits + v("cls/predictions/output_bias")).numpy()
        nsp = tf.matmul(pooled, v("cls/seq_relationship/output_weights"), transpose_b=True)
        out["seq_relationship_logits"] = (nsp + v("cls/seq_relationship/output_bias")).numpy()
    elif head == "classifier":
        logits = tf.matmul(pooled, v("output_weights"), transpose_b=True) + v("output_bias")
        out["logits"] = logits.numpy()
    elif head == "squad":
        logits = tf.matmul(x, v("cls/squad/output_weights"), transpose_b=True)
        logits = logits + v("cls/squad/output_bias")
        out["start_logits"] = logits[..., 0].numpy()
        out["end_logits"] = logits[..., 1].numpy()
    return out


def main(directory: str, head: str) -> None:
    import tensorflow as tf
    from transform_helpers import save_v2

    os.makedirs(directory, exist_ok=True)
    prefix = os.path.join(directory, "bert_model.ckpt")
    values = weights(head)
    save_v2(prefix, {n: values[n] for n in sorted(values)})  # TensorFlow's SaveV2 op
    with open(os.path.join(directory, "bert_config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    outputs = forward(tf, tf.train.load_checkpoint(prefix), head)
    np.savez(os.path.join(directory, "outputs.npz"), **outputs)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
