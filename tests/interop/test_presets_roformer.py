"""hf-roformer: RoFormer's release (ZhuiyiTechnology/roformer) into transformers.

TensorFlow writes each source during the test with the release's names and layouts
(BERT's names less the position embeddings, with the Adam moments and global_step a
training run leaves) and computes the model's outputs from it following bert4keras's
RoFormer (``tests/roformer_release.py``); tfckpt exports it with the preset;
transformers with PyTorch loads the directory (``tests/hf_consumer.py``): no missing,
unexpected or mismatched keys, and the same outputs to within float32 rounding. The
same export with a copy of the rules file broken on purpose loads as cleanly and
computes something else. TensorFlow and PyTorch each run in a process of their own.
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
from tfckpt.interop.presets import PRESETS, export_preset, find, roformer
from tfckpt.interop.proof import verify_against
from tfckpt.rewrite.rulesfile import load_rules

pytest.importorskip("tensorflow")
pytest.importorskip("transformers")
pytest.importorskip("torch")

pytestmark = pytest.mark.hf

import bert_release  # noqa: E402
import electra_release  # noqa: E402
import roformer_release  # noqa: E402

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLASSES = {
    "mlm": ("RoFormerForMaskedLM", "logits"),
    "encoder": ("RoFormerModel", "last_hidden_state"),
}


def run(*args, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def consume(out_dir: str, cls: str, tmp) -> tuple[dict, dict]:
    """transformers' loading info and outputs for the release's inputs."""
    inputs = os.path.join(tmp, "inputs.npz")
    given = {"input_ids": bert_release.INPUT_IDS, "attention_mask": bert_release.MASK}
    np.savez(inputs, token_type_ids=bert_release.TOKEN_TYPES, **given)
    result = os.path.join(tmp, f"result-{os.path.basename(out_dir)}.npz")
    run(os.path.join(TESTS, "hf_consumer.py"), out_dir, cls, inputs, result)
    got = dict(np.load(result))
    return json.loads(str(got.pop("loading_info"))), got


def tolerance(want: np.ndarray) -> float:
    """float32 keeps 24 bits; two layers of sums of at most 32 products, softmaxes and
    norms, done in another order by each framework, lose a few of them. 2^-16 of the
    output's scale leaves 8 bits for that, and is far under what a wrong weight does
    (a swapped or untransposed kernel moves the outputs by their own scale)."""
    return 2.0**-16 * max(1.0, float(np.abs(want).max()))


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """The release's checkpoints TensorFlow wrote (``DIR/mlm``, ``DIR/encoder``), with
    their configs and outputs."""
    directory = str(tmp_path_factory.mktemp("roformer"))
    run(os.path.join(TESTS, "roformer_release.py"), directory)
    return directory


@pytest.mark.parametrize("model", sorted(CLASSES))
def test_auto_recognises_roformer_and_transformers_computes_what_tensorflow_does(
    release, model, tmp_path
):
    where = os.path.join(release, model)
    cls, output = CLASSES[model]
    out_dir = str(tmp_path / "hf")
    src = os.path.join(where, roformer_release.FILE)
    proc = run("-m", "tfckpt", "export", src, out_dir, "--preset", "auto")
    assert f"preset auto: hf-roformer ({cls})" in proc.stderr
    assert "verified:" in proc.stderr
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "roformer" and config["architectures"] == [cls]
    assert config["hidden_act"] == "gelu"  # bert4keras's gelu: the exact one
    assert config["rotary_value"] is False and config["layer_norm_eps"] == 1e-12
    st = pytest.importorskip("safetensors.numpy").load_file(
        os.path.join(out_dir, "model.safetensors")
    )
    assert not any("adam" in n or "step" in n or "pooler" in n for n in st)
    heads = config["num_attention_heads"]
    table = st[roformer.TABLE]  # computed, not read: the release stores none
    assert table.shape == (24, 16 // heads) and table.dtype == np.float32
    if model == "encoder":  # embeddings narrower than the layers, projected
        assert st["roformer.embeddings_project.weight"].shape == (16, 8)
    info, got = consume(out_dir, cls, tmp_path)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []
    assert info["mismatched_keys"] == []
    want = np.load(os.path.join(where, "outputs.npz"))[output]
    np.testing.assert_allclose(got[output], want, rtol=0, atol=tolerance(want))


@pytest.mark.parametrize(
    "breakage",
    [
        # A transpose removed: the queries' kernels kept [in, out].
        (
            "match = '(query|key|value|dense|embeddings_project)\\.weight$'",
            "match = '(key|value|dense|embeddings_project)\\.weight$'",
        ),
        # A name swapped: queries' kernels written as keys' and keys' as queries'.
        (
            "match = 'bert/encoder/layer_(\\d+)/attention/self/(query|key|value)/kernel'\n"
            "to = 'roformer.encoder.layer.\\1.attention.self.\\2.weight'",
            "match = 'bert/encoder/layer_(\\d+)/attention/self/query/kernel'\n"
            "to = 'roformer.encoder.layer.\\1.attention.self.key.weight'\n[[map]]\n"
            "match = 'bert/encoder/layer_(\\d+)/attention/self/key/kernel'\n"
            "to = 'roformer.encoder.layer.\\1.attention.self.query.weight'\n[[map]]\n"
            "match = 'bert/encoder/layer_(\\d+)/attention/self/value/kernel'\n"
            "to = 'roformer.encoder.layer.\\1.attention.self.value.weight'",
        ),
    ],
    ids=["transpose-removed", "names-swapped"],
)
def test_a_broken_copy_of_the_rules_file_makes_the_comparison_fail(release, breakage, tmp_path):
    where = os.path.join(release, "mlm")
    src = os.path.join(where, roformer_release.FILE)
    good = tmp_path / "good"
    export_preset(src, str(good), "hf-roformer")
    text = open(PRESETS["hf-roformer"].rules_file).read()
    old, new = breakage
    assert text.count(old) == 1
    rules = tmp_path / "broken.toml"
    rules.write_text(text.replace(old, new))
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copy(good / "config.json", bad / "config.json")
    config = json.loads((good / "config.json").read_text())
    p = plan_export(
        src,
        str(bad / "model.safetensors"),
        tfckpt.Options(**load_rules(str(rules)), allow_unmatched=True),
        format="safetensors",
        made=roformer.PRESET.made(config),
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
    info, got = consume(str(bad), "RoFormerForMaskedLM", tmp_path)
    assert info["missing_keys"] == [] and info["mismatched_keys"] == []  # it loads whole
    want = np.load(os.path.join(where, "outputs.npz"))["logits"]
    assert np.abs(got["logits"] - want).max() > 100 * tolerance(want)


def test_auto_tells_roformer_from_bert_and_refuses_an_ambiguous_match():
    rof = list(roformer_release.weights("mlm"))
    bert = list(bert_release.weights("pretraining"))
    assert "bert/encoder/layer_0/attention/self/query/kernel" in rof  # BERT's names...
    assert "bert/embeddings/position_embeddings" not in rof  # ...less these
    assert find("auto", rof).name == "hf-roformer"
    assert find("auto", bert).name == "hf-bert"
    assert [p.name for p in PRESETS.values() if p.knows(rof)] == ["hf-roformer"]
    assert [p.name for p in PRESETS.values() if p.knows(bert)] == ["hf-bert"]
    both = rof + list(electra_release.weights())
    with pytest.raises(tfckpt.CheckpointError, match="of hf-electra and of hf-roformer.*--preset"):
        find("auto", both)


def test_refusals_name_the_family_the_weights_and_the_reason(tmp_path):
    src = tmp_path / "rof"
    prefix = str(src / roformer_release.FILE)
    tfckpt.save(roformer_release.weights("mlm"), prefix)
    with pytest.raises(tfckpt.CheckpointError, match="hf-roformer needs the release's config"):
        export_preset(prefix, str(tmp_path / "hf"), "hf-roformer")
    (src / "bert_config.json").write_text(json.dumps(roformer_release.CONFIGS["mlm"]))
    cases = [
        # NEZHA's releases hold the same names; their config says so.
        ({"use_relative_position": True}, "hf-roformer: use_relative_position: .*NEZHA"),
        (
            {"vocab_size": 60},
            "hf-roformer: the config gives roformer.embeddings.word_embeddings.weight the "
            "shape \\[60, 16\\], the checkpoint \\[50, 16\\]",
        ),
        ({"embedding_size": 8}, "word_embeddings.weight the shape \\[50, 8\\], the checkpoint"),
        ({"num_hidden_layers": 3}, "hf-roformer: the config says 3 layers, the checkpoint holds 2"),
        ({"num_attention_heads": 16}, "head's dimensions, so it must be even"),
        ({"attention_key_size": 8}, "attention_key_size 8: transformers' RoFormer takes"),
        ({"hidden_act": "mish"}, "hf-roformer: hidden_act 'mish': not one of"),
    ]
    for values, message in cases:
        with pytest.raises(tfckpt.CheckpointError, match=message) as e:
            export_preset(prefix, str(tmp_path / "hf"), "hf-roformer", config_values=values)
        assert e.value.path == str(src / "bert_config.json")
    assert not os.path.exists(tmp_path / "hf")
    # Narrow embeddings without the projection the release then has.
    narrow = {k: v for k, v in roformer_release.weights("encoder").items() if "mapping" not in k}
    tfckpt.save(narrow, str(tmp_path / "narrow" / "bert_model.ckpt"))
    config = json.dumps(roformer_release.CONFIGS["encoder"])
    (tmp_path / "narrow" / "bert_config.json").write_text(config)
    with pytest.raises(tfckpt.CheckpointError, match="embedding_size 8 and hidden_size 16 differ"):
        export_preset(str(tmp_path / "narrow" / "bert_model.ckpt"), str(tmp_path / "hf"), "auto")
    # A BERT checkpoint is not RoFormer's: its position embeddings have no place.
    bert = str(tmp_path / "bert" / "bert_model.ckpt")
    tfckpt.save(bert_release.weights("pretraining"), bert)
    with pytest.raises(
        tfckpt.CheckpointError, match="hf-roformer: 1 tensor.*no name_map rule.*position_embeddings"
    ):
        export_preset(bert, str(tmp_path / "hf"), "hf-roformer", config_values=bert_release.CONFIG)


def test_the_computed_table_is_verified_and_cast_with_the_weights(release, tmp_path):
    src = os.path.join(release, "encoder", roformer_release.FILE)
    sm = export_preset(src, str(tmp_path / "hf"), "hf-roformer", cast="float16")
    # 4 embeddings, 2 of the projection, 16 a layer, and the table
    assert any(w.startswith("verified: 39 tensors") for w in sm.warnings), sm.warnings
    st = pytest.importorskip("safetensors.numpy").load_file(
        str(tmp_path / "hf" / "model.safetensors")
    )
    assert st[roformer.TABLE].dtype == np.float16
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    want = roformer.PRESET.made(config)[roformer.TABLE].astype(np.float16)
    assert np.array_equal(st[roformer.TABLE], want)
    proof = verify_against(src, str(tmp_path / "hf"), preset="hf-roformer", cast="float16")
    assert proof.ok, proof.problems()
    # The table changed in the output: the check against the source says so.
    values = dict(st)
    values[roformer.TABLE] = np.zeros_like(values[roformer.TABLE])
    pytest.importorskip("safetensors.numpy").save_file(
        values, str(tmp_path / "hf" / "model.safetensors"), metadata={"format": "pt"}
    )
    proof = verify_against(src, str(tmp_path / "hf"), preset="hf-roformer", cast="float16")
    assert not proof.ok and [n for n, _ in proof.mismatched] == [roformer.TABLE]
