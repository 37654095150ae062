"""hf-mobilebert: MobileBERT's release (google-research/google-research mobilebert/) into
transformers.

TensorFlow writes each source during the test with the release's names and layouts
(bottlenecks, stacked FFNs, FakeLayerNorm or LayerNorm, the trigram input
transformation, the MLM head's extra output columns; the Adam moments and global_step
a training run leaves) and computes the model's outputs from it following the
release's modeling.py (``tests/mobilebert_release.py``); tfckpt exports it with the
preset; transformers with PyTorch loads the directory (``tests/hf_consumer.py``): no
missing, unexpected or mismatched keys, and the same outputs to within float32
rounding. The same export with a copy of the rules file broken on purpose loads as
cleanly and computes something else. TensorFlow and PyTorch each run in a process of
their own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import tfckpt
from tfckpt.interop.export import plan_export
from tfckpt.interop.presets import PRESETS, export_preset, find, mobilebert
from tfckpt.rewrite.rulesfile import load_rules

pytest.importorskip("tensorflow")
pytest.importorskip("transformers")
pytest.importorskip("torch")

pytestmark = pytest.mark.hf

import bert_release  # noqa: E402
import electra_release  # noqa: E402
import mobilebert_release  # noqa: E402
import roformer_release  # noqa: E402

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLASSES = {
    "pretraining": (
        "MobileBertForPreTraining",
        ("prediction_logits", "seq_relationship_logits"),
    ),
    "wide": ("MobileBertForPreTraining", ("prediction_logits", "seq_relationship_logits")),
    "classifier": ("MobileBertForSequenceClassification", ("logits",)),
    "squad": ("MobileBertForQuestionAnswering", ("start_logits", "end_logits")),
}


def run(*args, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def consume(out_dir: str, cls: str, tmp) -> tuple[dict, dict]:
    """transformers' loading info and outputs for the release's inputs."""
    inputs = os.path.join(tmp, "inputs.npz")
    np.savez(
        inputs,
        input_ids=mobilebert_release.INPUT_IDS,
        token_type_ids=mobilebert_release.TOKEN_TYPES,
        attention_mask=mobilebert_release.MASK,
    )
    result = os.path.join(tmp, f"result-{os.path.basename(out_dir)}.npz")
    run(os.path.join(TESTS, "hf_consumer.py"), out_dir, cls, inputs, result)
    got = dict(np.load(result))
    return json.loads(str(got.pop("loading_info"))), got


def tolerance(want: np.ndarray) -> float:
    """float32 keeps 24 bits; two layers of up to four FFNs, each a sum of at most 48
    products, softmaxes and norms, done in another order by each framework, lose a few
    of them. 2^-16 of the output's scale leaves 8 bits for that, and is far under what
    a wrong weight does (a swapped or untransposed kernel moves the outputs by their
    own scale)."""
    return 2.0**-16 * max(1.0, float(np.abs(want).max()))


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """The release's checkpoints TensorFlow wrote (``DIR/MODEL``), with their configs and
    outputs."""
    directory = str(tmp_path_factory.mktemp("mobilebert"))
    run(os.path.join(TESTS, "mobilebert_release.py"), directory)
    return directory


@pytest.mark.parametrize("model", sorted(CLASSES))
def test_auto_recognises_mobilebert_and_transformers_computes_what_tensorflow_does(
    release, model, tmp_path
):
    where = os.path.join(release, model)
    cls, outputs = CLASSES[model]
    out_dir = str(tmp_path / "hf")
    src = os.path.join(where, mobilebert_release.FILE)
    proc = run("-m", "tfckpt", "export", src, out_dir, "--preset", "auto")
    assert f"preset auto: hf-mobilebert ({cls})" in proc.stderr
    assert "verified:" in proc.stderr
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    release_config = mobilebert_release.settings(model)
    assert config["model_type"] == "mobilebert" and config["architectures"] == [cls]
    for key in ("trigram_input", "use_bottleneck", "num_feedforward_networks"):
        assert config[key] == release_config[key]  # written out: transformers' defaults differ
    assert config["type_vocab_size"] == release_config["type_vocab_size"]
    st = pytest.importorskip("safetensors.numpy").load_file(
        os.path.join(out_dir, "model.safetensors")
    )
    assert not any("adam" in n or "step" in n for n in st)
    info, got = consume(out_dir, cls, tmp_path)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []
    assert info["mismatched_keys"] == []
    want = np.load(os.path.join(where, "outputs.npz"))
    if release_config["normalization_type"] == "layer_norm":
        # transformers' port normalises the embeddings and each layer's output with
        # PyTorch's default epsilon (1e-5), the release with 1e-12 (as in all its other
        # norms): equal to the release's definition with those two epsilons, and to
        # the release itself within what they change.
        port = np.load(os.path.join(where, "outputs-torch-eps.npz"))
        for name in outputs:
            np.testing.assert_allclose(got[name], port[name], rtol=0, atol=tolerance(port[name]))
            moved = float(np.abs(port[name] - want[name]).max())
            assert moved < 1e-4 * max(1.0, float(np.abs(want[name]).max()))
            np.testing.assert_allclose(
                got[name], want[name], rtol=0, atol=tolerance(want[name]) + moved
            )
    else:
        for name in outputs:
            np.testing.assert_allclose(got[name], want[name], rtol=0, atol=tolerance(want[name]))


def test_the_tensors_transformers_holds_and_the_release_lacks_are_made(release, tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    # No trigram input and embeddings as wide as the layers: no embedding_transformation
    # in the release; transformers keeps one it skips, written as the identity.
    src = os.path.join(release, "squad", mobilebert_release.FILE)
    sm = export_preset(src, str(tmp_path / "squad"), "hf-mobilebert")
    assert any(w.startswith("verified: 53 tensors") for w in sm.warnings), sm.warnings
    got = st.load_file(str(tmp_path / "squad" / "model.safetensors"))
    transform = "mobilebert.embeddings.embedding_transformation."
    assert np.array_equal(got[transform + "weight"], np.eye(16, dtype=np.float32))
    assert np.array_equal(got[transform + "bias"], np.zeros(16, np.float32))
    assert not any(n.startswith("mobilebert.pooler") for n in got)  # QA has none
    # Embeddings as wide as the layers: no extra output columns; an empty matrix.
    src = os.path.join(release, "wide", mobilebert_release.FILE)
    export_preset(src, str(tmp_path / "wide"), "hf-mobilebert")
    got = st.load_file(str(tmp_path / "wide" / "model.safetensors"))
    assert got["cls.predictions.dense.weight"].shape == (0, 40)
    # Where the release has them, they are its own, transposed.
    src = os.path.join(release, "pretraining", mobilebert_release.FILE)
    export_preset(src, str(tmp_path / "pre"), "hf-mobilebert")
    got = st.load_file(str(tmp_path / "pre" / "model.safetensors"))
    values = mobilebert_release.weights("pretraining")
    extra = values["cls/predictions/extra_output_weights"]
    assert np.array_equal(got["cls.predictions.dense.weight"], extra.T)
    kernel = values["bert/embeddings/embedding_transformation/kernel"]
    assert np.array_equal(got[transform + "weight"], kernel.T)


@pytest.mark.parametrize(
    "breakage",
    [
        # A transpose removed: the queries' kernels kept [in, out].
        (
            "match = '(query|key|value|dense|embedding_transformation)\\.weight$'",
            "match = '(key|value|dense|embedding_transformation)\\.weight$'",
        ),
        # A name swapped: the input bottleneck's kernels written as the queries' and
        # keys' bottleneck's and the other way round (both [8, 16]).
        (
            "match = 'bert/encoder/layer_(\\d+)/bottleneck/(input|attention)/dense/kernel'\n"
            "to = 'mobilebert.encoder.layer.\\1.bottleneck.\\2.dense.weight'",
            "match = 'bert/encoder/layer_(\\d+)/bottleneck/input/dense/kernel'\n"
            "to = 'mobilebert.encoder.layer.\\1.bottleneck.attention.dense.weight'\n[[map]]\n"
            "match = 'bert/encoder/layer_(\\d+)/bottleneck/attention/dense/kernel'\n"
            "to = 'mobilebert.encoder.layer.\\1.bottleneck.input.dense.weight'",
        ),
    ],
    ids=["transpose-removed", "names-swapped"],
)
def test_a_broken_copy_of_the_rules_file_makes_the_comparison_fail(release, breakage, tmp_path):
    where = os.path.join(release, "pretraining")
    src = os.path.join(where, mobilebert_release.FILE)
    good = tmp_path / "good"
    export_preset(src, str(good), "hf-mobilebert")
    text = open(PRESETS["hf-mobilebert"].rules_file).read()
    old, new = breakage
    assert text.count(old) == 1
    broken = text.replace(old, new)
    rules = tmp_path / "broken.toml"
    rules.write_text(broken)
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copy(good / "config.json", bad / "config.json")
    p = plan_export(
        src,
        str(bad / "model.safetensors"),
        tfckpt.Options(**load_rules(str(rules)), allow_unmatched=True),
        format="safetensors",
    )
    p.output.framework = "pt"
    try:
        tfckpt.execute(p)
    finally:
        for s in p.sources:
            s.ckpt.close()
    st = pytest.importorskip("safetensors.numpy")
    assert sorted(st.load_file(str(bad / "model.safetensors"))) == sorted(
        st.load_file(str(good / "model.safetensors"))
    )
    info, got = consume(str(bad), "MobileBertForPreTraining", tmp_path)
    assert info["missing_keys"] == [] and info["mismatched_keys"] == []  # it loads whole
    want = np.load(os.path.join(where, "outputs.npz"))["prediction_logits"]
    assert np.abs(got["prediction_logits"] - want).max() > 100 * tolerance(want)


def test_auto_tells_mobilebert_from_every_other_family_and_refuses_an_ambiguous_match():
    bert = list(bert_release.weights("pretraining"))
    rof = list(roformer_release.weights("mlm"))
    for model in CLASSES:
        names = list(mobilebert_release.weights(model))
        assert "bert/encoder/layer_0/attention/self/query/kernel" in names  # BERT's names...
        assert "bert/embeddings/position_embeddings" in names  # ...all of them
        assert any(m in names for m in mobilebert.MARKERS)  # and its own
        assert [p.name for p in PRESETS.values() if p.knows(names)] == ["hf-mobilebert"]
        assert find("auto", names).name == "hf-mobilebert"
    assert [p.name for p in PRESETS.values() if p.knows(bert)] == ["hf-bert"]
    assert [p.name for p in PRESETS.values() if p.knows(rof)] == ["hf-roformer"]
    # Every MobileBERT feature off: BERT's names and layout, taken for BERT's.
    plain = {**mobilebert_release.CONFIGS["squad"], "num_feedforward_networks": 1}
    mobilebert_release.CONFIGS["plain"] = plain
    mobilebert_release.HEADS["plain"] = "squad"
    try:
        names = list(mobilebert_release.weights("plain"))
    finally:
        del mobilebert_release.CONFIGS["plain"], mobilebert_release.HEADS["plain"]
    assert find("auto", names).name == "hf-bert"
    both = list(mobilebert_release.weights("pretraining")) + list(electra_release.weights())
    with pytest.raises(
        tfckpt.CheckpointError, match="of hf-electra and of hf-mobilebert.*--preset"
    ):
        find("auto", both)


def test_a_distillation_run_exports_the_student(release, tmp_path):
    """run_pretraining with a teacher keeps it (frozen, under teacher/) and the hidden
    distillation's LayerNorms beside the student: left out, as the optimizer's state."""
    values = mobilebert_release.weights("pretraining")
    teacher = {f"teacher/{n}": v for n, v in bert_release.weights("pretraining").items()}
    extra = {
        "hidden_distill_0/LayerNorm/beta": np.zeros(16, np.float32),
        "hidden_distill_0/LayerNorm_1/gamma": np.ones(16, np.float32),
    }
    prefix = str(tmp_path / "distilled" / mobilebert_release.FILE)
    tfckpt.save({**values, **teacher, **extra}, prefix)
    config = json.dumps(mobilebert_release.CONFIGS["pretraining"])
    (tmp_path / "distilled" / mobilebert_release.CONFIG_FILE).write_text(config)
    export_preset(prefix, str(tmp_path / "student"), "auto")
    src = os.path.join(release, "pretraining", mobilebert_release.FILE)
    export_preset(src, str(tmp_path / "plain"), "auto")
    st = pytest.importorskip("safetensors.numpy")
    a = st.load_file(str(tmp_path / "student" / "model.safetensors"))
    b = st.load_file(str(tmp_path / "plain" / "model.safetensors"))
    assert sorted(a) == sorted(b) and all(np.array_equal(a[n], b[n]) for n in a)


def test_refusals_name_the_family_the_weights_and_the_reason(tmp_path):
    src = tmp_path / "mb"
    prefix = str(src / mobilebert_release.FILE)
    tfckpt.save(mobilebert_release.weights("pretraining"), prefix)
    with pytest.raises(tfckpt.CheckpointError, match="hf-mobilebert needs the release's config"):
        export_preset(prefix, str(tmp_path / "hf"), "hf-mobilebert")
    (src / "mobilebert_config.json").write_text(
        json.dumps(mobilebert_release.CONFIGS["pretraining"])
    )
    word = "mobilebert.embeddings.word_embeddings.weight"
    cases = [
        ({"vocab_size": 60}, f"hf-mobilebert: the config gives {word} the shape \\[60, 8\\]"),
        (
            {"num_hidden_layers": 3},
            "hf-mobilebert: the config says 3 layers, the checkpoint holds 2",
        ),
        (
            {"num_feedforward_networks": 2},
            "num_feedforward_networks says 1 feed-forward networks before the last, the "
            "checkpoint holds 3",
        ),
        ({"trigram_input": False}, "embedding_transformation.weight the shape \\[16, 8\\]"),
        ({"trigram_input": "yes"}, "hf-mobilebert: trigram_input must be true or false"),
        (
            {"classifier_activation": True},
            "classifier_activation is on, but the checkpoint has no bert/pooler",
        ),
        (
            {"use_bottleneck_attention": True},
            "value.weight the shape \\[8, 8\\], the checkpoint \\[8, 16\\]",
        ),
        ({"normalization_type": "manual_layer_norm"}, "has layer_norm and no_norm only"),
        ({"hidden_act": "mish"}, "hf-mobilebert: hidden_act 'mish': not one of"),
        ({"intra_bottleneck_size": 7}, "intra_bottleneck_size 7 is not a multiple of"),
        (
            # The IB-BERT teacher's layout (uncased_L-24_H-1024_B-512_A-4.json).
            {"key_query_shared_bottleneck": False, "intra_bottleneck_size": 32},
            "attends from the hidden states \\(hidden_size 16\\) with heads of "
            "intra_bottleneck_size 32",
        ),
    ]
    for values, message in cases:
        with pytest.raises(tfckpt.CheckpointError, match=message) as e:
            export_preset(prefix, str(tmp_path / "hf"), "hf-mobilebert", config_values=values)
        assert e.value.path == str(src / "mobilebert_config.json")
    assert not os.path.exists(tmp_path / "hf")
    # A quantization-aware run's fake-quant ranges: transformers' model has no place.
    qat = dict(mobilebert_release.weights("pretraining"))
    name = "bert/encoder/layer_0/bottleneck/input/dense/MobileBertActFakeQuantWithMinMaxVars/min"
    qat[name] = np.array(-6.0, np.float32)
    tfckpt.save(qat, str(tmp_path / "qat" / mobilebert_release.FILE))
    (tmp_path / "qat" / "bert_config.json").write_text(
        json.dumps(mobilebert_release.CONFIGS["pretraining"])
    )
    with pytest.raises(
        tfckpt.CheckpointError, match="hf-mobilebert: 1 tensor.*no name_map rule.*FakeQuant"
    ):
        export_preset(str(tmp_path / "qat" / mobilebert_release.FILE), str(tmp_path / "hf"))
    # MobileBERT's checkpoint is not BERT's: named so, its own tensors are refused.
    with pytest.raises(
        tfckpt.CheckpointError,
        match="hf-bert: 73 tensor.*no name_map rule.*bottleneck/input/dense/kernel.*has no place",
    ):
        export_preset(
            prefix, str(tmp_path / "hf"), "hf-bert", config=str(src / "mobilebert_config.json")
        )
    assert not os.path.exists(tmp_path / "hf")
