"""Small MobileBERT checkpoints as the release (google-research/google-research
mobilebert/) stores them, and their outputs.

Run as a script (TensorFlow only, in a process of its own: transformers' PyTorch is
imported elsewhere): ``python mobilebert_release.py DIR`` writes, for each model of
``CONFIGS``, ``DIR/MODEL/mobilebert.ckpt`` with the release's variable names and layouts
(modeling.py's scopes: ``embedding_transformation``, ``bottleneck/input``,
``bottleneck/attention``, ``ffn_layer_K``, ``output/bottleneck``, ``FakeLayerNorm`` for
``no_norm``; run_pretraining's ``cls/predictions`` with ``extra_output_weights`` and
``cls/seq_relationship``, run_classifier's ``output_weights``, run_squad's
``cls/squad``; dense kernels [in, out]; the moments ``adam_m``/``adam_v`` the release's
AdamW and LAMB leave for every weight, and ``global_step``) with ``tf.raw_ops.SaveV2``,
and ``DIR/MODEL/mobilebert_config.json`` with modeling.BertConfig's keys; then computes
the outputs for the inputs in TensorFlow from the checkpoint it wrote, following the
release's modeling.py (BertModel, transformer_model, attention_layer, layer_norm with
its ``no_norm``; eval mode), run_pretraining.py (get_logits, get_next_sentence_output),
run_classifier.py and run_squad.py (create_model), saved as ``DIR/MODEL/outputs.npz``.

The inputs have no padding: the release masks a padded key by adding -6 to its score
(modeling.attention_layer: quantisation-friendly), transformers' port removes it from
the softmax, so the two agree only where the mask is all ones.
"""

from __future__ import annotations

import json
import math
import os
import sys

import numpy as np

INPUT_IDS = np.array([[2, 7, 11, 3, 9, 5], [5, 1, 4, 8, 6, 2]], np.int64)
TOKEN_TYPES = np.array([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1]], np.int64)
MASK = np.ones_like(INPUT_IDS)
LABELS = 3  # run_classifier's
FILE = "mobilebert.ckpt"
CONFIG_FILE = "mobilebert_config.json"

_BASE = {
    "vocab_size": 40,
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 12,
    "initializer_range": 0.02,
}
CONFIGS = {
    # uncased_L-24_H-128_B-512_A-4_F-4_OPT's layout (the released MobileBERT), small:
    # trigram input, queries and keys through a shared bottleneck, 4 FFNs, NoNorm, relu,
    # no pooler activation; pretraining's MLM (with extra_output_weights) and NSP heads.
    "pretraining": {
        **_BASE,
        "num_attention_heads": 2,
        "intermediate_size": 16,
        "hidden_act": "relu",
        "type_vocab_size": 2,
        "embedding_size": 8,
        "trigram_input": True,
        "use_bottleneck": True,
        "intra_bottleneck_size": 8,
        "key_query_shared_bottleneck": True,
        "num_feedforward_networks": 4,
        "normalization_type": "no_norm",
        "classifier_activation": False,
    },
    # uncased_L-24_H-128_B-512_A-4_F-2_tiny_OPT's layout: queries, keys and values all
    # from the input bottleneck (key_query_shared_bottleneck, also said here, is then
    # ignored, and the release makes no bottleneck/attention), 2 FFNs; with the pooler's
    # tanh and run_classifier's head.
    "classifier": {
        **_BASE,
        "num_attention_heads": 4,
        "intermediate_size": 12,
        "hidden_act": "relu",
        "type_vocab_size": 2,
        "embedding_size": 8,
        "trigram_input": True,
        "use_bottleneck": True,
        "intra_bottleneck_size": 8,
        "use_bottleneck_attention": True,
        "key_query_shared_bottleneck": True,
        "num_feedforward_networks": 2,
        "normalization_type": "no_norm",
        "classifier_activation": True,
    },
    # The released layout with embeddings as wide as the layers: no extra_output_weights
    # (transformers' model holds them as an empty matrix), one FFN, bottleneck attention.
    "wide": {
        **_BASE,
        "num_attention_heads": 2,
        "intermediate_size": 16,
        "hidden_act": "relu",
        "type_vocab_size": 2,
        "trigram_input": True,
        "use_bottleneck": True,
        "intra_bottleneck_size": 8,
        "use_bottleneck_attention": True,
        "normalization_type": "no_norm",
        "classifier_activation": False,
    },
    # No bottleneck, real LayerNorms, gelu, 2 FFNs, embeddings as wide as the layers and
    # no trigram input (so no embedding_transformation), type_vocab_size left to the
    # release's default (16); run_squad's head.
    "squad": {
        **_BASE,
        "num_attention_heads": 4,
        "intermediate_size": 24,
        "hidden_act": "gelu",
        "num_feedforward_networks": 2,
    },
}
HEADS = {
    "pretraining": "pretraining",
    "wide": "pretraining",
    "classifier": "classifier",
    "squad": "squad",
}


