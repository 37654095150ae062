"""hf-albert, hf-electra and hf-electra-generator: Google's releases into transformers.

TensorFlow writes each source during the test with the release's names and layouts
(with the optimizer's moments and global_step a training run leaves) and computes the
model's outputs from it following the release's definition (``tests/albert_release.py``,
``tests/electra_release.py``); tfckpt exports it with the preset; transformers with
PyTorch loads the directory (``tests/hf_consumer.py``): no missing, unexpected or
mismatched keys, and the same outputs to within float32 rounding. TensorFlow and
PyTorch each run in a process of their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tfckpt
from tfckpt.interop.presets import PRESETS, export_preset, find

pytest.importorskip("tensorflow")
pytest.importorskip("transformers")
pytest.importorskip("torch")

import albert_release  # noqa: E402
import bert_release  # noqa: E402
import electra_release  # noqa: E402
import gpt2_release  # noqa: E402

pytestmark = pytest.mark.hf

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def export_cli(src: str, out_dir: str, *flags: str) -> subprocess.CompletedProcess:
    return run("-m", "tfckpt", "export", src, out_dir, *flags)


def consume(out_dir: str, cls: str, tmp) -> tuple[dict, dict]:
    """transformers' loading info and outputs for the releases' inputs."""
    inputs = os.path.join(tmp, "inputs.npz")
    given = {"input_ids": bert_release.INPUT_IDS, "attention_mask": bert_release.MASK}
    np.savez(inputs, token_type_ids=bert_release.TOKEN_TYPES, **given)
    result = os.path.join(tmp, "result.npz")
    run(os.path.join(TESTS, "hf_consumer.py"), out_dir, cls, inputs, result)
    got = dict(np.load(result))
    return json.loads(str(got.pop("loading_info"))), got


def assert_loads_whole(info: dict) -> None:
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []
    assert info["mismatched_keys"] == []


def load_safetensors(out_dir: str) -> dict:
    st = pytest.importorskip("safetensors.numpy")
    return st.load_file(os.path.join(out_dir, "model.safetensors"))


@pytest.fixture(scope="module")
def albert_dir(tmp_path_factory):
    """An ALBERT pretraining and a run_classifier checkpoint TensorFlow wrote, with
    their configs and outputs (``DIR/pretraining``, ``DIR/classifier``)."""
    directory = str(tmp_path_factory.mktemp("albert"))
    run(os.path.join(TESTS, "albert_release.py"), directory)
    return directory


@pytest.fixture(scope="module")
def electra_dir(tmp_path_factory):
    """An ELECTRA pretraining checkpoint TensorFlow wrote (both networks), its logits."""
    directory = str(tmp_path_factory.mktemp("electra"))
    run(os.path.join(TESTS, "electra_release.py"), directory)
    return directory


def test_albert_pretraining_is_recognised_and_computes_what_tensorflow_does(albert_dir, tmp_path):
    where = os.path.join(albert_dir, "pretraining")
    out_dir = str(tmp_path / "hf")
    proc = export_cli(os.path.join(where, albert_release.FILE), out_dir, "--preset", "auto")
    assert "preset auto: hf-albert (AlbertForPreTraining)" in proc.stderr
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "albert" and config["architectures"] == ["AlbertForPreTraining"]
    assert config["hidden_act"] == "gelu_new"  # the release's gelu: the tanh approximation
    assert (config["embedding_size"], config["num_hidden_layers"]) == (8, 3)
    assert "net_structure_type" not in config  # the release's, not AlbertConfig's
    st = load_safetensors(out_dir)
    # One set of layer weights for three layers; kernels transposed to [out, in].
    assert not any("albert_layer_groups.1" in n or "adam" in n or "step" in n for n in st)
    assert st["albert.encoder.embedding_hidden_mapping_in.weight"].shape == (16, 8)
    assert st["predictions.dense.weight"].shape == (8, 16)
    info, got = consume(out_dir, "AlbertForPreTraining", tmp_path)
    assert_loads_whole(info)
    want = dict(np.load(os.path.join(where, "outputs.npz")))
    for name in ("prediction_logits", "sop_logits"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)


def test_albert_classifier_with_groups_computes_what_tensorflow_does(albert_dir, tmp_path):
    where = os.path.join(albert_dir, "classifier")
    out_dir = str(tmp_path / "hf")
    sm = export_preset(os.path.join(where, albert_release.FILE), out_dir, "hf-albert")
    assert "preset hf-albert: hf-albert (AlbertForSequenceClassification)" in sm.warnings
    source = albert_release.weights("classifier")
    assert sm.dropped == len([n for n in source if "adam" in n]) + 1  # and global_step
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (config["num_hidden_groups"], config["inner_group_num"]) == (2, 2)
    assert len(config["id2label"]) == albert_release.LABELS
    st = load_safetensors(out_dir)
    assert "albert.encoder.albert_layer_groups.1.albert_layers.1.ffn.weight" in st
    info, got = consume(out_dir, "AlbertForSequenceClassification", tmp_path)
    assert_loads_whole(info)
    want = np.load(os.path.join(where, "outputs.npz"))["logits"]
    np.testing.assert_allclose(got["logits"], want, rtol=1e-4, atol=1e-5)


def test_electra_discriminator_is_recognised_and_computes_what_tensorflow_does(
    electra_dir, tmp_path
):
    out_dir = str(tmp_path / "hf")
    src = os.path.join(electra_dir, electra_release.FILE)
    proc = export_cli(src, out_dir, "--preset", "auto")  # no config file: from the shapes
    assert "preset auto: hf-electra (ElectraForPreTraining)" in proc.stderr
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "electra" and config["hidden_act"] == "gelu"  # erf gelu
    assert {k: config[k] for k in ("vocab_size", "embedding_size", "hidden_size")} == {
        "vocab_size": 50,
        "embedding_size": 16,
        "hidden_size": 128,
    }
    assert (config["num_hidden_layers"], config["num_attention_heads"]) == (2, 2)  # 128 // 64
    assert (config["intermediate_size"], config["max_position_embeddings"]) == (512, 24)
    st = load_safetensors(out_dir)
    assert st["discriminator_predictions.dense_prediction.weight"].shape == (1, 128)
    assert not any("generator" in n for n in st)  # the generator is hf-electra-generator's
    info, got = consume(out_dir, "ElectraForPreTraining", tmp_path)
    assert_loads_whole(info)
    want = np.load(os.path.join(electra_dir, "outputs.npz"))["discriminator_logits"]
    np.testing.assert_allclose(got["logits"], want, rtol=1e-4, atol=1e-5)


def test_electra_generator_computes_what_tensorflow_does(electra_dir, tmp_path):
    out_dir = str(tmp_path / "hf")
    src = os.path.join(electra_dir, electra_release.FILE)
    sm = export_preset(src, out_dir, "hf-electra-generator")
    source = electra_release.weights()
    moments = [n for n in source if "adam" in n]
    discriminator = ("electra/encoder/", "electra/embeddings_project/", "discriminator_")
    theirs = [n for n in source if n.startswith(discriminator) and n not in moments]
    assert sm.dropped == len(moments) + 1 + len(theirs)  # and global_step
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["ElectraForMaskedLM"]
    assert (config["hidden_size"], config["num_hidden_layers"]) == (64, 1)
    assert (config["num_attention_heads"], config["embedding_size"]) == (1, 16)
    info, got = consume(out_dir, "ElectraForMaskedLM", tmp_path)
    assert_loads_whole(info)
    want = np.load(os.path.join(electra_dir, "outputs.npz"))["generator_logits"]
    np.testing.assert_allclose(got["logits"], want, rtol=1e-4, atol=1e-5)


def test_auto_recognises_each_family_by_markers_no_two_share():
    sources = {
        "hf-bert": [bert_release.weights(h) for h in ("pretraining", "classifier", "squad")],
        "hf-albert": [albert_release.weights(h) for h in albert_release.CONFIGS],
        "hf-electra": [electra_release.weights()],
        "hf-gpt2": [gpt2_release.weights()],
    }
    for preset, checkpoints in sources.items():
        for names in checkpoints:
            recognising = [p.name for p in PRESETS.values() if set(p.markers) & set(names)]
            assert recognising == [preset]
            assert find("auto", list(names)).name == preset
    # ALBERT keeps BERT's bert/embeddings/*: BERT's marker is a name only BERT has.
    assert "bert/embeddings/word_embeddings" in albert_release.weights("classifier")
    both = [*bert_release.weights("squad"), *albert_release.weights("classifier")]
    with pytest.raises(tfckpt.CheckpointError, match="of hf-bert and of hf-albert.*--preset"):
        find("auto", both)
    assert find("hf-electra-generator", []).name == "hf-electra-generator"


def test_the_preset_list_keeps_every_name_whole_in_a_narrow_terminal():
    proc = run("-m", "tfckpt", "presets", env={**os.environ, "COLUMNS": "80"})
    listed = [line.split()[0] for line in proc.stdout.splitlines()[1:]]
    assert listed == list(PRESETS)
    assert {"hf-albert", "hf-electra", "hf-electra-generator"} <= set(listed)


def test_a_config_the_checkpoint_contradicts_is_an_error(tmp_path):
    prefix = str(tmp_path / "albert" / "model.ckpt")
    tfckpt.save(albert_release.weights("pretraining"), prefix)
    with pytest.raises(tfckpt.CheckpointError, match="needs the release's config.*albert_config"):
        export_preset(prefix, str(tmp_path / "hf"), "hf-albert")
    config = dict(albert_release.CONFIGS["pretraining"])
    (tmp_path / "albert" / "albert_config.json").write_text(json.dumps(config))
    cases = {
        "num_hidden_groups": (2, "says 2 groups \\(num_hidden_groups\\), the checkpoint holds 1"),
        "embedding_size": (
            4,
            "gives albert.embeddings.word_embeddings.weight the shape \\[50, 4\\]",
        ),
        "num_attention_heads": (3, "hidden_size 16 is not a multiple of num_attention_heads 3"),
        "hidden_act": ("swish", "hidden_act 'swish': not one of"),
        "inner_group_num": (0, "inner_group_num must be a positive integer, not 0"),
    }
    for key, (value, message) in cases.items():
        with pytest.raises(tfckpt.CheckpointError, match=message):
            export_preset(prefix, str(tmp_path / "hf"), "hf-albert", config_values={key: value})
    assert not os.path.exists(tmp_path / "hf")
    export_preset(prefix, str(tmp_path / "hf"), "auto", config_values={"hidden_act": "GELU"})
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["hidden_act"] == "gelu_new"
    # The release projects the embeddings only where the widths differ; transformers always.
    values = {k: v for k, v in albert_release.weights("pretraining").items() if "mapping" not in k}
    tfckpt.save(values, str(tmp_path / "albert" / "unprojected.ckpt"))
    with pytest.raises(tfckpt.CheckpointError, match="no bert/encoder/embedding_hidden_mapping_in"):
        export_preset(str(tmp_path / "albert" / "unprojected.ckpt"), str(tmp_path / "hf2"), "auto")


def test_electra_settings_override_the_shapes_or_contradict_them(tmp_path):
    prefix = str(tmp_path / "model.ckpt")
    tfckpt.save(electra_release.weights(), prefix)
    # A setting the shapes cannot give (the release's debug sizes have 4 heads at 144).
    flags = ("--preset", "hf-electra", "--config-value", "num_attention_heads=4")
    proc = export_cli(prefix, str(tmp_path / "hf"), *flags)
    assert "preset hf-electra: hf-electra (ElectraForPreTraining)" in proc.stderr
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["num_attention_heads"] == 4 and config["hidden_size"] == 128
    proc = subprocess.run(
        [sys.executable, "-m", "tfckpt", "export", prefix, str(tmp_path / "hf2")]
        + ["--preset", "hf-electra", "--config-value", "num_hidden_layers=3"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "says 3 layers, the checkpoint holds 2" in proc.stderr
    assert not os.path.exists(tmp_path / "hf2")
    cases = {
        "hf-electra": [
            (
                {"hidden_size": 64},
                "output.dense.weight the shape \\[64, 512\\], the checkpoint \\[128",
            ),
            ({"vocab_size": 60}, "gives electra.embeddings.word_embeddings.weight the shape"),
            ({"num_attention_heads": 3}, "hidden_size 128 is not a multiple"),
            ({"num_attention_heads": "four"}, "must be a positive integer, not 'four'"),
            ({"model_size": "small"}, "unknown ELECTRA setting\\(s\\) model_size"),
        ],
        "hf-electra-generator": [
            ({"hidden_act": "relu"}, "transformers' ELECTRA generator takes gelu"),
            ({"num_hidden_layers": 2}, "says 2 layers, the checkpoint holds 1"),
        ],
    }
    for preset, tried in cases.items():
        for values, message in tried:
            with pytest.raises(tfckpt.CheckpointError, match=message):
                export_preset(prefix, str(tmp_path / "hf3"), preset, config_values=values)
    # A checkpoint without a generator of its own: its generator cannot be exported.
    alone = {k: v for k, v in electra_release.weights().items() if not k.startswith("generator/")}
    tfckpt.save(alone, str(tmp_path / "alone.ckpt"))
    with pytest.raises(tfckpt.CheckpointError, match="no generator/encoder/layer_0"):
        export_preset(str(tmp_path / "alone.ckpt"), str(tmp_path / "hf3"), "hf-electra-generator")
