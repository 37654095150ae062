"""Small ALBERT checkpoints as google-research/albert's training writes them, and their outputs.

Run as a script (TensorFlow only, in a process of its own: transformers' PyTorch is
imported elsewhere): ``python albert_release.py DIR`` writes, for each head of
``CONFIGS``, ``DIR/HEAD/model.ckpt-best`` with the release's variable names and layouts
(BERT's outer scope; factorised word embeddings [vocab, embedding_size] projected by
``encoder/embedding_hidden_mapping_in``; the layers stored once per group as
``transformer/group_G/inner_group_I`` with ``attention_1``, ``LayerNorm``, ``ffn_1`` and
``LayerNorm_1``; dense kernels [in, out]; LAMB's ``adam_m``/``adam_v`` of every weight and
``global_step``) with ``tf.raw_ops.SaveV2``, and ``DIR/HEAD/albert_config.json``; then
computes the model's outputs for the inputs in TensorFlow from the checkpoint it wrote,
following the release's modeling.py (the attention's 3-D einsum kernels; group
``int(layer / layers * groups)`` for each layer; gelu's tanh approximation) and
run_pretraining.py / classifier_utils.py heads, saved as ``DIR/HEAD/outputs.npz``.
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
    "embedding_size": 8,
    "hidden_size": 16,
    "num_attention_heads": 4,
    "intermediate_size": 32,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0,
    "attention_probs_dropout_prob": 0,
    "max_position_embeddings": 24,
    "type_vocab_size": 2,
    "initializer_range": 0.02,
    # The release's config has these too; its modeling.py does not read them.
    "net_structure_type": 0,
    "gap_size": 0,
    "num_memory_blocks": 0,
    "down_scale_factor": 1,
}
CONFIGS = {
    # One group shared by three layers, as the released models share theirs.
    "pretraining": {**_BASE, "num_hidden_layers": 3, "num_hidden_groups": 1, "inner_group_num": 1},
    # Two groups of two inner groups each: every index of the names in use.
    "classifier": {**_BASE, "num_hidden_layers": 2, "num_hidden_groups": 2, "inner_group_num": 2},
}
LABELS = 3  # run_classifier's
FILE = "model.ckpt-best"


def weights(head: str) -> dict[str, np.ndarray]:
    """The release's variables (names and layouts), random values."""
    rng = np.random.default_rng(17)
    c = CONFIGS[head]
    e, h, i = c["embedding_size"], c["hidden_size"], c["intermediate_size"]

    def w(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    out = {
        "bert/embeddings/word_embeddings": w(c["vocab_size"], e),
        "bert/embeddings/token_type_embeddings": w(c["type_vocab_size"], e),
        "bert/embeddings/position_embeddings": w(c["max_position_embeddings"], e),
        "bert/embeddings/LayerNorm/gamma": 1 + w(e),
        "bert/embeddings/LayerNorm/beta": w(e),
        "bert/encoder/embedding_hidden_mapping_in/kernel": w(e, h),
        "bert/encoder/embedding_hidden_mapping_in/bias": w(h),
        "bert/pooler/dense/kernel": w(h, h),
        "bert/pooler/dense/bias": w(h),
    }
    for g in range(c["num_hidden_groups"]):
        for n in range(c["inner_group_num"]):
            p = f"bert/encoder/transformer/group_{g}/inner_group_{n}/"
            for part in ("query", "key", "value"):
                out[p + f"attention_1/self/{part}/kernel"] = w(h, h)
                out[p + f"attention_1/self/{part}/bias"] = w(h)
            out[p + "attention_1/output/dense/kernel"] = w(h, h)
            out[p + "attention_1/output/dense/bias"] = w(h)
            out[p + "LayerNorm/gamma"] = 1 + w(h)
            out[p + "LayerNorm/beta"] = w(h)
            out[p + "ffn_1/intermediate/dense/kernel"] = w(h, i)
            out[p + "ffn_1/intermediate/dense/bias"] = w(i)
            out[p + "ffn_1/intermediate/output/dense/kernel"] = w(i, h)
            out[p + "ffn_1/intermediate/output/dense/bias"] = w(h)
            out[p + "LayerNorm_1/gamma"] = 1 + w(h)
            out[p + "LayerNorm_1/beta"] = w(h)
    if head == "pretraining":
        out["cls/predictions/transform/dense/kernel"] = w(h, e)  # back to embedding_size
        out["cls/predictions/transform/dense/bias"] = w(e)
        out["cls/predictions/transform/LayerNorm/gamma"] = 1 + w(e)
        out["cls/predictions/transform/LayerNorm/beta"] = w(e)
        out["cls/predictions/output_bias"] = w(c["vocab_size"])
        out["cls/seq_relationship/output_weights"] = w(2, h)
        out["cls/seq_relationship/output_bias"] = w(2)
    elif head == "classifier":
        out["output_weights"] = w(LABELS, h)
        out["output_bias"] = w(LABELS)
    # What the LAMB optimizer leaves: two moments per weight, and the step.
    for name in list(out):
        out[name + "/adam_m"] = np.zeros_like(out[name])
        out[name + "/adam_v"] = np.abs(out[name]) * 0.01
    out["global_step"] = np.array(1000, np.int64)
    return out


def forward(tf, reader, head: str) -> dict[str, np.ndarray]:
    """The release's forward pass (modeling.py, eval mode), from the checkpoint."""
    c = CONFIGS[head]

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
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    width = hidden // heads
    x = (
        tf.gather(v("bert/embeddings/word_embeddings"), INPUT_IDS)
        + tf.gather(v("bert/embeddings/token_type_embeddings"), TOKEN_TYPES)
        + v("bert/embeddings/position_embeddings")[:seq]
    )
    x = layer_norm(x, "bert/embeddings/LayerNorm")
    x = dense(x, "bert/encoder/embedding_hidden_mapping_in")
    adder = (1.0 - tf.cast(MASK[:, None, None, :], tf.float32)) * -10000.0

    def heads_of(t, scope):  # dense_layer_3d: [B, F, H] x [H, N, D] -> [B, N, F, D]
        kernel = tf.reshape(v(scope + "/kernel"), [hidden, heads, width])
        out = tf.einsum("BFH,HND->BFND", t, kernel) + tf.reshape(v(scope + "/bias"), [heads, width])
        return tf.transpose(out, [0, 2, 1, 3])

    layers, groups = c["num_hidden_layers"], c["num_hidden_groups"]
    for layer in range(layers):
        group = int(layer / layers * groups)
        for inner in range(c["inner_group_num"]):
            p = f"bert/encoder/transformer/group_{group}/inner_group_{inner}/"
            q, k, val = (
                heads_of(x, p + f"attention_1/self/{s}") for s in ("query", "key", "value")
            )
            scores = tf.matmul(q, k, transpose_b=True) / math.sqrt(width) + adder
            ctx = tf.transpose(tf.matmul(tf.nn.softmax(scores), val), [0, 2, 1, 3])
            # dense_layer_3d_proj: [B, F, N, D] x [N, D, H] -> [B, F, H]
            proj = tf.reshape(v(p + "attention_1/output/dense/kernel"), [heads, width, hidden])
            attn = tf.einsum("BFND,NDH->BFH", ctx, proj) + v(p + "attention_1/output/dense/bias")
            attn = layer_norm(attn + x, p + "LayerNorm")
            ffn = gelu(dense(attn, p + "ffn_1/intermediate/dense"))
            ffn = dense(ffn, p + "ffn_1/intermediate/output/dense")
            x = layer_norm(ffn + attn, p + "LayerNorm_1")
    pooled = tf.tanh(dense(x[:, 0], "bert/pooler/dense"))
    out = {"last_hidden_state": x.numpy(), "pooler_output": pooled.numpy()}
    if head == "pretraining":
        t = gelu(dense(x, "cls/predictions/transform/dense"))
        t = layer_norm(t, "cls/predictions/transform/LayerNorm")
        logits = tf.matmul(t, v("bert/embeddings/word_embeddings"), transpose_b=True)
        out["prediction_logits"] = (logits + v("cls/predictions/output_bias")).numpy()
        sop = tf.matmul(pooled, v("cls/seq_relationship/output_weights"), transpose_b=True)
        out["sop_logits"] = (sop + v("cls/seq_relationship/output_bias")).numpy()
    elif head == "classifier":
        logits = tf.matmul(pooled, v("output_weights"), transpose_b=True) + v("output_bias")
        out["logits"] = logits.numpy()
    return out


def main(directory: str) -> None:
    import tensorflow as tf
    from transform_helpers import save_v2

    for head in CONFIGS:
        where = os.path.join(directory, head)
        os.makedirs(where, exist_ok=True)
        prefix = os.path.join(where, FILE)
        values = weights(head)
        save_v2(prefix, {n: values[n] for n in sorted(values)})  # TensorFlow's SaveV2 op
        with open(os.path.join(where, "albert_config.json"), "w") as f:
            json.dump(CONFIGS[head], f, indent=2)
        outputs = forward(tf, tf.train.load_checkpoint(prefix), head)
        np.savez(os.path.join(where, "outputs.npz"), **outputs)


if __name__ == "__main__":
    main(sys.argv[1])
