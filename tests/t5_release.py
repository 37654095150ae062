"""Small T5 checkpoints as Mesh TensorFlow writes them, and their forward pass.

Run as a script (TensorFlow only, in a process of its own): ``python t5_release.py DIR
VARIANT`` writes ``DIR/model.ckpt-1000`` with Mesh TF's variable names and layouts
(matrices [in, out], the relative attention bias [heads, buckets], the Adafactor slots
``_slot_vr``/``_slot_vc``/``_slot_v`` of every weight and ``global_step``) with
``tf.raw_ops.SaveV2``, and ``DIR/operative_config.gin``; then computes the decoder's
logits for ``INPUT_IDS`` and ``TARGETS`` in TensorFlow from the checkpoint it wrote,
following mesh_tensorflow.transformer (RMS norm without the mean, relative position
buckets bidirectional in the encoder and causal in the decoder, no 1/sqrt(d_kv) in
attention, padding by sequence id, tied logits scaled by d_model**-0.5), saved as
``DIR/outputs.npz``.

``VARIANT`` ``t5``: the 2019 release's model (relu feed-forward, logits tied to the
embedding, norms named layer_norm / final_layer_norm, a config from before
DenseReluDense took an activation). ``t5.1.1``: gated-gelu feed-forward, logits of
their own (decoder/logits/kernel), norms named rms_norm, heads*d_kv != d_model and a
deeper decoder. ``t5.1.1.lm100k``: the LM-adapted T5.1.1 (trained on from T5.1.1's
checkpoint: the same layout, its gin naming the checkpoint it started from). ``mt5``
(google-research/multilingual-t5) and ``byt5`` (google-research/byt5): T5.1.1's
layout with mT5's vocabulary of 250 112 rows and ByT5's of 384, ByT5's encoder three
times as deep as its decoder; their gins name their pretraining mixtures.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np

VARIANTS = {
    "t5": dict(
        vocab=64, d_model=16, d_ff=32, heads=4, d_kv=4, layers=2, decoder_layers=2,
        gated=False, tied=True, norm="layer_norm", final_norm="final_layer_norm",
    ),
    "t5.1.1": dict(
        vocab=64, d_model=16, d_ff=24, heads=4, d_kv=6, layers=2, decoder_layers=3,
        gated=True, tied=False, norm="rms_norm", final_norm="rms_norm",
    ),
    "t5.1.1.lm100k": dict(
        vocab=64, d_model=16, d_ff=40, heads=2, d_kv=8, layers=2, decoder_layers=2,
        gated=True, tied=False, norm="rms_norm", final_norm="rms_norm",
    ),
    "mt5": dict(
        vocab=250_112, d_model=8, d_ff=12, heads=2, d_kv=4, layers=2, decoder_layers=2,
        gated=True, tied=False, norm="rms_norm", final_norm="rms_norm",
    ),
    "byt5": dict(
        vocab=384, d_model=16, d_ff=24, heads=4, d_kv=4, layers=3, decoder_layers=1,
        gated=True, tied=False, norm="rms_norm", final_norm="rms_norm",
    ),
}  # fmt: skip
MIXTURES = {"mt5": "mc4", "byt5": "byt5_mc4"}  # the READMEs' pretraining tasks
BUCKETS, MAX_DISTANCE, EPSILON = 32, 128, 1e-6
# Long enough for relative positions past the exact buckets; the second row is padded.
INPUT_IDS = np.array(
    [
        [(7 * i + 3) % 63 + 1 for i in range(22)],
        [(5 * i + 2) % 63 + 1 for i in range(17)] + [0] * 5,
    ],
    np.int64,
)
ATTENTION_MASK = (INPUT_IDS != 0).astype(np.int64)
TARGETS = np.array(
    [[(3 * i + 5) % 63 + 1 for i in range(19)], [(11 * i + 1) % 63 + 1 for i in range(19)]],
    np.int64,
)
# Mesh TF's decoder reads the targets shifted right, 0 first (transformers'
# decoder_start_token_id).
DECODER_INPUT_IDS = np.concatenate([np.zeros((2, 1), np.int64), TARGETS[:, :-1]], axis=1)


def gin_config(variant: str) -> str:
    """An operative_config.gin of the variant's era, as Mesh TF writes one."""
    c = VARIANTS[variant]
    macros = (
        f"d_ff = {c['d_ff']}\nd_kv = {c['d_kv']}\nd_model = {c['d_model']}\n"
        f"dropout_rate = {0.1 if variant == 't5' else 0.0}\nMIXTURE_NAME = '{MIXTURES.get(variant, 'c4_v020_unsupervised')}'\n"
        f"num_heads = {c['heads']}\nnum_layers = {c['layers']}\n"
    )
    text = [
        "import mesh_tensorflow.optimize\nimport mesh_tensorflow.transformer.transformer\n"
        "import t5.models.mesh_transformer\n",
        "# Macros:\n# " + "=" * 78 + "\n" + macros,
        "# Parameters for AdafactorOptimizer:\nAdafactorOptimizer.decay_rate = None\n"
        "AdafactorOptimizer.epsilon1 = 1e-30\nAdafactorOptimizer.factored = True\n",
        "# Parameters for Bitransformer:\nBitransformer.shared_embedding = True\n",
    ]
    for stack in ("decoder", "encoder"):
        text.append(
            f"# Parameters for {stack}/DenseReluDense:\n"
            f"{stack}/DenseReluDense.dropout_rate = %dropout_rate\n"
            f"{stack}/DenseReluDense.hidden_size = %d_ff\n"
        )
        if variant != "t5":
            text.append(f"{stack}/DenseReluDense.activation = ['gelu', 'linear']\n")
        layers = "%num_layers" if stack == "encoder" else str(c["decoder_layers"])
        kinds = ["SelfAttention"] + (["EncDecAttention"] if stack == "decoder" else [])
        listed = ",\n     ".join(
            f"@mesh_tensorflow.transformer.transformer_layers.{k}"
            for k in kinds + ["DenseReluDense"]
        )
        text.append(
            f"# Parameters for {stack}/make_layer_stack:\n"
            f"{stack}/make_layer_stack.block_scope = True\n"
            f"{stack}/make_layer_stack.layers = \\\n    [{listed}]\n"
            f"{stack}/make_layer_stack.num_layers = {layers}\n"
        )
        if variant == "t5":
            text.append(
                f"{stack}/LayerStack.dropout_rate = %dropout_rate\n"
                f"{stack}/LayerStack.norm_epsilon = {EPSILON}\n"
            )
        else:
            text.append(
                f"{stack}/LayerStack.dropout_rate = None\n{stack}/LayerStack.norm_epsilon = None\n"
                f"{stack}/LayerStack.sublayers_final = \\\n"
                "    [@transformer.sublayer_rms_norm, @transformer.sublayer_dropout]\n"
            )
        text.append(
            f"# Parameters for {stack}/SelfAttention:\n"
            f"{stack}/SelfAttention.key_value_size = %d_kv  # per head\n"
            f"{stack}/SelfAttention.num_heads = %num_heads\n"
            f"{stack}/SelfAttention.relative_attention_num_buckets = {BUCKETS}\n"
            f"{stack}/SelfAttention.relative_attention_type = 'bias_shared'\n"
            f"# Parameters for {stack}/Unitransformer:\n"
            f"{stack}/Unitransformer.d_model = %d_model\n"
            f"{stack}/Unitransformer.positional_embedding = False\n"
            f"{stack}/Unitransformer.shared_embedding_and_softmax_weights = {c['tied']}\n"
        )
    text.append("run.sequence_length = {'inputs': 512, 'targets': 114}\nrun.train_steps = 1000\n")
    if variant == "t5.1.1.lm100k":
        text.append(
            "run.init_checkpoint = "
            "'gs://t5-data/pretrained_models/t5.1.1.small/model.ckpt-1000000'\n"
        )
    if variant != "t5":
        text.append("sublayer_rms_norm.epsilon = 1e-06\nsublayer_rms_norm.name = 'rms_norm'\n")
    return "\n".join(text)


