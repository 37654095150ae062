"""Small BERT, GPT-2 and T5 models as Hugging Face's TensorFlow classes build them, saved as
their ``tf_model.h5``.

Run as a script (TensorFlow and tf.keras only, in a process of its own: PyTorch is
imported elsewhere): ``python hf_tf2_models.py DIR`` reads ``DIR/<case>/config.json``
(what transformers' PyTorch config writes) for each case, builds the model with
tf.keras layers nested and named as transformers' TF classes name them (up to release
4.57: ``tf_bert_for_masked_lm/bert/encoder/layer_._0/attention/self/query/kernel:0``,
``mlm___cls``, GPT-2's ``Conv1D`` with its ``[1, n]`` bias, T5's ``shared/shared``
embedding that the encoder and decoder list again), gives every weight random values,
saves ``DIR/<case>/tf_model.h5`` with ``model.save_weights`` (a Keras 2 HDF5 file, as
``save_pretrained`` wrote it) and the same weights sharded in ``DIR/<case>/sharded/``
as ``save_pretrained(..., max_shard_size=...)`` wrote them (:func:`save_sharded`), and computes the outputs for ``DIR/<case>/inputs.npz``
into ``DIR/<case>/outputs.npz``, following the published architectures in TensorFlow.
"""

from __future__ import annotations

import json
import math
import os
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

Layer = keras.layers.Layer
Dense = keras.layers.Dense


def heads(x, n):
    """[B, T, n * d] -> [B, n, T, d]."""
    b, t = tf.shape(x)[0], tf.shape(x)[1]
    return tf.transpose(tf.reshape(x, [b, t, n, -1]), [0, 2, 1, 3])


def merge(x):
    """[B, n, T, d] -> [B, T, n * d]."""
    b, t = tf.shape(x)[0], tf.shape(x)[2]
    return tf.reshape(tf.transpose(x, [0, 2, 1, 3]), [b, t, -1])


# -- BERT (TFBertModel, TFBertForMaskedLM)


class TFBertEmbeddings(Layer):
    def __init__(self, c, **kw):
        super().__init__(**kw)
        self.c = c
        self.LayerNorm = keras.layers.LayerNormalization(
            epsilon=c["layer_norm_eps"], name="LayerNorm"
        )

    def build(self, input_shape):
        c, h = self.c, self.c["hidden_size"]
        with tf.name_scope("word_embeddings"):
            self.weight = self.add_weight(name="weight", shape=[c["vocab_size"], h])
        with tf.name_scope("token_type_embeddings"):
            self.token_type_embeddings = self.add_weight(
                name="embeddings", shape=[c["type_vocab_size"], h]
            )
        with tf.name_scope("position_embeddings"):
            self.position_embeddings = self.add_weight(
                name="embeddings", shape=[c["max_position_embeddings"], h]
            )
        super().build(input_shape)

    def call(self, ids, types):
        positions = tf.gather(self.position_embeddings, tf.range(tf.shape(ids)[1]))[None]
        x = tf.gather(self.weight, ids) + positions + tf.gather(self.token_type_embeddings, types)
        return self.LayerNorm(x)


class TFBertSelfAttention(Layer):
    def __init__(self, c, **kw):
        super().__init__(**kw)
        self.n = c["num_attention_heads"]
        self.query = Dense(c["hidden_size"], name="query")
        self.key = Dense(c["hidden_size"], name="key")
        self.value = Dense(c["hidden_size"], name="value")

    def call(self, x, bias):
        q, k, v = (heads(f(x), self.n) for f in (self.query, self.key, self.value))
        scores = tf.matmul(q, k, transpose_b=True) / math.sqrt(q.shape[-1]) + bias
        return merge(tf.matmul(tf.nn.softmax(scores, -1), v))


