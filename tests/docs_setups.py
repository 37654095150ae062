"""The files the documentation's examples run on (tests/docs/test_examples.py).

A page names its setup in a comment, ``<!-- examples: setup=NAME -->``; its examples then
run in a fresh copy of that setup's directory. The setups:

- ``none``: an empty directory (the page makes what it uses, as the Getting started page
  does with TensorFlow);
- ``demo``: what ``make demo`` writes, made by the command its recipe runs (``python -m
  tfckpt.demo demo-out``, read from the Makefile): ``demo-out/model.ckpt-7``, a float32
  TF1-style training checkpoint (two conv layers with batch norm, a dense head, Adam
  slots, ``global_step``; byte for byte what SaveV2 writes), and ``demo-out/fp16/``, its
  float16 copy without the Adam slots;
- ``tf``: the demo's files plus checkpoints TensorFlow writes in one process of its own
  (``python tests/docs_setups.py tf DIR``), listed in :func:`write_tf`;
- ``releases``: tiny research releases under the released files' names, written by
  TensorFlow in a process of its own (``python tests/docs_setups.py releases DIR``),
  listed in :func:`write_releases`, for the presets' pages.

Run as a script it writes the ``tf`` or ``releases`` setup into DIR; only that process
imports TensorFlow.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

SETUPS = ("none", "demo", "tf", "releases")

ROOT = Path(__file__).resolve().parents[1]


def demo_command() -> list[str]:
    """The command ``make demo`` runs, read from the Makefile's ``demo`` recipe, with this
    interpreter for ``$(PY)`` (the virtual environment's Python there)."""
    lines = (ROOT / "Makefile").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("demo:"))
    recipe = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    if len(recipe) != 1 or not recipe[0].startswith("$(PY) "):
        raise ValueError(f"the Makefile's demo recipe is not one `$(PY) ...` line: {recipe}")
    return [sys.executable, *shlex.split(recipe[0].removeprefix("$(PY) "))]