def settings(model: str) -> dict:
    """The config with modeling.BertConfig's defaults for what it leaves out."""
    c = {
        "type_vocab_size": 16,
        "trigram_input": False,
        "use_bottleneck": False,
        "use_bottleneck_attention": False,
        "key_query_shared_bottleneck": False,
        "num_feedforward_networks": 1,
        "normalization_type": "layer_norm",
        "classifier_activation": True,
        **CONFIGS[model],
    }
    c.setdefault("embedding_size", c["hidden_size"])
    c.setdefault("intra_bottleneck_size", c["hidden_size"])
    return c


def weights(model: str) -> dict[str, np.ndarray]:
    """The release's variables (names and layouts), random values."""
    rng = np.random.default_rng(41)
    c = settings(model)
    h, e, i = c["hidden_size"], c["embedding_size"], c["intermediate_size"]
    inner = c["intra_bottleneck_size"] if c["use_bottleneck"] else h
    norm = "FakeLayerNorm" if c["normalization_type"] == "no_norm" else "LayerNorm"

    def w(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    out: dict[str, np.ndarray] = {}

    def dense(scope, n_in, n_out):
        out[scope + "/kernel"] = w(n_in, n_out)
        out[scope + "/bias"] = w(n_out)

    def normal(scope, width, kind=norm):
        out[f"{scope}/{kind}/gamma"] = 1 + w(width)
        out[f"{scope}/{kind}/beta"] = w(width)

    out["bert/embeddings/word_embeddings"] = w(c["vocab_size"], e)
    if c["trigram_input"] or e != h:
        dense("bert/embeddings/embedding_transformation", e * (3 if c["trigram_input"] else 1), h)
    out["bert/embeddings/token_type_embeddings"] = w(c["type_vocab_size"], h)
    out["bert/embeddings/position_embeddings"] = w(c["max_position_embeddings"], h)
    normal("bert/embeddings", h)
    for n in range(c["num_hidden_layers"]):
        p = f"bert/encoder/layer_{n}/"
        if c["use_bottleneck"]:
            dense(p + "bottleneck/input/dense", h, inner)
            normal(p + "bottleneck/input", inner)
            if c["key_query_shared_bottleneck"] and not c["use_bottleneck_attention"]:
                dense(p + "bottleneck/attention/dense", h, inner)
                normal(p + "bottleneck/attention", inner)
        # The attention's inputs: the hidden states, or their bottlenecks.
        bottled = c["use_bottleneck"] and c["use_bottleneck_attention"]
        shared = c["use_bottleneck"] and c["key_query_shared_bottleneck"]
        dense(p + "attention/self/query", inner if bottled or shared else h, inner)
        dense(p + "attention/self/key", inner if bottled or shared else h, inner)
        dense(p + "attention/self/value", inner if bottled else h, inner)
        dense(p + "attention/output/dense", inner, inner)
        normal(p + "attention/output", inner)
        for k in range(c["num_feedforward_networks"] - 1):
            dense(p + f"ffn_layer_{k}/intermediate/dense", inner, i)
            dense(p + f"ffn_layer_{k}/output/dense", i, inner)
            normal(p + f"ffn_layer_{k}/output", inner)
        dense(p + "intermediate/dense", inner, i)
        dense(p + "output/dense", i, inner)
        normal(p + "output", inner)
        if c["use_bottleneck"]:
            dense(p + "output/bottleneck/dense", inner, h)
            normal(p + "output/bottleneck", h)
    if c["classifier_activation"]:
        dense("bert/pooler/dense", h, h)
    head = HEADS[model]
    if head == "pretraining":
        dense("cls/predictions/transform/dense", h, h)
        normal("cls/predictions/transform", h, "LayerNorm")
        out["cls/predictions/output_bias"] = w(c["vocab_size"])
        if h != e:
            out["cls/predictions/extra_output_weights"] = w(c["vocab_size"], h - e)
        out["cls/seq_relationship/output_weights"] = w(2, h)
        out["cls/seq_relationship/output_bias"] = w(2)
    elif head == "classifier":
        out["output_weights"] = w(LABELS, h)
        out["output_bias"] = w(LABELS)
    else:
        out["cls/squad/output_weights"] = w(2, h)
        out["cls/squad/output_bias"] = w(2)
    # What the release's optimizers (AdamW, LAMB) leave: two moments per weight, the step.
    for name in list(out):
        out[name + "/adam_m"] = np.zeros_like(out[name])
        out[name + "/adam_v"] = np.abs(out[name]) * 0.01
    out["global_step"] = np.array(1000, np.int64)
    return out


def forward(tf, reader, model: str, torch_eps: bool = False) -> dict[str, np.ndarray]:
    """The release's forward pass (eval mode), from the checkpoint. With ``torch_eps``,
    the embeddings' LayerNorm and each layer's last take epsilon 1e-5 (PyTorch's
    default), as transformers' port builds them, instead of the release's 1e-12."""
    c = settings(model)
    h, e = c["hidden_size"], c["embedding_size"]
    inner = c["intra_bottleneck_size"] if c["use_bottleneck"] else h
    heads = c["num_attention_heads"]
    size = inner // heads

    def v(name):
        return tf.constant(reader.get_tensor(name))

    def layer_norm(x, scope, eps=1e-12):  # contrib layers.layer_norm: epsilon 1e-12
        mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + eps) * v(scope + "/gamma") + v(scope + "/beta")

    def norm(x, scope, torch_default=False):  # modeling.layer_norm, normalization_type's
        if c["normalization_type"] == "no_norm":
            return x * v(scope + "/FakeLayerNorm/gamma") + v(scope + "/FakeLayerNorm/beta")
        return layer_norm(x, scope + "/LayerNorm", 1e-5 if torch_eps and torch_default else 1e-12)

    def dense(x, scope):
        return tf.einsum("...c,cd->...d", x, v(scope + "/kernel")) + v(scope + "/bias")

    def act(x):
        if c["hidden_act"] == "relu":
            return tf.nn.relu(x)
        cube = 0.044715 * tf.pow(x, 3)  # the release's gelu: the tanh approximation
        return x * 0.5 * (1.0 + tf.tanh(math.sqrt(2 / math.pi) * (x + cube)))

    batch, seq = INPUT_IDS.shape
    x = tf.gather(v("bert/embeddings/word_embeddings"), INPUT_IDS)
    if c["trigram_input"]:
        x = tf.concat(
            [
                tf.pad(x[:, 1:], ((0, 0), (0, 1), (0, 0))),
                x,
                tf.pad(x[:, :-1], ((0, 0), (1, 0), (0, 0))),
            ],
            axis=2,
        )
    if c["trigram_input"] or e != h:
        x = dense(x, "bert/embeddings/embedding_transformation")
    x = x + tf.gather(v("bert/embeddings/token_type_embeddings"), TOKEN_TYPES)
    x = x + v("bert/embeddings/position_embeddings")[:seq]
    x = norm(x, "bert/embeddings", torch_default=True)
    mask = tf.cast(MASK[:, None, None, :], tf.float32)  # [B, 1, F=1, T]
    for n in range(c["num_hidden_layers"]):
        p = f"bert/encoder/layer_{n}/"
        prev = x
        layer_input = query = key = value = prev
        if c["use_bottleneck"]:
            layer_input = norm(dense(prev, p + "bottleneck/input/dense"), p + "bottleneck/input")
            if c["use_bottleneck_attention"]:
                query = key = value = layer_input
            elif c["key_query_shared_bottleneck"]:
                shared = dense(prev, p + "bottleneck/attention/dense")
                query = key = norm(shared, p + "bottleneck/attention")
        q, k, val = (
            tf.reshape(dense(t, p + f"attention/self/{s}"), [batch, seq, heads, size])
            for t, s in ((query, "query"), (key, "key"), (value, "value"))
        )
        scores = tf.einsum("BFNH,BTNH->BNFT", q, k) * (1.0 / math.sqrt(float(size)))
        scores = scores * mask + (1 - mask) * -6  # the release's masking
        ctx = tf.einsum("BNFT,BTNH->BFNH", tf.nn.softmax(scores), val)
        ctx = tf.reshape(ctx, [batch, seq, inner])
        hidden = norm(
            dense(ctx, p + "attention/output/dense") + layer_input, p + "attention/output"
        )
        for f in range(c["num_feedforward_networks"] - 1):
            s = p + f"ffn_layer_{f}/"
            inter = act(dense(hidden, s + "intermediate/dense"))
            hidden = norm(dense(inter, s + "output/dense") + hidden, s + "output")
        inter = act(dense(hidden, p + "intermediate/dense"))
        x = norm(dense(inter, p + "output/dense") + hidden, p + "output", torch_default=True)
        if c["use_bottleneck"]:
            x = norm(dense(x, p + "output/bottleneck/dense") + prev, p + "output/bottleneck")
    first = x[:, 0]
    pooled = tf.tanh(dense(first, "bert/pooler/dense")) if c["classifier_activation"] else first
    out = {"last_hidden_state": x.numpy()}
    head = HEADS[model]
    if head == "pretraining":
        t = act(dense(x, "cls/predictions/transform/dense"))
        t = layer_norm(t, "cls/predictions/transform/LayerNorm")
        table = v("bert/embeddings/word_embeddings")
        if h != e:
            table = tf.concat([table, v("cls/predictions/extra_output_weights")], axis=1)
        logits = tf.einsum("bsh,vh->bsv", t, table) + v("cls/predictions/output_bias")
        out["prediction_logits"] = logits.numpy()
        nsp = tf.matmul(pooled, v("cls/seq_relationship/output_weights"), transpose_b=True)
        out["seq_relationship_logits"] = (nsp + v("cls/seq_relationship/output_bias")).numpy()
    elif head == "classifier":
        logits = tf.matmul(pooled, v("output_weights"), transpose_b=True) + v("output_bias")
        out["logits"] = logits.numpy()
    else:
        logits = tf.einsum("bsh,oh->bso", x, v("cls/squad/output_weights"))
        logits = logits + v("cls/squad/output_bias")
        out["start_logits"] = logits[..., 0].numpy()
        out["end_logits"] = logits[..., 1].numpy()
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
        with open(os.path.join(where, CONFIG_FILE), "w") as f:
            json.dump(CONFIGS[model], f, indent=2)
        reader = tf.train.load_checkpoint(prefix)
        np.savez(os.path.join(where, "outputs.npz"), **forward(tf, reader, model))
        if settings(model)["normalization_type"] == "layer_norm":
            outputs = forward(tf, reader, model, torch_eps=True)
            np.savez(os.path.join(where, "outputs-torch-eps.npz"), **outputs)


if __name__ == "__main__":
    main(sys.argv[1])