class TFBertSelfOutput(Layer):
    def __init__(self, c, **kw):
        super().__init__(**kw)
        self.dense = Dense(c["hidden_size"], name="dense")
        self.LayerNorm = keras.layers.LayerNormalization(
            epsilon=c["layer_norm_eps"], name="LayerNorm"
        )

    def call(self, x, residual):
        return self.LayerNorm(self.dense(x) + residual)


class TFBertAttention(Layer):
    def __init__(self, c, **kw):
        super().__init__(**kw)
        self.self_attention = TFBertSelfAttention(c, name="self")
        self.dense_output = TFBertSelfOutput(c, name="output")

    def call(self, x, bias):
        return self.dense_output(self.self_attention(x, bias), x)


class TFBertIntermediate(Layer):
    def __init__(self, c, **kw):
        super().__init__(**kw)
        self.dense = Dense(c["intermediate_size"], name="dense")

    def call(self, x):
        return tf.nn.gelu(self.dense(x), approximate=False)  # hidden_act "gelu": erf's


class TFBertLayer(Layer):
    def __init__(self, c, **kw):
        super().__init__(**kw)
        self.attention = TFBertAttention(c, name="attention")
        self.intermediate = TFBertIntermediate(c, name="intermediate")
        self.bert_output = TFBertSelfOutput(c, name="output")

    def call(self, x, bias):
        a = self.attention(x, bias)
        return self.bert_output(self.intermediate(a), a)


class TFBertEncoder(Layer):
    def __init__(self, c, **kw):
        super().__init__(**kw)
        self.layer = [TFBertLayer(c, name=f"layer_._{i}") for i in range(c["num_hidden_layers"])]

    def call(self, x, bias):
        for layer in self.layer:
            x = layer(x, bias)
        return x


class TFBertPooler(Layer):
    def __init__(self, c, **kw):
        super().__init__(**kw)
        self.dense = Dense(c["hidden_size"], activation="tanh", name="dense")

    def call(self, x):
        return self.dense(x[:, 0])


class TFBertMainLayer(Layer):
    def __init__(self, c, pooler=True, **kw):
        super().__init__(**kw)
        self.embeddings = TFBertEmbeddings(c, name="embeddings")
        self.encoder = TFBertEncoder(c, name="encoder")
        self.pooler = TFBertPooler(c, name="pooler") if pooler else None

    def call(self, ids, types, mask):
        bias = (1.0 - tf.cast(mask, tf.float32))[:, None, None, :] * -10000.0
        x = self.encoder(self.embeddings(ids, types), bias)
        return x, (self.pooler(x) if self.pooler is not None else None)


class TFBertPredictionHeadTransform(Layer):
    def __init__(self, c, **kw):
        super().__init__(**kw)
        self.dense = Dense(c["hidden_size"], name="dense")
        self.LayerNorm = keras.layers.LayerNormalization(
            epsilon=c["layer_norm_eps"], name="LayerNorm"
        )

    def call(self, x):
        return self.LayerNorm(tf.nn.gelu(self.dense(x), approximate=False))


class TFBertLMPredictionHead(Layer):
    def __init__(self, c, embeddings, **kw):
        super().__init__(**kw)
        self.c = c
        self.transform = TFBertPredictionHeadTransform(c, name="transform")
        self.input_embeddings = embeddings  # the decoder is the word embeddings

    def build(self, input_shape):
        self.bias = self.add_weight(shape=(self.c["vocab_size"],), initializer="zeros", name="bias")
        super().build(input_shape)

    def call(self, x):
        x = self.transform(x)
        return tf.matmul(x, self.input_embeddings.weight, transpose_b=True) + self.bias


class TFBertMLMHead(Layer):
    def __init__(self, c, embeddings, **kw):
        super().__init__(**kw)
        self.predictions = TFBertLMPredictionHead(c, embeddings, name="predictions")

    def call(self, x):
        return self.predictions(x)


