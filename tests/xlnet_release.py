"""Small XLNet checkpoints as the release's training writes them (zihangdai/xlnet), and
their outputs.

Run as a script (TensorFlow only, in a process of its own: transformers' PyTorch is
imported elsewhere): ``python xlnet_release.py DIR`` writes, for each model of
``CONFIGS``, ``DIR/MODEL/model.ckpt`` with the release's variable names and layouts
(``model/transformer/...``: the projections q, k, v, r, o ``[d_model, n_head, d_head]``,
dense kernels ``[in, out]``, ``r_w_bias``/``r_r_bias``/``r_s_bias`` ``[n_layer, n_head,
d_head]`` and ``seg_embed`` ``[n_layer, 2, n_head, d_head]`` (``untie_r``); pretraining's
``mask_emb`` and ``model/lm_loss/bias``; run_classifier's ``model/sequnece_summary`` and
``model/classification_<task>/logit``; run_squad's ``start_logits``, ``end_logits`` and
``answer_class``; run_race's ``logits``), with the optimizer's state a training run
leaves (model_utils.get_train_op: ``tf.train.AdamOptimizer``'s ``Adam``/``Adam_1`` slots
and ``beta1_power``/``beta2_power``, or ``AdamWeightDecayOptimizer``'s ``adam_m``/``adam_v``)
and ``global_step``, with ``tf.raw_ops.SaveV2``, and ``DIR/MODEL/xlnet_config.json``;
then computes the outputs for the inputs in TensorFlow from the checkpoint it wrote,
restating modeling.py's ``transformer_xl`` (inference: no ``inp_q``, no memory, the
content stream; ``attn_type`` bi, ``input_mask`` from the padding, ``seg_id`` given),
``lm_loss``'s logits, ``summarize_sequence`` ('last', with the projection) and the heads
of function_builder.py (``get_classification_loss``, ``get_qa_outputs`` at inference,
``get_race_loss``), saved as ``DIR/MODEL/outputs.npz``.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

_BASE = {"n_token": 40, "d_model": 16, "n_head": 2, "d_head": 8, "d_inner": 32, "untie_r": True}
CONFIGS = {
    # Pretraining (train_gpu.py): two-stream graph, so mask_emb; the LM loss's bias.
    "pretrain": {**_BASE, "n_layer": 2, "ff_activation": "gelu"},
    # run_classifier on "sst-2", weight decay on: AdamWeightDecayOptimizer's slots.
    "classifier": {**_BASE, "n_layer": 3, "ff_activation": "relu"},
    # run_squad: start/end logits and the answer class.
    "squad": {**_BASE, "n_layer": 2, "ff_activation": "gelu"},
    # run_race: one score per choice, of 4.
    "race": {**_BASE, "n_layer": 1, "ff_activation": "gelu"},
}
CLASSES = {
    "pretrain": ("XLNetLMHeadModel", ["logits"]),
    "classifier": ("XLNetForSequenceClassification", ["logits"]),
    "squad": (
        "XLNetForQuestionAnswering",
        ["start_top_log_probs", "end_top_log_probs", "cls_logits"],
    ),
    "race": ("XLNetForMultipleChoice", ["logits"]),
}
FILE = "model.ckpt"
TASK = "sst-2"
LABELS = 3
TOP = 5  # run_squad's --start_n_top and --end_n_top, transformers' defaults too
# XLNet pads on the left and ends each sequence with <sep> <cls>: the summary reads the
# last token. Segments as classifier_utils numbers them (A 0, B 1, CLS 2, padding 4).
INPUT_IDS = np.array([[5, 5, 17, 9, 4, 12, 4, 3], [8, 21, 4, 13, 30, 11, 4, 3]], np.int64)
TOKEN_TYPES = np.array([[4, 4, 0, 0, 0, 1, 1, 2], [0, 0, 0, 1, 1, 1, 1, 2]], np.int64)
MASK = np.array([[0, 0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]], np.int64)
P_MASK = np.array([[1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0, 1]], np.float32)
CLS_INDEX = np.array([7, 7], np.int64)
CHOICES = 4


def inputs(model: str) -> dict[str, np.ndarray]:
    """The inputs as transformers' class of ``model`` takes them ([batch, length])."""
    given = {"input_ids": INPUT_IDS, "token_type_ids": TOKEN_TYPES, "attention_mask": MASK}
    if model == "squad":
        given.update(p_mask=P_MASK, cls_index=CLS_INDEX)
    if model == "race":  # [batch, choices, length]: 2 examples of 4 choices
        turned = {
            k: np.stack([np.roll(v, s, axis=1) for s in range(CHOICES)], 1)
            for k, v in given.items()
        }
        turned["input_ids"] = (turned["input_ids"] + np.arange(CHOICES)[None, :, None]) % 40
        given = turned
    return given


