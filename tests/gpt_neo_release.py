"""Small GPT-Neo checkpoints as EleutherAI/gpt-neo's Mesh TensorFlow code names them, and
their forward pass.

Run as a script (TensorFlow only, in a process of its own): ``python gpt_neo_release.py
DIR VARIANT`` writes ``DIR/model.ckpt-1000`` with the release's variable names and
layouts (scope ``gpt2/``; ``wte`` [vocab, n_embd], ``wpe`` [n_ctx, n_embd]; each block's
``norm_1``/``norm_2`` with ``g`` and ``b``; the attention's ``q``/``k``/``v`` [n_embd,
heads*head size] and ``o`` [heads*head size, n_embd] as Mesh TF's ``attention_params_simple``
makes them, the output bias ``compute_output_bias/o_b``; the feed-forward's
``conv1d_main/c_fc`` and ``c_proj`` kernels [in, out] and biases; ``ln_f``) with
``tf.raw_ops.SaveV2``, the optimizer's slots and ``global_step`` a training run leaves,
and ``DIR/config.json``, the run's config; then computes the logits for ``INPUT_IDS`` in
TensorFlow from the checkpoint it wrote, following models/gpt2/gpt2.py and
models/layers.py (layer norm epsilon 1e-5, no 1/sqrt(head size) in attention, global
attention causal, local attention to the positions (p - radius, p] as
``local_attention_1d`` with ``fully_autoregressive`` has it, mtf.gelu's tanh form, logits
by the token embedding after ``ln_f``), saved as ``DIR/outputs.npz``.

``VARIANT`` ``adam``: global and local layers alternating as in the released 1.3B and
2.7B models, with ``AdamWeightDecayOptimizer``'s ``adam_m``/``adam_v`` slots (the
releases' optimizer). ``adafactor``: local layers first, then global ones, trained with
Mesh TF's Adafactor (``_slot_vr``/``_slot_vc`` of matrices, ``_slot_v`` of vectors), the
vocabulary padded past the tokenizer's as gpt-neo's configs pad it.
"""

from __future__ import annotations

import json
import math
import os
import sys

import numpy as np

VARIANTS = {
    "adam": dict(
        n_vocab=64, n_ctx=24, n_embd=16, n_head=4, n_layer=4, radius=4,
        attention_types=[[["global", "local"], 2]], opt_name="adam",
    ),
    "adafactor": dict(
        n_vocab=72, n_ctx=20, n_embd=12, n_head=3, n_layer=3, radius=5,
        attention_types=[[["local"], 2], [["global"], 1]], opt_name="adafactor",
    ),
}  # fmt: skip
# Longer than either radius, so the local layers see less than the global ones.
INPUT_IDS = np.array(
    [[(7 * i + 3) % 61 + 1 for i in range(18)], [(5 * i + 2) % 59 + 3 for i in range(18)]],
    np.int64,
)


def expand(attention_types) -> list[str]:
    """The per-layer attention kinds of gpt-neo's ``[[kinds, repeats], ...]``."""
    return [kind for kinds, repeats in attention_types for _ in range(repeats) for kind in kinds]


def config(variant: str) -> dict:
    """The run's config.json (a gpt-neo configs/*.json), as the releases ship it."""
    c = VARIANTS[variant]
    return {
        "n_head": c["n_head"], "n_vocab": c["n_vocab"], "embed_dropout": 0, "lr": 0.0002,
        "lr_decay": "cosine", "warmup_steps": 3000, "beta1": 0.9, "beta2": 0.95,
        "epsilon": 1e-8, "opt_name": c["opt_name"], "weight_decay": 0, "train_batch_size": 8,
        "attn_dropout": 0, "train_steps": 1000, "eval_steps": 0, "predict_steps": 1,
        "res_dropout": 0, "eval_batch_size": 8, "predict_batch_size": 1, "iterations": 100,
        "n_embd": c["n_embd"], "datasets": [["pile", None, None, None]],
        "model_path": "gs://neo-models/tiny", "n_ctx": c["n_ctx"], "n_layer": c["n_layer"],
        "scale_by_depth": True, "scale_by_in": False,
        "attention_types": c["attention_types"], "local_attention_radius": c["radius"],
        "mesh_shape": "x:1,y:1", "layout": "batch:x", "activation_function": "gelu",
        "recompute_grad": False, "gradient_clipping": 1.0, "padding_id": 0, "eos_id": 1,
    }  # fmt: skip