class TFBertForMaskedLM(keras.Model):
    def __init__(self, c):
        # Unnamed, as transformers left them: Keras names a model after its class,
        # snake-cased (tf_bert_for_masked_lm, tfgpt2lm_head_model).
        super().__init__()
        self.bert = TFBertMainLayer(c, pooler=False, name="bert")
        self.mlm = TFBertMLMHead(c, self.bert.embeddings, name="mlm___cls")

    def call(self, inputs):
        x, _ = self.bert(inputs["input_ids"], inputs["token_type_ids"], inputs["attention_mask"])
        return {"logits": self.mlm(x)}


class TFBertModel(keras.Model):
    def __init__(self, c):
        super().__init__()
        self.bert = TFBertMainLayer(c, name="bert")

    def call(self, inputs):
        x, pooled = self.bert(
            inputs["input_ids"], inputs["token_type_ids"], inputs["attention_mask"]
        )
        return {"last_hidden_state": x, "pooler_output": pooled}


# -- GPT-2 (TFGPT2LMHeadModel)


class TFConv1D(Layer):
    """transformers' TF Conv1D: a weight [nx, nf] and a bias [1, nf]."""

    def __init__(self, nf, nx, **kw):
        super().__init__(**kw)
        self.nf, self.nx = nf, nx

    def build(self, input_shape):
        self.weight = self.add_weight("weight", shape=[self.nx, self.nf])
        self.bias = self.add_weight("bias", shape=[1, self.nf], initializer="zeros")
        super().build(input_shape)

    def call(self, x):
        return tf.matmul(x, self.weight) + self.bias


class TFAttention(Layer):
    def __init__(self, c, **kw):
        super().__init__(**kw)
        n = c["n_embd"]
        self.n = c["n_head"]
        self.c_attn = TFConv1D(3 * n, n, name="c_attn")
        self.c_proj = TFConv1D(n, n, name="c_proj")

    def call(self, x):
        q, k, v = (heads(p, self.n) for p in tf.split(self.c_attn(x), 3, axis=-1))
        t = tf.shape(x)[1]
        causal = tf.linalg.band_part(tf.ones([t, t]), -1, 0)
        w = tf.matmul(q, k, transpose_b=True) / math.sqrt(q.shape[-1])
        w = w * causal - 1e4 * (1 - causal)
        return self.c_proj(merge(tf.matmul(tf.nn.softmax(w, -1), v)))


class TFMLP(Layer):
    def __init__(self, c, **kw):
        super().__init__(**kw)
        n = c["n_embd"]
        self.c_fc = TFConv1D(4 * n, n, name="c_fc")
        self.c_proj = TFConv1D(n, 4 * n, name="c_proj")

    def call(self, x):
        return self.c_proj(tf.nn.gelu(self.c_fc(x), approximate=True))  # gelu_new