def weights(model: str) -> dict[str, np.ndarray]:
    """The release's variables (names and layouts) with the optimizer's, random values."""
    rng = np.random.default_rng(40)
    c = CONFIGS[model]
    d, n, h, i, layers = c["d_model"], c["n_head"], c["d_head"], c["d_inner"], c["n_layer"]

    def w(*shape):
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)

    t = "model/transformer/"
    out = {
        t + "word_embedding/lookup_table": w(c["n_token"], d),
        t + "r_w_bias": w(layers, n, h),
        t + "r_r_bias": w(layers, n, h),
        t + "r_s_bias": w(layers, n, h),
        t + "seg_embed": w(layers, 2, n, h),
    }
    for k in range(layers):
        p = f"{t}layer_{k}/"
        for part in "qkvro":
            out[p + f"rel_attn/{part}/kernel"] = w(d, n, h)
        for norm in ("rel_attn", "ff"):
            out[p + f"{norm}/LayerNorm/gamma"] = 1 + w(d)
            out[p + f"{norm}/LayerNorm/beta"] = w(d)
        out[p + "ff/layer_1/kernel"] = w(d, i)
        out[p + "ff/layer_1/bias"] = w(i)
        out[p + "ff/layer_2/kernel"] = w(i, d)
        out[p + "ff/layer_2/bias"] = w(d)
    if model == "pretrain":
        out[t + "mask_emb/mask_emb"] = w(1, 1, d)
        out["model/lm_loss/bias"] = w(c["n_token"])
    if model in ("classifier", "race"):
        out["model/sequnece_summary/summary/kernel"] = w(d, d)
        out["model/sequnece_summary/summary/bias"] = w(d)
    if model == "classifier":
        out[f"model/classification_{TASK}/logit/kernel"] = w(d, LABELS)
        out[f"model/classification_{TASK}/logit/bias"] = w(LABELS)
    if model == "race":
        out["logits/dense/kernel"] = w(d, 1)
        out["logits/dense/bias"] = w(1)
    if model == "squad":
        out["start_logits/dense/kernel"] = w(d, 1)
        out["start_logits/dense/bias"] = w(1)
        out["end_logits/dense_0/kernel"] = w(2 * d, d)
        out["end_logits/dense_0/bias"] = w(d)
        out["end_logits/LayerNorm/gamma"] = 1 + w(d)
        out["end_logits/LayerNorm/beta"] = w(d)
        out["end_logits/dense_1/kernel"] = w(d, 1)
        out["end_logits/dense_1/bias"] = w(1)
        out["answer_class/dense_0/kernel"] = w(2 * d, d)
        out["answer_class/dense_0/bias"] = w(d)
        out["answer_class/dense_1/kernel"] = w(d, 1)
    slots = ("/adam_m", "/adam_v") if model == "classifier" else ("/Adam", "/Adam_1")
    for name in list(out):
        out[name + slots[0]] = np.zeros_like(out[name])
        out[name + slots[1]] = np.abs(out[name]) * 0.01
    if slots[0] == "/Adam":
        out["beta1_power"] = np.array(0.9**1000, np.float32)
        out["beta2_power"] = np.array(0.999**1000, np.float32)
    out["global_step"] = np.array(1000, np.int64)
    return out


