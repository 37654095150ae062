"""Small PEGASUS checkpoints as the release (google-research/pegasus) stores them, and
their outputs.

Run as a script (TensorFlow only, in a process of its own: transformers' PyTorch is
imported elsewhere): ``python pegasus_release.py DIR`` writes ``DIR/model.ckpt-1000``
with the release's variable names and layouts (models/transformer.py's
TransformerEncoderDecoderModel: ``embeddings/weights``; per block the scopes
``self_attention``, ``memory_attention`` and ``ffn``, each with a ``LayerNorm``; the
projections ``q_proj``/``k_proj``/``v_proj``/``output_proj`` without biases; the
feed-forward's ``dense`` and ``dense_1``; a final ``LayerNorm`` per stack; kernels
[in, out]), the slots tensor2tensor's Adafactor (beta1 0: no first moment) leaves as a
TF1 optimizer names them (``VAR/Adafactor``, ``VAR/Adafactor_1``: a matrix's row and
column factors, a vector's whole second moment) and ``global_step``, with
``tf.raw_ops.SaveV2``; then computes, in TensorFlow from the checkpoint it wrote and
following the release's definition (embedding times sqrt(hidden); layers/timing.py's
signal; pre-LayerNorm blocks, tf.contrib's layer_norm with epsilon 1e-12; queries scaled
by head_size**-0.5; padding id 0 masked with the dtype's minimum; the decoder's input the
targets shifted right behind a zero vector, causal; logits on the shared embedding), the
encoder's output and the decoder's logits for ``INPUT_IDS`` and ``TARGETS``, saved as
``DIR/outputs.npz``; and, as ``eps_1e-05_*``, the same with transformers' LayerNorm
epsilon (1e-5), and as ``timing`` the release's timing signal for ``TIMING`` positions.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np

CONFIG = {
    "vocab_size": 40,
    "hidden_size": 16,
    "filter_size": 24,
    "num_heads": 4,
    "num_encoder_layers": 2,
    "num_decoder_layers": 3,
}
FILE = "model.ckpt-1000"
# A batch of two: the second input padded with the padding id 0, which the release
# masks; targets without padding (see test_presets_pegasus.py).
INPUT_IDS = np.array([[5, 9, 13, 2, 33, 7, 1], [17, 4, 28, 1, 0, 0, 0]], np.int32)
TARGETS = np.array([[8, 3, 21, 39, 1], [6, 30, 11, 1, 2]], np.int32)
TIMING = (1024, 16)  # positions, width: transformers' table for the test's config


def weights() -> dict[str, np.ndarray]:
    """The release's variables (names and layouts), random values, and what training
    leaves beside them."""
    rng = np.random.default_rng(31)
    c = CONFIG
    d, f = c["hidden_size"], c["filter_size"]

    def w(*shape, scale=0.3):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    out = {"embeddings/weights": w(c["vocab_size"], d, scale=d**-0.5)}

    def norm(scope):
        out[scope + "/LayerNorm/gamma"] = 1 + w(d, scale=0.1)
        out[scope + "/LayerNorm/beta"] = w(d, scale=0.1)

    for stack, layers in (
        ("encoder", c["num_encoder_layers"]),
        ("decoder", c["num_decoder_layers"]),
    ):
        for n in range(layers):
            p = f"{stack}/layer_{n}/"
            scopes = (
                ("self_attention", "memory_attention")
                if stack == "decoder"
                else ("self_attention",)
            )
            for scope in scopes:
                norm(p + scope)
                for m in ("q_proj", "k_proj", "v_proj", "output_proj"):
                    out[f"{p}{scope}/{m}/kernel"] = w(d, d)
            norm(p + "ffn")
            out[p + "ffn/dense/kernel"] = w(d, f)
            out[p + "ffn/dense/bias"] = w(f, scale=0.1)
            out[p + "ffn/dense_1/kernel"] = w(f, d)
            out[p + "ffn/dense_1/bias"] = w(d, scale=0.1)
        norm(stack)
    for name in list(out):
        value = out[name]
        if value.ndim == 2:  # factored second moment: per row, per column
            out[name + "/Adafactor"] = np.abs(value).mean(axis=1) * 0.01
            out[name + "/Adafactor_1"] = np.abs(value).mean(axis=0) * 0.01
        else:
            out[name + "/Adafactor"] = np.abs(value) * 0.01
    out["global_step"] = np.array(1000, np.int64)
    return out


def timing_signal(tf, length: int, width: int):
    """layers/timing.py's add_time_signal, of zeros: [1, length, width]."""
    n = width // 2
    positions = tf.cast(tf.range(length)[None], tf.float32)
    increment = math.log(1.0e4 / 1.0) / tf.maximum(tf.cast(n, tf.float32) - 1, 1)
    scales = 1.0 * tf.exp(tf.cast(tf.range(n), tf.float32) * -increment)
    angles = tf.expand_dims(positions, 2) * tf.reshape(scales, [1, 1, -1])
    return tf.reshape(tf.concat([tf.sin(angles), tf.cos(angles)], axis=2), [1, length, width])