def weights(variant: str) -> dict[str, np.ndarray]:
    """The Mesh TF variables of the variant, random values, with the optimizer's state."""
    c = VARIANTS[variant]
    rng = np.random.default_rng(29)
    n = c["n_embd"]

    def w(*shape, scale=0.3):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    out = {"gpt2/wte": w(c["n_vocab"], n, scale=1.0), "gpt2/wpe": w(c["n_ctx"], n)}
    for i in range(c["n_layer"]):
        p = f"gpt2/h{i}/"
        for norm in ("norm_1", "norm_2"):
            out[p + norm + "/g"], out[p + norm + "/b"] = 1 + w(n, scale=0.2), w(n, scale=0.1)
        for m in "qkv":
            out[p + "attn/" + m] = w(n, n)
        out[p + "attn/o"] = w(n, n)
        out[p + "attn/compute_output_bias/o_b"] = w(n, scale=0.1)
        mlp = p + "mlp/conv1d_main/"
        out[mlp + "c_fc/kernel"], out[mlp + "c_fc/bias"] = w(n, 4 * n), w(4 * n, scale=0.1)
        out[mlp + "c_proj/kernel"] = w(4 * n, n, scale=0.15)
        out[mlp + "c_proj/bias"] = w(n, scale=0.1)
    out["gpt2/ln_f/g"], out["gpt2/ln_f/b"] = 1 + w(n, scale=0.2), w(n, scale=0.1)
    for name in list(out):
        value = out[name]
        if c["opt_name"] == "adam":  # optimizers.AdamWeightDecayOptimizer
            out[name + "/adam_m"] = value * 0.01
            out[name + "/adam_v"] = np.square(value) * 0.001
        elif value.ndim == 2:  # mtf.optimize.AdafactorOptimizer, factored
            big = int(np.argmax(value.shape))
            out[name + "_slot_vr"] = np.abs(value).mean(axis=big)
            out[name + "_slot_vc"] = np.abs(value).mean(axis=1 - big)
        else:
            out[name + "_slot_v"] = np.square(value) * 0.01
    out["global_step"] = np.array(1000, np.int64)
    return out


def forward(tf, reader, variant: str) -> np.ndarray:
    """The model's logits (predict mode: no dropout), from the checkpoint."""
    c = VARIANTS[variant]
    batch, seq = INPUT_IDS.shape
    heads, size = c["n_head"], c["n_embd"] // c["n_head"]

    def v(name):
        return tf.constant(reader.get_tensor(name))

    def layer_norm(x, scope):  # layers.layer_norm: norm() then x * g + b
        x = x - tf.reduce_mean(x, axis=-1, keepdims=True)
        s = tf.reduce_mean(tf.square(x), axis=-1, keepdims=True)
        return x * tf.math.rsqrt(s + 1e-5) * v(scope + "/g") + v(scope + "/b")

    def linear(x, scope):  # mtf.layers.dense: kernel [in, out], bias
        return tf.einsum("bsi,io->bso", x, v(scope + "/kernel")) + v(scope + "/bias")

    def gelu(x):  # mtf.gelu
        return 0.5 * x * (1 + tf.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))

    def split(t):  # the combined [heads * size] dimension, heads first
        return tf.transpose(tf.reshape(t, [batch, seq, heads, size]), [0, 2, 1, 3])

    query = np.arange(seq)[:, None]
    memory = np.arange(seq)[None, :]
    # biasmask_attn_weights: -1e10 where the memory position is past the query's;
    # local_attention_1d: visible when query - radius < memory <= query (its left halo
    # past the first block holds another sequence id, never visible), else -1e9.
    masks = {
        "global": (memory > query) * np.float32(-1e10),
        "local": ~((memory > query - c["radius"]) & (memory <= query)) * np.float32(-1e9),
    }
    x = tf.gather(v("gpt2/wte"), INPUT_IDS) + v("gpt2/wpe")[:seq]
    for i, kind in enumerate(expand(c["attention_types"])):
        p = f"gpt2/h{i}/"
        h = layer_norm(x, p + "norm_1")
        q, k, val = (split(tf.einsum("bsi,io->bso", h, v(p + "attn/" + m))) for m in "qkv")
        logits = tf.matmul(q, k, transpose_b=True) + masks[kind]  # no 1/sqrt(size)
        a = tf.matmul(tf.nn.softmax(logits), val)
        a = tf.reshape(tf.transpose(a, [0, 2, 1, 3]), [batch, seq, heads * size])
        x = x + tf.einsum("bsi,io->bso", a, v(p + "attn/o")) + v(p + "attn/compute_output_bias/o_b")
        h = layer_norm(x, p + "norm_2")
        mlp = p + "mlp/conv1d_main/"
        x = x + linear(gelu(linear(h, mlp + "c_fc")), mlp + "c_proj")
    x = layer_norm(x, "gpt2/ln_f")
    return tf.einsum("bsi,vi->bsv", x, v("gpt2/wte")).numpy()  # wte_final_einsum


def main(directory: str, variant: str) -> None:
    import tensorflow as tf
    from transform_helpers import save_v2

    os.makedirs(directory, exist_ok=True)
    prefix = os.path.join(directory, "model.ckpt-1000")
    values = weights(variant)
    save_v2(prefix, {n: values[n] for n in sorted(values)})  # TensorFlow's SaveV2 op
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config(variant), f, indent=4)
    logits = forward(tf, tf.train.load_checkpoint(prefix), variant)
    np.savez(os.path.join(directory, "outputs.npz"), logits=logits)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