def forward(tf, reader, model: str) -> dict[str, np.ndarray]:
    """The release's model (inference) on ``inputs(model)``, from the checkpoint."""
    c = CONFIGS[model]
    d, h = c["d_model"], c["d_head"]
    given = inputs(model)
    ids, segs, mask = (given[k] for k in ("input_ids", "token_type_ids", "attention_mask"))
    if model == "race":  # _transform_features: [batch, 4, len] -> [len, batch * 4]
        ids, segs, mask = (x.reshape(-1, x.shape[-1]) for x in (ids, segs, mask))

    def v(name):
        return tf.constant(reader.get_tensor(name))

    def layer_norm(x, scope):  # tf.contrib.layers.layer_norm: epsilon 1e-12
        mean, var = tf.nn.moments(x, [-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + 1e-12) * v(scope + "/gamma") + v(scope + "/beta")

    def dense(x, scope, bias=True):
        y = tf.einsum("...i,io->...o", x, v(scope + "/kernel"))
        return y + v(scope + "/bias") if bias else y

    def gelu(x):  # modeling.gelu: the tanh approximation
        return x * 0.5 * (1.0 + tf.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * tf.pow(x, 3))))

    act = gelu if c["ff_activation"] == "gelu" else tf.nn.relu
    # Time-major, as XLNetModel takes them: [len, bsz].
    inp = tf.constant(ids.T)
    seg = tf.constant(segs.T)
    input_mask = tf.constant((1 - mask).T.astype(np.float32))  # 1 for padding
    qlen, bsz = ids.shape[1], ids.shape[0]
    klen = qlen  # no memory
    attn_mask = tf.cast(input_mask[None][:, :, :, None] > 0, tf.float32)  # data mask
    non_tgt = -tf.eye(qlen, dtype=tf.float32)
    non_tgt_mask = tf.cast((attn_mask + non_tgt[:, :, None, None]) > 0, tf.float32)
    out_h = tf.gather(v("model/transformer/word_embedding/lookup_table"), inp)
    seg_mat = tf.cast(tf.logical_not(tf.equal(seg[:, None], seg[None, :])), tf.int32)
    seg_mat = tf.one_hot(seg_mat, 2, dtype=tf.float32)
    # relative_positional_encoding, attn_type 'bi', bi_data off, no clamping
    inv_freq = 1 / (10000 ** (tf.range(0, d, 2.0) / d))
    pos_seq = tf.range(klen, -qlen, -1.0)
    sinusoid = tf.einsum("i,d->id", pos_seq, inv_freq)
    pos_emb = tf.concat([tf.sin(sinusoid), tf.cos(sinusoid)], -1)[:, None, :]
    pos_emb = tf.tile(pos_emb, [1, bsz, 1])

    def rel_shift(x):
        s = tf.shape(x)
        x = tf.reshape(x, [s[1], s[0], s[2], s[3]])[1:]
        return tf.reshape(x, [s[0], s[1] - 1, s[2], s[3]])[:, :klen]

    t = "model/transformer/"
    for k in range(c["n_layer"]):
        p = f"{t}layer_{k}/rel_attn/"
        r_w, r_r, r_s = (v(t + b)[k] for b in ("r_w_bias", "r_r_bias", "r_s_bias"))
        seg_embed = v(t + "seg_embed")[k]
        q, key, val = (tf.einsum("ibh,hnd->ibnd", out_h, v(p + f"{s}/kernel")) for s in "qkv")
        k_r = tf.einsum("ibh,hnd->ibnd", pos_emb, v(p + "r/kernel"))
        ac = tf.einsum("ibnd,jbnd->ijbn", q + r_w, key)
        bd = rel_shift(tf.einsum("ibnd,jbnd->ijbn", q + r_r, k_r))
        ef = tf.einsum("ibnd,snd->ibns", q + r_s, seg_embed)
        ef = tf.einsum("ijbs,ibns->ijbn", seg_mat, ef)
        score = (ac + bd + ef) * (1 / h**0.5) - 1e30 * non_tgt_mask
        prob = tf.nn.softmax(score, 1)
        vec = tf.einsum("ijbn,jbnd->ibnd", prob, val)
        attn_out = tf.einsum("ibnd,hnd->ibh", vec, v(p + "o/kernel"))
        out_h = layer_norm(attn_out + out_h, p + "LayerNorm")
        f = f"{t}layer_{k}/ff/"
        y = dense(act(dense(out_h, f + "layer_1")), f + "layer_2")
        out_h = layer_norm(y + out_h, f + "LayerNorm")
    out = {"last_hidden_state": tf.transpose(out_h, [1, 0, 2]).numpy()}
    if model == "pretrain":  # lm_loss with tie_weight: the lookup table
        logits = tf.einsum("ibd,nd->ibn", out_h, v(t + "word_embedding/lookup_table"))
        out["logits"] = tf.transpose(logits + v("model/lm_loss/bias"), [1, 0, 2]).numpy()
    if model in ("classifier", "race"):  # summarize_sequence('last', use_proj)
        summary = tf.tanh(dense(out_h[-1], "model/sequnece_summary/summary"))
        if model == "classifier":
            out["logits"] = dense(summary, f"model/classification_{TASK}/logit").numpy()
        else:
            out["logits"] = tf.reshape(dense(summary, "logits/dense"), [-1, CHOICES]).numpy()
    if model == "squad":
        out.update(_qa_outputs(tf, out_h, dense, layer_norm, qlen))
    return out


