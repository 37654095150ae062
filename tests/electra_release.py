"""A small ELECTRA pretraining checkpoint as google-research/electra writes it, and its outputs.

Run as a script (TensorFlow only, in a process of its own: transformers' PyTorch is
imported elsewhere): ``python electra_release.py DIR`` writes ``DIR/model.ckpt`` with
the release's variable names and layouts, both networks as run_pretraining.py builds
them: the discriminator ``electra/`` (embeddings, ``embeddings_project`` since the
embedding is narrower than the hidden size, BERT's ``encoder/layer_N``) with
``discriminator_predictions/{dense,dense_1}``; the generator ``generator/``
(``embeddings_project`` and an encoder of its own, reading the discriminator's
``electra/embeddings``) with ``generator_predictions/{dense,LayerNorm,output_bias}``;
dense kernels [in, out]; the Adam moments ``adam_m``/``adam_v`` of every weight and
``global_step``. The release has no config file. It then computes both networks' logits
in TensorFlow from the checkpoint it wrote, following the release's model/modeling.py
(the exact, erf gelu; ``hidden_size // 64`` heads) and run_pretraining.py's heads, saved
as ``DIR/outputs.npz`` (``discriminator_logits``, ``generator_logits``).
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np
from bert_release import INPUT_IDS, MASK, TOKEN_TYPES

VOCAB, EMBEDDING, POSITIONS, TYPES = 50, 16, 24, 2
# (scope, hidden size, layers): the heads are hidden // 64, as the release's sizes make
# them (2 for the discriminator, 1 for the generator).
NETWORKS = {"discriminator": ("electra", 128, 2), "generator": ("generator", 64, 1)}
FILE = "model.ckpt"


def weights() -> dict[str, np.ndarray]:
    """The release's variables (names and layouts), random values."""
    rng = np.random.default_rng(23)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    out = {
        "electra/embeddings/word_embeddings": w(VOCAB, EMBEDDING),
        "electra/embeddings/token_type_embeddings": w(TYPES, EMBEDDING),
        "electra/embeddings/position_embeddings": w(POSITIONS, EMBEDDING),
        "electra/embeddings/LayerNorm/gamma": 1 + w(EMBEDDING),
        "electra/embeddings/LayerNorm/beta": w(EMBEDDING),
    }
    for scope, h, layers in NETWORKS.values():
        i = 4 * h
        out[f"{scope}/embeddings_project/kernel"] = w(EMBEDDING, h)
        out[f"{scope}/embeddings_project/bias"] = w(h)
        for n in range(layers):
            p = f"{scope}/encoder/layer_{n}/"
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
    h = NETWORKS["discriminator"][1]
    out["discriminator_predictions/dense/kernel"] = w(h, h)
    out["discriminator_predictions/dense/bias"] = w(h)
    out["discriminator_predictions/dense_1/kernel"] = w(h, 1)
    out["discriminator_predictions/dense_1/bias"] = w(1)
    out["generator_predictions/dense/kernel"] = w(NETWORKS["generator"][1], EMBEDDING)
    out["generator_predictions/dense/bias"] = w(EMBEDDING)
    out["generator_predictions/LayerNorm/gamma"] = 1 + w(EMBEDDING)
    out["generator_predictions/LayerNorm/beta"] = w(EMBEDDING)
    out["generator_predictions/output_bias"] = w(VOCAB)
    # What AdamWeightDecayOptimizer leaves: two moments per weight, and the step.
    for name in list(out):
        out[name + "/adam_m"] = np.zeros_like(out[name])
        out[name + "/adam_v"] = np.abs(out[name]) * 0.01
    out["global_step"] = np.array(1000, np.int64)
    return out


def forward(tf, reader) -> dict[str, np.ndarray]:
    """Both networks' logits (model/modeling.py, run_pretraining.py; eval mode)."""

    def v(name):
        return tf.constant(reader.get_tensor(name))

    def layer_norm(x, scope):
        mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + 1e-12) * v(scope + "/gamma") + v(scope + "/beta")

    def dense(x, scope):
        return tf.matmul(x, v(scope + "/kernel")) + v(scope + "/bias")

    def gelu(x):
        return x * 0.5 * (1.0 + tf.math.erf(x / math.sqrt(2.0)))

    batch, seq = INPUT_IDS.shape
    embedded = (
        tf.gather(v("electra/embeddings/word_embeddings"), INPUT_IDS)
        + tf.gather(v("electra/embeddings/token_type_embeddings"), TOKEN_TYPES)
        + v("electra/embeddings/position_embeddings")[:seq]
    )
    embedded = layer_norm(embedded, "electra/embeddings/LayerNorm")
    adder = (1.0 - tf.cast(MASK[:, None, None, :], tf.float32)) * -10000.0

    def encoder(scope, hidden, layers):
        heads = max(1, hidden // 64)
        width = hidden // heads

        def split(t):
            return tf.transpose(tf.reshape(t, [batch, seq, heads, width]), [0, 2, 1, 3])

        x = dense(embedded, f"{scope}/embeddings_project")
        for n in range(layers):
            p = f"{scope}/encoder/layer_{n}/"
            q, k, val = (
                split(dense(x, p + f"attention/self/{s}")) for s in ("query", "key", "value")
            )
            scores = tf.matmul(q, k, transpose_b=True) / math.sqrt(width) + adder
            ctx = tf.matmul(tf.nn.softmax(scores), val)
            ctx = tf.reshape(tf.transpose(ctx, [0, 2, 1, 3]), [batch, seq, hidden])
            attn = layer_norm(
                dense(ctx, p + "attention/output/dense") + x, p + "attention/output/LayerNorm"
            )
            inter = gelu(dense(attn, p + "intermediate/dense"))
            x = layer_norm(dense(inter, p + "output/dense") + attn, p + "output/LayerNorm")
        return x

    disc = encoder(*NETWORKS["discriminator"])
    hidden = gelu(dense(disc, "discriminator_predictions/dense"))
    disc_logits = tf.squeeze(dense(hidden, "discriminator_predictions/dense_1"), -1)
    gen = encoder(*NETWORKS["generator"])
    hidden = gelu(dense(gen, "generator_predictions/dense"))
    hidden = layer_norm(hidden, "generator_predictions/LayerNorm")
    gen_logits = tf.matmul(hidden, v("electra/embeddings/word_embeddings"), transpose_b=True)
    gen_logits = gen_logits + v("generator_predictions/output_bias")
    return {"discriminator_logits": disc_logits.numpy(), "generator_logits": gen_logits.numpy()}


def main(directory: str) -> None:
    import tensorflow as tf
    from transform_helpers import save_v2

    os.makedirs(directory, exist_ok=True)
    prefix = os.path.join(directory, FILE)
    values = weights()
    save_v2(prefix, {n: values[n] for n in sorted(values)})  # TensorFlow's SaveV2 op
    outputs = forward(tf, tf.train.load_checkpoint(prefix))
    np.savez(os.path.join(directory, "outputs.npz"), **outputs)


if __name__ == "__main__":
    main(sys.argv[1])