def weights(variant: str) -> dict[str, np.ndarray]:
    """Mesh TF's variables (names and layouts) for the variant, random values."""
    c = VARIANTS[variant]
    rng = np.random.default_rng(23)
    d, inner = c["d_model"], c["heads"] * c["d_kv"]

    def w(*shape, scale=0.3):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    out = {"shared/embedding": w(c["vocab"], d, scale=1.0)}
    for stack, n in (("encoder", c["layers"]), ("decoder", c["decoder_layers"])):
        out[f"{stack}/{c['final_norm']}/scale"] = 1 + w(d, scale=0.2)
        kinds = ["SelfAttention"] + (["EncDecAttention"] if stack == "decoder" else [])
        for b in range(n):
            for k, kind in enumerate(kinds + ["DenseReluDense"]):
                p = f"{stack}/block_{b:03d}/layer_{k:03d}/"
                out[p + f"{c['norm']}/scale"] = 1 + w(d, scale=0.2)
                if kind == "DenseReluDense":
                    for wi in ("wi_0", "wi_1") if c["gated"] else ("wi",):
                        out[p + f"DenseReluDense/{wi}/kernel"] = w(d, c["d_ff"])
                    out[p + "DenseReluDense/wo/kernel"] = w(c["d_ff"], d, scale=0.2)
                    continue
                for m in "qkv":
                    out[p + f"{kind}/{m}"] = w(d, inner)
                out[p + f"{kind}/o"] = w(inner, d)
                if b == 0 and kind == "SelfAttention":
                    out[p + f"{kind}/relative_attention_bias"] = w(c["heads"], BUCKETS)
    if not c["tied"]:
        out["decoder/logits/kernel"] = w(d, c["vocab"])
    # Adafactor's slots: factored second moments of matrices, a whole one of vectors.
    for name in list(out):
        value = out[name]
        if value.ndim == 2:
            big = int(np.argmax(value.shape))
            out[name + "_slot_vr"] = np.abs(value).mean(axis=big)
            out[name + "_slot_vc"] = np.abs(value).mean(axis=1 - big)
        else:
            out[name + "_slot_v"] = np.square(value) * 0.01
    out["global_step"] = np.array(1000, np.int64)
    return out


