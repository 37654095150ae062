"""A small release of the original OpenAI GPT as openai/finetune-transformer-lm ships it,
and its forward pass.

Importable without TensorFlow: :func:`parameters` (train.py's parameters, in the order
it creates them, as the release's shapes file lists them: the position and the token
embeddings first, then twelve a block) and :func:`write`, which lays them out as the
release's ``model/`` directory: ``params_shapes.json`` (their shapes, a JSON list) and
``params_0.npy`` ... ``params_9.npy``, every parameter flattened, all concatenated and
cut into ten consecutive one-dimensional float32 pieces (what train.py's loader takes
apart: concatenate, split at the running sums of the sizes, reshape), so that
parameters straddle shards.

Run as a script (TensorFlow only, in a process of its own): ``python
openai_gpt_release.py DIR`` writes ``DIR/model`` and computes, in TensorFlow, train.py's
``model`` (dropout off) for ``INPUT_IDS`` from those files, loaded as train.py loads
them (its ``we``: the tokens, ``n_special`` fresh rows, the positions), saved as
``DIR/outputs.npz``: ``hidden`` (the last block's output) and ``logits`` (the
language model's, over the token rows of ``we``).
"""

from __future__ import annotations

import json
import math
import os
import sys

import numpy as np

# train.py's sizes, tiny; n_head is its default (12), which the release has no file for.
HPARAMS = {"n_vocab": 40, "n_ctx": 16, "n_embd": 24, "n_head": 12, "n_layer": 2}
N_SPECIAL = 3  # train.py's _start_, _delimiter_, _classify_
SHARDS = 10
INPUT_IDS = np.array([[3, 17, 5, 9, 31, 2, 11], [8, 1, 1, 22, 14, 39, 0]], np.int64)
BLOCK = (
    "attn/c_attn/w",
    "attn/c_attn/b",
    "attn/c_proj/w",
    "attn/c_proj/b",
    "ln_1/g",
    "ln_1/b",
    "mlp/c_fc/w",
    "mlp/c_fc/b",
    "mlp/c_proj/w",
    "mlp/c_proj/b",
    "ln_2/g",
    "ln_2/b",
)


def parameters(seed: int = 7) -> list[tuple[str, np.ndarray]]:
    """(name, value) of every parameter the release holds, in its order."""
    rng = np.random.default_rng(seed)
    h = HPARAMS
    n = h["n_embd"]

    def w(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    out = [("model/we/positions", w(h["n_ctx"], n)), ("model/we/tokens", w(h["n_vocab"], n))]
    for i in range(h["n_layer"]):
        values = [
            w(1, n, 3 * n),
            w(3 * n),
            w(1, n, n),
            w(n),
            1 + w(n),
            w(n),
            w(1, n, 4 * n),
            w(4 * n),
            w(1, 4 * n, n),
            w(n),
            1 + w(n),
            w(n),
        ]
        out += [(f"model/h{i}/{name}", v) for name, v in zip(BLOCK, values)]
    return out


def write(directory: str, params: list[tuple[str, np.ndarray]] | None = None) -> str:
    """The release's ``model/`` files of ``params`` (default :func:`parameters`) in
    ``directory``; returns it."""
    params = parameters() if params is None else params
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "params_shapes.json"), "w") as f:
        json.dump([list(v.shape) for _, v in params], f)
    flat = np.concatenate([v.reshape(-1) for _, v in params])
    for k, piece in enumerate(np.array_split(flat, SHARDS)):
        np.save(os.path.join(directory, f"params_{k}.npy"), piece)
    return directory


def load(directory: str) -> list[np.ndarray]:
    """The parameters as train.py loads them from ``directory``."""
    with open(os.path.join(directory, "params_shapes.json")) as f:
        shapes = json.load(f)
    offsets = np.cumsum([np.prod(shape) for shape in shapes])
    shards = [np.load(os.path.join(directory, f"params_{k}.npy")) for k in range(SHARDS)]
    pieces = np.split(np.concatenate(shards, 0), offsets)[:-1]
    return [p.reshape(shape) for p, shape in zip(pieces, shapes)]


def forward(tf, directory: str) -> dict[str, np.ndarray]:
    """train.py's model (train=False) on ``INPUT_IDS``: the last block's output and the
    language model's logits over the token rows."""
    h = HPARAMS
    n, heads = h["n_embd"], h["n_head"]
    params = load(directory)
    special = np.random.default_rng(1).standard_normal((N_SPECIAL, n)).astype(np.float32) * 0.02
    # train.py: we = tokens, n_special fresh rows, positions[:n_ctx]; then the blocks'.
    we = tf.constant(np.concatenate([params[1], special, params[0][: h["n_ctx"]]], 0))
    blocks = params[2:]

    def norm(x, g, b):
        u = tf.reduce_mean(x, axis=[-1], keepdims=True)
        s = tf.reduce_mean(tf.square(x - u), axis=[-1], keepdims=True)
        return (x - u) * tf.math.rsqrt(s + 1e-5) * g + b

    def conv1d(x, w, b):  # rf == 1: the "faster 1x1 conv"
        nx, nf = w.shape[1], w.shape[2]
        shape = x.shape[:-1] + [nf]
        return tf.reshape(tf.matmul(tf.reshape(x, [-1, nx]), tf.reshape(w, [-1, nf])) + b, shape)

    def gelu(x):
        return 0.5 * x * (1 + tf.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * tf.pow(x, 3))))

    def split_heads(x, k=False):
        x = tf.reshape(x, x.shape[:-1] + [heads, x.shape[-1] // heads])
        return tf.transpose(x, [0, 2, 3, 1] if k else [0, 2, 1, 3])

    batch, seq = INPUT_IDS.shape
    positions = h["n_vocab"] + N_SPECIAL + np.arange(seq)
    X = np.stack([INPUT_IDS, np.broadcast_to(positions, INPUT_IDS.shape)], -1)
    x = tf.reduce_sum(tf.gather(we, X), 2)
    band = tf.reshape(tf.linalg.band_part(tf.ones([seq, seq]), -1, 0), [1, 1, seq, seq])
    for i in range(h["n_layer"]):
        p = [tf.constant(v) for v in blocks[12 * i : 12 * (i + 1)]]
        q, k, v = tf.split(conv1d(x, p[0], p[1]), 3, 2)
        w = tf.matmul(split_heads(q), split_heads(k, k=True))
        w = w * tf.math.rsqrt(tf.cast(n // heads, tf.float32))
        w = tf.nn.softmax(w * band + -1e9 * (1 - band))
        a = tf.transpose(tf.matmul(w, split_heads(v)), [0, 2, 1, 3])
        a = conv1d(tf.reshape(a, [batch, seq, n]), p[2], p[3])
        nrm = norm(x + a, p[4], p[5])
        m = conv1d(gelu(conv1d(nrm, p[6], p[7])), p[8], p[9])
        x = norm(nrm + m, p[10], p[11])
    logits = tf.reshape(tf.matmul(tf.reshape(x, [-1, n]), we, transpose_b=True), [batch, seq, -1])
    return {"hidden": x.numpy(), "logits": logits.numpy()[:, :, : h["n_vocab"]]}


def main(directory: str) -> None:
    import tensorflow as tf

    model = write(os.path.join(directory, "model"))
    np.savez(os.path.join(directory, "outputs.npz"), **forward(tf, model))


if __name__ == "__main__":
    main(sys.argv[1])