def write_demo(root: Path) -> None:
    """What ``make demo`` writes, written by the command it runs, in ``root``."""
    done = subprocess.run(
        demo_command(),
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if done.returncode:
        raise RuntimeError(f"{demo_command()} exited {done.returncode}:\n{done.stderr[-4000:]}")


def start(name: str, root: Path) -> subprocess.Popen | None:
    """Write setup ``name``'s files into ``root`` (an empty directory): the demo's here; a
    TensorFlow-written setup's (``tf``, ``releases``) by a process of its own, which is
    started and returned, its stderr a pipe (wait for it with ``communicate``)."""
    if name not in SETUPS:
        raise ValueError(f"no setup {name!r}")
    if name in ("demo", "tf"):
        write_demo(root)
    if name not in ("tf", "releases"):
        return None
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), name, str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def write_tf(root: Path) -> None:
    """Checkpoints written by TensorFlow (and Keras 3 on TensorFlow):

    - ``A/model.ckpt``, ``B/model.ckpt``: TF1 ``Saver`` saves of scopes ``a1``, ``a2`` and
      ``b1``, ``b2`` (each ``w`` [4, 3] and ``b`` [3], float32);
    - ``run/model.ckpt-100``, ``-200``, ``-300``: a TF1 ``Saver(max_to_keep=5)`` run of
      ``dense/kernel`` [8, 4], ``dense/bias`` [4] and ``global_step``, its state file;
    - ``tf1/model.ckpt``: the same variables once more, for graft, with its graph file
      ``tf1/model.ckpt.meta``;
    - ``tf2/template-1``: ``tf.train.Checkpoint(model=Dense)`` of a ``tf.Module`` with a
      ``kernel`` [8, 4] and a ``bias`` [4], freshly initialised (the graft template);
    - ``v1/model.ckpt``: a ``Saver(write_version=V1)`` save of ``conv/weights`` and ``step``;
    - ``keras/ckpt-1``: a Keras 3 model (``Input(8)``, ``Dense(4, name="hidden")``,
      ``Dense(2, name="out")``) trained one step with Adam and saved with
      ``tf.train.Checkpoint(model=model).save``; its predictions on ``ones((1, 8))`` in
      ``keras/expected.npy``; the same model as Keras HDF5 in ``keras/model.h5``.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import numpy as np
    import tensorflow as tf

    v1 = tf.compat.v1
    rng = np.random.default_rng(7)

    def tf1_save(prefix: Path, values: dict, *, steps=(None,), version=None, meta=False) -> None:
        prefix.parent.mkdir(parents=True, exist_ok=True)
        with tf.Graph().as_default():
            variables = {
                name: v1.get_variable(name, initializer=value) for name, value in values.items()
            }
            step = variables.get("global_step")
            saver_kw = {"max_to_keep": 5}
            if version is not None:
                saver_kw["write_version"] = version
            saver = v1.train.Saver(**saver_kw)
            with v1.Session() as sess:
                sess.run(v1.global_variables_initializer())
                for n in steps:
                    if n is not None and step is not None:
                        sess.run(step.assign(n))
                        for var in variables.values():
                            if var.dtype.base_dtype == tf.float32:
                                sess.run(var.assign(var * 0.5 + 0.1))
                    saver.save(sess, str(prefix), global_step=n, write_meta_graph=meta)

    def floats(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    tf1_save(
        root / "A" / "model.ckpt",
        {f"a{i}/{n}": floats(*s) for i in (1, 2) for n, s in (("w", (4, 3)), ("b", (3,)))},
    )
    tf1_save(
        root / "B" / "model.ckpt",
        {f"b{i}/{n}": floats(*s) for i in (1, 2) for n, s in (("w", (4, 3)), ("b", (3,)))},
    )
    dense = {"dense/kernel": floats(8, 4), "dense/bias": floats(4)}
    tf1_save(
        root / "run" / "model.ckpt", {**dense, "global_step": np.int64(0)}, steps=(100, 200, 300)
    )
    tf1_save(root / "tf1" / "model.ckpt", dense, meta=True)
    tf1_save(
        root / "v1" / "model.ckpt",
        {"conv/weights": floats(3, 3, 1, 2), "step": np.int64(5)},
        version=tf.compat.v1.train.SaverDef.V1,
    )

    class Dense(tf.Module):
        def __init__(self):
            self.kernel = tf.Variable(tf.zeros([8, 4]))
            self.bias = tf.Variable(tf.zeros([4]))

    tf.train.Checkpoint(model=Dense()).save(str(root / "tf2" / "template"))

    import keras

    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(4, name="hidden"), keras.layers.Dense(2, name="out")]
    )
    model.compile(optimizer="adam", loss="mse")
    model.fit(floats(16, 8), floats(16, 2), epochs=1, verbose=0)
    tf.train.Checkpoint(model=model).save(str(root / "keras" / "ckpt"))
    np.save(root / "keras" / "expected.npy", model.predict(np.ones((1, 8)), verbose=0))
    model.save(str(root / "keras" / "model.h5"))


def write_releases(root: Path) -> None:
    """The releases of tests/*_release.py (their variables, names and layouts, small
    shapes), each saved by TensorFlow's ``SaveV2`` op under the released files' names:

    - ``uncased_L-12_H-768_A-12/bert_model.ckpt`` and ``bert_config.json``: BERT
      pretraining with its Adam moments (tests/bert_release.py; 2 layers, hidden 16);
    - ``albert_base/model.ckpt-best`` and ``albert_config.json`` (tests/albert_release.py);
    - ``electra_base/model.ckpt`` with its state file (tests/electra_release.py);
    - ``chinese_roformer_L-12_H-768_A-12/bert_model.ckpt`` and ``bert_config.json``:
      RoFormer's masked LM (tests/roformer_release.py);
    - ``uncased_L-24_H-128_B-512_A-4_F-4_OPT/mobilebert.ckpt`` and
      ``mobilebert_config.json``: MobileBERT pretraining (tests/mobilebert_release.py);
    - ``models/124M/model.ckpt`` and ``hparams.json``: GPT-2 (tests/gpt2_release.py);
    - ``t5.1.1-base/model.ckpt-1000000`` and ``t5-small/model.ckpt-1000000``, each with its
      ``operative_config.gin`` (tests/t5_release.py, variants ``t5.1.1`` and ``t5``);
    - ``GPT3_XL/model.ckpt-362000`` and the run's ``config.json``: GPT-Neo
      (tests/gpt_neo_release.py, variant ``adam``);
    - ``finetune-transformer-lm/model/``: the original OpenAI GPT's ``params_shapes.json``
      and ``params_0.npy`` ... ``params_9.npy``, written by numpy
      (tests/openai_gpt_release.py);
    - ``pegasus_ckpt/xsum/model.ckpt-1000`` (no config file, as released): PEGASUS
      fine-tuned, with its Adafactor slots (tests/pegasus_release.py; 4 heads);
    - ``xlnet_cased_L-24_H-1024_A-16/xlnet_model.ckpt`` and ``xlnet_config.json``: XLNet
      pretraining (tests/xlnet_release.py, model ``pretrain``);
    - ``mobilenet_v1_0.25_128/mobilenet_v1_0.25_128.ckpt`` and
      ``mobilenet_v2_0.35_96/mobilenet_v2_0.35_96.ckpt``: slim's MobileNets with RMSProp's
      slots and the moving averages (tests/mobilenet_release.py, variants ``v1``, ``v2``);
    - ``bert-base-uncased/tf_model.h5`` and ``config.json``: a BERT masked LM as
      transformers' TF classes saved it, and ``bert-large/`` the same weights sharded as
      their ``save_pretrained(max_shard_size=...)`` wrote them (tests/hf_tf2_models.py).
    """
    import json

    import albert_release
    import bert_release
    import electra_release
    import gpt2_release
    import gpt_neo_release
    import mobilebert_release
    import mobilenet_release
    import openai_gpt_release
    import pegasus_release
    import roformer_release
    import t5_release
    import xlnet_release
    from transform_helpers import save_v2

    def save(prefix: Path, values: dict) -> None:
        prefix.parent.mkdir(parents=True, exist_ok=True)
        save_v2(str(prefix), {n: values[n] for n in sorted(values)})

    bert = root / "uncased_L-12_H-768_A-12"
    save(bert / "bert_model.ckpt", bert_release.weights("pretraining"))
    (bert / "bert_config.json").write_text(json.dumps(bert_release.CONFIG, indent=2))
    albert = root / "albert_base"
    save(albert / albert_release.FILE, albert_release.weights("pretraining"))
    config = albert_release.CONFIGS["pretraining"]
    (albert / "albert_config.json").write_text(json.dumps(config, indent=2))
    electra = root / "electra_base"
    save(electra / electra_release.FILE, electra_release.weights())
    (electra / "checkpoint").write_text(f'model_checkpoint_path: "{electra_release.FILE}"\n')
    rof = root / "chinese_roformer_L-12_H-768_A-12"
    save(rof / roformer_release.FILE, roformer_release.weights("mlm"))
    (rof / "bert_config.json").write_text(json.dumps(roformer_release.CONFIGS["mlm"], indent=2))
    mobile = root / "uncased_L-24_H-128_B-512_A-4_F-4_OPT"
    save(mobile / mobilebert_release.FILE, mobilebert_release.weights("pretraining"))
    config = json.dumps(mobilebert_release.CONFIGS["pretraining"], indent=2)
    (mobile / mobilebert_release.CONFIG_FILE).write_text(config)
    gpt2 = root / "models" / "124M"
    save(gpt2 / "model.ckpt", gpt2_release.weights())
    (gpt2 / "hparams.json").write_text(json.dumps(gpt2_release.HPARAMS))
    for variant, name in (("t5.1.1", "t5.1.1-base"), ("t5", "t5-small")):
        save(root / name / "model.ckpt-1000000", t5_release.weights(variant))
        (root / name / "operative_config.gin").write_text(t5_release.gin_config(variant))
    neo = root / "GPT3_XL"
    save(neo / "model.ckpt-362000", gpt_neo_release.weights("adam"))
    (neo / "config.json").write_text(json.dumps(gpt_neo_release.config("adam"), indent=4))
    openai_gpt_release.write(str(root / "finetune-transformer-lm" / "model"))
    save(root / "pegasus_ckpt" / "xsum" / pegasus_release.FILE, pegasus_release.weights())
    xl = root / "xlnet_cased_L-24_H-1024_A-16"
    save(xl / "xlnet_model.ckpt", xlnet_release.weights("pretrain"))
    (xl / "xlnet_config.json").write_text(json.dumps(xlnet_release.CONFIGS["pretrain"], indent=2))
    for variant, name in (("v1", "mobilenet_v1_0.25_128"), ("v2", "mobilenet_v2_0.35_96")):
        save(root / name / f"{name}.ckpt", mobilenet_release.weights(variant))
    _write_hf_tf2(root)


def _write_hf_tf2(root: Path) -> None:
    """A transformers TF BERT masked LM's ``tf_model.h5``, whole and sharded."""
    import json

    import hf_tf2_models
    import numpy as np

    config = {
        "model_type": "bert", "architectures": ["TFBertForMaskedLM"], "vocab_size": 50,
        "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 32, "max_position_embeddings": 24, "type_vocab_size": 2,
        "hidden_act": "gelu", "layer_norm_eps": 1e-12,
    }  # fmt: skip
    ids = np.array([[2, 7, 11, 3, 9, 0]])
    inputs = {"input_ids": ids, "token_type_ids": 0 * ids, "attention_mask": 1 + 0 * ids}
    model = hf_tf2_models.TFBertForMaskedLM(config)
    model({k: hf_tf2_models.tf.constant(v) for k, v in inputs.items()})
    rng = np.random.default_rng(4)
    for w in model.weights:
        w.assign((rng.standard_normal(w.shape) * 0.3).astype(np.float32))
    whole, sharded = root / "bert-base-uncased", root / "bert-large"
    whole.mkdir()
    sharded.mkdir()
    model.save_weights(str(whole / "tf_model.h5"))
    weights_bytes = sum(int(np.prod(w.shape)) * 4 for w in model.weights)
    hf_tf2_models.save_sharded(model, str(sharded), weights_bytes // 3)
    for d in (whole, sharded):
        (d / "config.json").write_text(json.dumps(config, indent=2))


if __name__ == "__main__":
    if sys.argv[1:2] not in (["tf"], ["releases"]) or len(sys.argv) != 3:
        sys.exit("usage: docs_setups.py tf|releases DIR")
    # Saved under relative paths, so the state files name their checkpoints relatively and
    # a copy of the directory is a run of its own.
    os.chdir(sys.argv[2])
    (write_tf if sys.argv[1] == "tf" else write_releases)(Path("."))