def bucket(tf, relative, bidirectional: bool):
    """mesh_tensorflow.transformer_layers._relative_position_bucket."""
    buckets, n = BUCKETS, -relative
    ret = tf.zeros_like(n)
    if bidirectional:
        buckets //= 2
        ret += tf.cast(n < 0, tf.int32) * buckets
        n = tf.abs(n)
    else:
        n = tf.maximum(n, 0)
    exact = buckets // 2
    log_ratio = tf.math.log(tf.cast(n, tf.float32) / exact) / math.log(MAX_DISTANCE / exact)
    large = exact + tf.cast(log_ratio * (buckets - exact), tf.int32)
    return ret + tf.where(n < exact, n, tf.minimum(large, buckets - 1))


def forward(tf, reader, variant: str) -> dict[str, np.ndarray]:
    """The bitransformer's logits (eval mode), from the checkpoint."""
    c = VARIANTS[variant]

    def v(name):
        return tf.constant(reader.get_tensor(name))

    def norm(x, scope):
        var = tf.reduce_mean(tf.square(x), axis=-1, keepdims=True)
        return x * tf.math.rsqrt(var + EPSILON) * v(scope + "/scale")

    def heads(t):  # [batch, length, heads*d_kv] -> [batch, heads, length, d_kv]
        b, n = t.shape[0], t.shape[1]
        return tf.transpose(tf.reshape(t, [b, n, c["heads"], c["d_kv"]]), [0, 2, 1, 3])

    def attend(x, memory, scope, bias):
        q, k = heads(x @ v(scope + "/q")), heads(memory @ v(scope + "/k"))
        val = heads(memory @ v(scope + "/v"))
        weights = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) + bias)  # no 1/sqrt(d_kv)
        o = tf.transpose(tf.matmul(weights, val), [0, 2, 1, 3])
        return tf.reshape(o, [x.shape[0], x.shape[1], -1]) @ v(scope + "/o")

    def feed_forward(x, scope):
        if c["gated"]:  # dense_product of ["gelu", "linear"]; mtf.gelu: the tanh form
            h = tf.nn.gelu(x @ v(scope + "/wi_0/kernel"), approximate=True)
            h = h * (x @ v(scope + "/wi_1/kernel"))
        else:
            h = tf.nn.relu(x @ v(scope + "/wi/kernel"))
        return h @ v(scope + "/wo/kernel")

    def position_bias(stack, length, bidirectional):
        position = tf.range(length)
        relative = position[None, :] - position[:, None]  # memory - query
        table = v(f"{stack}/block_000/layer_000/SelfAttention/relative_attention_bias")
        return tf.gather(table, bucket(tf, relative, bidirectional), axis=1)[None]

    def visible(ok):  # mtf visibility_mask_to_attention_bias
        return (1.0 - tf.cast(ok, tf.float32)) * -1e9

    def stack_call(stack, x, seq, self_bias, memory=None, cross_bias=None):
        keep = tf.cast(seq != 0, tf.float32)[..., None]  # sublayer_mask_padding
        kinds = ["SelfAttention"] + (["EncDecAttention"] if memory is not None else [])
        for b in range(c["layers" if stack == "encoder" else "decoder_layers"]):
            for k, kind in enumerate(kinds + ["DenseReluDense"]):
                p = f"{stack}/block_{b:03d}/layer_{k:03d}/"
                y = norm(x, p + c["norm"]) * keep
                if kind == "SelfAttention":
                    y = attend(y, y, p + kind, self_bias)
                elif kind == "EncDecAttention":
                    y = attend(y, memory, p + kind, cross_bias)
                else:
                    y = feed_forward(y, p + kind)
                x = x + y
        return norm(x, f"{stack}/{c['final_norm']}") * keep

    embedding = v("shared/embedding")
    enc_seq = tf.constant(np.minimum(INPUT_IDS, 1).astype(np.int32))
    dec_seq = tf.constant(np.minimum(TARGETS, 1).astype(np.int32))
    same = visible(enc_seq[:, :, None] == enc_seq[:, None, :])[:, None]
    encoded = stack_call(
        "encoder",
        tf.gather(embedding, INPUT_IDS),
        enc_seq,
        position_bias("encoder", INPUT_IDS.shape[1], True) + same,
    )
    length = DECODER_INPUT_IDS.shape[1]
    causal = visible(tf.range(length)[None, :] <= tf.range(length)[:, None])[None, None]
    cross = visible(dec_seq[:, :, None] == enc_seq[:, None, :])[:, None]
    decoded = stack_call(
        "decoder",
        tf.gather(embedding, DECODER_INPUT_IDS),
        dec_seq,
        position_bias("decoder", length, False) + causal,
        encoded,
        cross,
    )
    if c["tied"]:  # VocabEmbedding.hidden_to_logits
        logits = tf.matmul(decoded * c["d_model"] ** -0.5, embedding, transpose_b=True)
    else:
        logits = decoded @ v("decoder/logits/kernel")
    return {"logits": logits.numpy(), "encoder_last_hidden_state": encoded.numpy()}


def main(directory: str, variant: str) -> None:
    import tensorflow as tf
    from transform_helpers import save_v2

    os.makedirs(directory, exist_ok=True)
    prefix = os.path.join(directory, "model.ckpt-1000")
    values = weights(variant)
    save_v2(prefix, {n: values[n] for n in sorted(values)})  # TensorFlow's SaveV2 op
    with open(os.path.join(directory, "operative_config.gin"), "w") as f:
        f.write(gin_config(variant))
    outputs = forward(tf, tf.train.load_checkpoint(prefix), variant)
    np.savez(os.path.join(directory, "outputs.npz"), **outputs)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