def _qa_outputs(tf, output, dense, layer_norm, seq_len) -> dict[str, np.ndarray]:
    """function_builder.get_qa_outputs at inference (beam of TOP starts, TOP ends)."""
    p_mask = tf.constant(P_MASK)
    start_logits = tf.transpose(tf.squeeze(dense(output, "start_logits/dense"), -1), [1, 0])
    start_masked = start_logits * (1 - p_mask) - 1e30 * p_mask
    start_log_probs = tf.nn.log_softmax(start_masked, -1)
    start_top_log_probs, start_top_index = tf.nn.top_k(start_log_probs, k=TOP)
    start_index = tf.one_hot(start_top_index, depth=seq_len, axis=-1, dtype=tf.float32)
    start_features = tf.einsum("lbh,bkl->bkh", output, start_index)
    end_input = tf.tile(output[:, :, None], [1, 1, TOP, 1])
    start_features = tf.tile(start_features[None], [seq_len, 1, 1, 1])
    end_input = tf.concat([end_input, start_features], axis=-1)
    end_logits = tf.tanh(dense(end_input, "end_logits/dense_0"))
    end_logits = layer_norm(end_logits, "end_logits/LayerNorm")
    end_logits = dense(end_logits, "end_logits/dense_1")
    end_logits = tf.transpose(tf.reshape(end_logits, [seq_len, -1, TOP]), [1, 2, 0])
    end_masked = end_logits * (1 - p_mask[:, None]) - 1e30 * p_mask[:, None]
    end_log_probs = tf.nn.log_softmax(end_masked, -1)
    end_top_log_probs, _ = tf.nn.top_k(end_log_probs, k=TOP)
    end_top_log_probs = tf.reshape(end_top_log_probs, [-1, TOP * TOP])
    cls_index = tf.one_hot(tf.constant(CLS_INDEX), seq_len, axis=-1, dtype=tf.float32)
    cls_feature = tf.einsum("lbh,bl->bh", output, cls_index)
    start_p = tf.nn.softmax(start_masked, axis=-1)
    start_feature = tf.einsum("lbh,bl->bh", output, start_p)
    ans = tf.tanh(dense(tf.concat([start_feature, cls_feature], -1), "answer_class/dense_0"))
    cls_logits = tf.squeeze(dense(ans, "answer_class/dense_1", bias=False), -1)
    return {
        "start_top_log_probs": start_top_log_probs.numpy(),
        "end_top_log_probs": end_top_log_probs.numpy(),
        "cls_logits": cls_logits.numpy(),
    }


def main(directory: str) -> None:
    import tensorflow as tf
    from transform_helpers import save_v2

    for model in CONFIGS:
        where = os.path.join(directory, model)
        os.makedirs(where, exist_ok=True)
        prefix = os.path.join(where, FILE)
        values = weights(model)
        save_v2(prefix, {n: values[n] for n in sorted(values)})  # TensorFlow's SaveV2 op
        with open(os.path.join(where, "xlnet_config.json"), "w") as f:
            json.dump(CONFIGS[model], f, indent=2)
        outputs = forward(tf, tf.train.load_checkpoint(prefix), model)
        np.savez(os.path.join(where, "outputs.npz"), **outputs)
        np.savez(os.path.join(where, "inputs.npz"), **inputs(model))


if __name__ == "__main__":
    main(sys.argv[1])