class TFBlock(Layer):
    def __init__(self, c, **kw):
        super().__init__(**kw)
        eps = c["layer_norm_epsilon"]
        self.ln_1 = keras.layers.LayerNormalization(epsilon=eps, name="ln_1")
        self.attn = TFAttention(c, name="attn")
        self.ln_2 = keras.layers.LayerNormalization(epsilon=eps, name="ln_2")
        self.mlp = TFMLP(c, name="mlp")

    def call(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TFGPT2MainLayer(Layer):
    def __init__(self, c, **kw):
        super().__init__(**kw)
        self.wte = keras.layers.Embedding(c["vocab_size"], c["n_embd"], name="wte")
        self.wpe = keras.layers.Embedding(c["n_positions"], c["n_embd"], name="wpe")
        self.h = [TFBlock(c, name=f"h_._{i}") for i in range(c["n_layer"])]
        self.ln_f = keras.layers.LayerNormalization(epsilon=c["layer_norm_epsilon"], name="ln_f")

    def call(self, ids):
        x = self.wte(ids) + self.wpe(tf.range(tf.shape(ids)[1]))[None]
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


class TFGPT2LMHeadModel(keras.Model):
    def __init__(self, c):
        super().__init__()
        self.transformer = TFGPT2MainLayer(c, name="transformer")

    def call(self, inputs):
        x = self.transformer(inputs["input_ids"])
        return {"logits": tf.matmul(x, self.transformer.wte.embeddings, transpose_b=True)}


# -- T5 (TFT5ForConditionalGeneration)


def relative_buckets(relative, bidirectional, num_buckets, max_distance):
    """T5's bucket of each relative position (memory position - query position)."""
    buckets = tf.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets += tf.cast(relative > 0, relative.dtype) * num_buckets
        relative = tf.abs(relative)
    else:
        relative = -tf.minimum(relative, 0)
    exact = num_buckets // 2
    far = tf.cast(tf.maximum(relative, 1), tf.float32)
    large = exact + tf.cast(
        tf.math.log(far / exact) / math.log(max_distance / exact) * (num_buckets - exact),
        relative.dtype,
    )
    large = tf.minimum(large, num_buckets - 1)
    return buckets + tf.where(relative < exact, relative, large)


class TFT5LayerNorm(Layer):
    def __init__(self, eps, **kw):
        super().__init__(**kw)
        self.eps = eps

    def build(self, input_shape):
        self.weight = self.add_weight("weight", shape=(input_shape[-1],), initializer="ones")
        super().build(input_shape)

    def call(self, x):
        variance = tf.reduce_mean(tf.square(x), axis=-1, keepdims=True)
        return self.weight * x * tf.math.rsqrt(variance + self.eps)


class TFT5Attention(Layer):
    def __init__(self, c, bias, decoder, **kw):
        super().__init__(**kw)
        self.c, self.has_bias, self.decoder = c, bias, decoder
        inner = c["num_heads"] * c["d_kv"]
        self.q = Dense(inner, use_bias=False, name="q")
        self.k = Dense(inner, use_bias=False, name="k")
        self.v = Dense(inner, use_bias=False, name="v")
        self.o = Dense(c["d_model"], use_bias=False, name="o")

    def build(self, input_shape):
        if self.has_bias:
            with tf.name_scope("relative_attention_bias"):
                self.relative_attention_bias = self.add_weight(
                    name="embeddings",
                    shape=[self.c["relative_attention_num_buckets"], self.c["num_heads"]],
                )
        super().build(input_shape)

    def position_bias(self, q_len, k_len):
        relative = tf.range(k_len)[None, :] - tf.range(q_len)[:, None]
        b = relative_buckets(
            relative,
            not self.decoder,
            self.c["relative_attention_num_buckets"],
            self.c["relative_attention_max_distance"],
        )
        return tf.transpose(tf.gather(self.relative_attention_bias, b), [2, 0, 1])[None]

    def call(self, x, memory, mask_bias, bias=None):
        """The attention's output, and the bias it added (computed by the first layer:
        its relative position bias, or none, plus the mask; the next layers reuse it)."""
        n = self.c["num_heads"]
        q, k, v = heads(self.q(x), n), heads(self.k(memory), n), heads(self.v(memory), n)
        if bias is None:
            t, m = tf.shape(x)[1], tf.shape(memory)[1]
            bias = (self.position_bias(t, m) if self.has_bias else 0.0) + mask_bias
        scores = tf.matmul(q, k, transpose_b=True) + bias  # T5 does not scale
        return self.o(merge(tf.matmul(tf.nn.softmax(scores, -1), v))), bias


class TFT5LayerSelfAttention(Layer):
    def __init__(self, c, bias, decoder, **kw):
        super().__init__(**kw)
        self.SelfAttention = TFT5Attention(c, bias, decoder, name="SelfAttention")
        self.layer_norm = TFT5LayerNorm(c["layer_norm_epsilon"], name="layer_norm")

    def call(self, x, mask_bias, bias):
        normed = self.layer_norm(x)
        out, bias = self.SelfAttention(normed, normed, mask_bias, bias)
        return x + out, bias


class TFT5LayerCrossAttention(Layer):
    def __init__(self, c, **kw):
        super().__init__(**kw)
        self.EncDecAttention = TFT5Attention(c, False, True, name="EncDecAttention")
        self.layer_norm = TFT5LayerNorm(c["layer_norm_epsilon"], name="layer_norm")

    def call(self, x, memory, mask_bias, bias):
        out, bias = self.EncDecAttention(self.layer_norm(x), memory, mask_bias, bias)
        return x + out, bias


class TFT5LayerFF(Layer):
    def __init__(self, c, **kw):
        super().__init__(**kw)
        self.DenseReluDense = TFT5DenseActDense(c, name="DenseReluDense")
        self.layer_norm = TFT5LayerNorm(c["layer_norm_epsilon"], name="layer_norm")

    def call(self, x):
        return x + self.DenseReluDense(self.layer_norm(x))


class TFT5DenseActDense(Layer):
    def __init__(self, c, **kw):
        super().__init__(**kw)
        self.wi = Dense(c["d_ff"], use_bias=False, name="wi")
        self.wo = Dense(c["d_model"], use_bias=False, name="wo")

    def call(self, x):
        return self.wo(tf.nn.relu(self.wi(x)))


class TFT5Block(Layer):
    def __init__(self, c, bias, decoder, **kw):
        super().__init__(**kw)
        self.layer = [TFT5LayerSelfAttention(c, bias, decoder, name="layer_._0")]
        if decoder:
            self.layer.append(TFT5LayerCrossAttention(c, name="layer_._1"))
        self.layer.append(TFT5LayerFF(c, name=f"layer_._{len(self.layer)}"))

    def call(self, x, masks, biases):
        x, self_bias = self.layer[0](x, masks[0], biases[0])
        cross_bias = None
        if len(self.layer) == 3:
            x, cross_bias = self.layer[1](x, masks[2], masks[1], biases[1])
        return self.layer[-1](x), (self_bias, cross_bias)


class TFT5MainLayer(Layer):
    def __init__(self, c, shared, decoder, **kw):
        super().__init__(**kw)
        self.decoder = decoder
        self.embed_tokens = shared  # tracked: save_weights lists the shared embedding again
        n = c["num_decoder_layers"] if decoder else c["num_layers"]
        self.block = [TFT5Block(c, i == 0, decoder, name=f"block_._{i}") for i in range(n)]
        self.final_layer_norm = TFT5LayerNorm(c["layer_norm_epsilon"], name="final_layer_norm")

    def call(self, ids, mask, memory=None, memory_mask=None):
        x = tf.gather(self.embed_tokens.embeddings, ids)
        t = tf.shape(ids)[1]
        keep = tf.cast(mask, tf.float32)[:, None, None, :]
        if self.decoder:
            keep = keep * tf.linalg.band_part(tf.ones([t, t]), -1, 0)[None, None]
        masks = [(1.0 - keep) * -1e9, None, memory]
        if memory is not None:
            masks[1] = (1.0 - tf.cast(memory_mask, tf.float32))[:, None, None, :] * -1e9
        biases = (None, None)
        for block in self.block:
            x, biases = block(x, masks, biases)
        return self.final_layer_norm(x)


class TFT5ForConditionalGeneration(keras.Model):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.shared = keras.layers.Embedding(c["vocab_size"], c["d_model"], name="shared")
        self.encoder = TFT5MainLayer(c, self.shared, False, name="encoder")
        self.decoder = TFT5MainLayer(c, self.shared, True, name="decoder")

    def call(self, inputs):
        if not self.shared.built:
            with tf.name_scope("shared/shared/"):  # the root scope, as transformers builds it
                self.shared.build(None)
            self.shared.built = True
        mask = inputs["attention_mask"]
        memory = self.encoder(inputs["input_ids"], mask)
        ids = inputs["decoder_input_ids"]
        x = self.decoder(ids, tf.ones_like(ids), memory, mask)
        x = x * self.c["d_model"] ** -0.5  # tied embeddings: scaled before the logits
        logits = tf.matmul(x, self.shared.embeddings, transpose_b=True)
        return {"logits": logits, "encoder_last_hidden_state": memory}


MODELS = {
    "bert-mlm": TFBertForMaskedLM,
    "bert-base": TFBertModel,
    "gpt2": TFGPT2LMHeadModel,
    "t5": TFT5ForConditionalGeneration,
}


def save_sharded(model, directory: str, max_shard_bytes: int) -> dict:
    """``model``'s weights as transformers' TF ``save_pretrained(directory,
    max_shard_size=...)`` wrote them when they exceed one shard: ``model.weights`` in
    order, cut before a weight that would take a shard past ``max_shard_bytes``; each
    shard ``tf_model-0000K-of-0000N.h5`` an HDF5 file holding its weights (sorted by
    name) as datasets named as the weight less its model scope (unless the name holds
    ``model.`` or has one component), listed in the root attribute ``layer_names``; the
    index ``tf_model.h5.index.json`` maps each weight's name to its shard."""
    import h5py
    from tf_keras.src.saving.legacy.hdf5_format import save_attributes_to_hdf5_group

    blocks, block, size, total = [], [], 0, 0
    for w in model.weights:
        n = int(np.prod(w.shape)) * w.dtype.size
        if size + n > max_shard_bytes:
            blocks.append(block)
            block, size = [], 0
        block.append(w)
        size += n
        total += n
    blocks.append(block)
    weight_map = {}
    for k, block in enumerate(blocks):
        file = f"tf_model-{k + 1:05d}-of-{len(blocks):05d}.h5"
        with h5py.File(os.path.join(directory, file), "w") as f:
            listed = []
            for w in sorted(block, key=lambda w: w.name):
                scoped = "model." in w.name or len(w.name.split("/")) == 1
                name = w.name if scoped else "/".join(w.name.split("/")[1:])
                value = w.numpy()
                f.create_dataset(name, value.shape, dtype=value.dtype)[:] = value
                listed.append(name.encode("utf8"))
            save_attributes_to_hdf5_group(f, "layer_names", listed)
        for w in block:
            weight_map[w.name] = file
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(directory, "tf_model.h5.index.json"), "w") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return index