def forward(tf, reader, epsilon: float) -> dict[str, np.ndarray]:
    """The release's model (eval mode) on the inputs, from the checkpoint."""
    c = CONFIG
    d, heads = c["hidden_size"], c["num_heads"]
    low = np.finfo(np.float32).min

    def v(name):
        return tf.constant(reader.get_tensor(name))

    def layer_norm(x, scope):  # tf.contrib.layers.layer_norm over the last axis
        mean, variance = tf.nn.moments(x, [2], keepdims=True)
        gamma, beta = v(scope + "/LayerNorm/gamma"), v(scope + "/LayerNorm/beta")
        return tf.nn.batch_normalization(x, mean, variance, beta, gamma, epsilon)

    def dense(x, scope, bias=True):
        y = tf.einsum("bid,de->bie", x, v(scope + "/kernel"))
        return y + v(scope + "/bias") if bias else y

    def split(x):
        b, i = x.shape[0], x.shape[1]
        return tf.transpose(tf.reshape(x, [b, i, heads, d // heads]), [0, 2, 1, 3])

    def attention(x, memory, bias, scope):
        q = split(dense(x, scope + "/q_proj", False)) * (d // heads) ** -0.5
        k = split(dense(memory, scope + "/k_proj", False))
        val = split(dense(memory, scope + "/v_proj", False))
        weights = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) + bias[:, None])
        o = tf.transpose(tf.matmul(weights, val), [0, 2, 1, 3])
        return dense(tf.reshape(o, [x.shape[0], x.shape[1], d]), scope + "/output_proj", False)

    def block(x, bias, memory, memory_bias, scope):
        y = layer_norm(x, scope + "/self_attention")
        x = x + attention(y, y, bias, scope + "/self_attention")
        if memory is not None:
            y = layer_norm(x, scope + "/memory_attention")
            x = x + attention(y, memory, memory_bias, scope + "/memory_attention")
        y = tf.nn.relu(dense(layer_norm(x, scope + "/ffn"), scope + "/ffn/dense"))
        return x + dense(y, scope + "/ffn/dense_1")

    embeddings = v("embeddings/weights")
    inputs_bias = tf.cast(tf.equal(INPUT_IDS, 0), tf.float32)[:, None, :] * low
    x = tf.gather(embeddings, INPUT_IDS) * d**0.5
    x = x + timing_signal(tf, INPUT_IDS.shape[1], d)
    for n in range(c["num_encoder_layers"]):
        x = block(x, inputs_bias, None, None, f"encoder/layer_{n}")
    memory = layer_norm(x, "encoder")

    length = TARGETS.shape[1]
    causal = (1 - tf.linalg.band_part(tf.ones([length, length]), -1, 0))[None] * low
    y = tf.gather(embeddings, TARGETS) * d**0.5
    y = tf.pad(y, [[0, 0], [1, 0], [0, 0]])[:, :-1, :]  # a zero vector, then the targets
    y = y + timing_signal(tf, length, d)
    for n in range(c["num_decoder_layers"]):
        y = block(y, causal, memory, inputs_bias, f"decoder/layer_{n}")
    y = layer_norm(y, "decoder")
    logits = tf.einsum("btd,vd->btv", y, embeddings)
    return {"encoder_last_hidden_state": memory.numpy(), "logits": logits.numpy()}


def main(directory: str) -> None:
    import tensorflow as tf
    from transform_helpers import save_v2

    os.makedirs(directory, exist_ok=True)
    prefix = os.path.join(directory, FILE)
    values = weights()
    save_v2(prefix, {n: values[n] for n in sorted(values)})  # TensorFlow's SaveV2 op
    reader = tf.train.load_checkpoint(prefix)
    outputs = forward(tf, reader, 1e-12)
    outputs.update({f"eps_1e-05_{k}": a for k, a in forward(tf, reader, 1e-5).items()})
    outputs["timing"] = timing_signal(tf, *TIMING)[0].numpy()
    np.savez(os.path.join(directory, "outputs.npz"), **outputs)


if __name__ == "__main__":
    main(sys.argv[1])