def main(root: str) -> None:
    rng = np.random.default_rng(4)
    for case, cls in MODELS.items():
        d = os.path.join(root, case)
        with open(os.path.join(d, "config.json")) as f:
            config = json.load(f)
        inputs = {k: tf.constant(v) for k, v in np.load(os.path.join(d, "inputs.npz")).items()}
        model = cls(config)
        model(inputs)
        for w in model.weights:
            value = rng.standard_normal(w.shape) * 0.3
            if w.name.endswith(("gamma:0", "layer_norm/weight:0")):
                value += 1.0
            w.assign(value.astype(np.float32))
        model.save_weights(os.path.join(d, "tf_model.h5"))
        sharded = os.path.join(d, "sharded")
        os.mkdir(sharded)
        # About a third of the weights' bytes a shard: three shards or more.
        weights_bytes = sum(int(np.prod(w.shape)) * w.dtype.size for w in model.weights)
        save_sharded(model, sharded, weights_bytes // 3)
        with open(os.path.join(sharded, "config.json"), "w") as f:
            json.dump(config, f)
        outputs = {k: v.numpy() for k, v in model(inputs).items()}
        np.savez(os.path.join(d, "outputs.npz"), **outputs)
        names = sorted({w.name for w in model.weights})
        with open(os.path.join(d, "tf_names.json"), "w") as f:
            json.dump(names, f)


if __name__ == "__main__":
    main(sys.argv[1])
