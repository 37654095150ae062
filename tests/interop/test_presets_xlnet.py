"""hf-xlnet: XLNet's release (zihangdai/xlnet) into transformers.

TensorFlow writes each source during the test with the release's names and layouts
(pretraining's, run_classifier's, run_squad's and run_race's, with the optimizer's state
and global_step a training run leaves) and computes the model's outputs from it
following the release's modeling.py and function_builder.py (``tests/xlnet_release.py``);
tfckpt exports it with the preset; transformers with PyTorch loads the directory
(``tests/hf_consumer.py``): no missing, unexpected or mismatched keys, and the same
outputs to within float32 rounding. The same export with a copy of the rules file
broken on purpose loads as cleanly and computes something else. TensorFlow and PyTorch
each run in a process of their own.
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
from tfckpt.interop.presets import PRESETS, export_preset, find, xlnet
from tfckpt.rewrite.rulesfile import load_rules, with_rules

pytest.importorskip("tensorflow")
pytest.importorskip("transformers")
pytest.importorskip("torch")

pytestmark = pytest.mark.hf

import albert_release  # noqa: E402
import bert_release  # noqa: E402
import electra_release  # noqa: E402
import gpt2_release  # noqa: E402
import gpt_neo_release  # noqa: E402
import roformer_release  # noqa: E402
import t5_release  # noqa: E402
import xlnet_release  # noqa: E402

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def consume(out_dir: str, model: str, release: str, tmp) -> tuple[dict, dict]:
    """transformers' loading info and outputs for ``model``'s inputs."""
    cls = xlnet_release.CLASSES[model][0]
    inputs = os.path.join(release, model, "inputs.npz")
    result = os.path.join(tmp, f"result-{os.path.basename(out_dir)}.npz")
    run(os.path.join(TESTS, "hf_consumer.py"), out_dir, cls, inputs, result)
    got = dict(np.load(result))
    return json.loads(str(got.pop("loading_info"))), got


def expected(release: str, model: str) -> dict[str, np.ndarray]:
    """The release's outputs as transformers' class returns them. Its question-answering
    head reports the beam's probabilities (named ``*_log_probs``: softmax, not
    log_softmax) and the ends' top for each start ordered end first; the release,
    log-probabilities, start first."""
    want = dict(np.load(os.path.join(release, model, "outputs.npz")))
    if model == "squad":
        top = xlnet_release.TOP
        want["start_top_log_probs"] = np.exp(want["start_top_log_probs"])
        ends = np.exp(want["end_top_log_probs"]).reshape(-1, top, top)
        want["end_top_log_probs"] = ends.transpose(0, 2, 1).reshape(-1, top * top)
    return want


def tolerance(want: np.ndarray) -> float:
    """float32 keeps 24 bits; three layers of sums of at most 32 products, softmaxes and
    norms, done in another order by each framework, lose a few of them. 2^-16 of the
    output's scale leaves 8 bits for that, and is far under what a wrong weight does
    (a swapped or untransposed kernel moves the outputs by their own scale)."""
    return 2.0**-16 * max(1.0, float(np.abs(want).max()))


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """The release's checkpoints TensorFlow wrote (``DIR/<model>``), with their configs,
    inputs and outputs."""
    directory = str(tmp_path_factory.mktemp("xlnet"))
    run(os.path.join(TESTS, "xlnet_release.py"), directory)
    return directory


@pytest.mark.parametrize("model", sorted(xlnet_release.CONFIGS))
def test_auto_recognises_xlnet_and_transformers_computes_what_tensorflow_does(
    release, model, tmp_path
):
    cls, outputs = xlnet_release.CLASSES[model]
    out_dir = str(tmp_path / "hf")
    src = os.path.join(release, model, xlnet_release.FILE)
    proc = run("-m", "tfckpt", "export", src, out_dir, "--preset", "auto")
    assert f"preset auto: hf-xlnet ({cls})" in proc.stderr
    assert "verified:" in proc.stderr
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "xlnet" and config["architectures"] == [cls]
    c = xlnet_release.CONFIGS[model]
    assert config["n_layer"] == c["n_layer"] and config["vocab_size"] == c["n_token"]
    act = {"gelu": "gelu_new", "relu": "relu"}[c["ff_activation"]]  # the release's: tanh
    assert config["ff_activation"] == act and config["layer_norm_eps"] == 1e-12
    st = pytest.importorskip("safetensors.numpy").load_file(
        os.path.join(out_dir, "model.safetensors")
    )
    assert not any("adam" in n.lower() or "step" in n or "power" in n for n in st)
    for k in range(c["n_layer"]):  # the release's [n_layer, ...] biases, a layer each
        assert st[f"transformer.layer.{k}.rel_attn.r_w_bias"].shape == (2, 8)
        assert st[f"transformer.layer.{k}.rel_attn.seg_embed"].shape == (2, 2, 8)
    stored = xlnet_release.weights(model)
    last = c["n_layer"] - 1
    assert np.array_equal(
        st[f"transformer.layer.{last}.rel_attn.r_s_bias"],
        stored["model/transformer/r_s_bias"][last],
    )
    if model == "pretrain":  # pretraining's own mask embedding
        assert np.array_equal(st[xlnet.MASK_EMB], stored["model/transformer/mask_emb/mask_emb"])
    else:  # a fine-tuning graph has none: zeros, which no output of the class reads
        assert np.array_equal(st[xlnet.MASK_EMB], np.zeros((1, 1, 16), np.float32))
    if model == "classifier":
        assert config["id2label"] == {str(i): f"LABEL_{i}" for i in range(3)}
    info, got = consume(out_dir, model, release, tmp_path)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []
    assert info["mismatched_keys"] == []
    want = expected(release, model)
    for output in outputs:
        np.testing.assert_allclose(
            got[output], want[output], rtol=0, atol=tolerance(want[output]), err_msg=output
        )


@pytest.mark.parametrize(
    "breakage",
    [
        # A transpose removed: the sequence summary's kernel kept [in, out] (square, so
        # it loads).
        (
            "match = '(^|\\.)(layer_1|layer_2|summary|logits_proj|dense|dense_0|dense_1)"
            "\\.weight$'",
            "match = '(^|\\.)(layer_1|layer_2|logits_proj|dense|dense_0|dense_1)\\.weight$'",
        ),
        # A name swapped: queries' projections written as keys' and keys' as queries'.
        (
            "match = 'model/transformer/layer_(\\d+)/rel_attn/([qkvor])/kernel'\n"
            "to = 'transformer.layer.\\1.rel_attn.\\2'",
            "match = 'model/transformer/layer_(\\d+)/rel_attn/q/kernel'\n"
            "to = 'transformer.layer.\\1.rel_attn.k'\n[[map]]\n"
            "match = 'model/transformer/layer_(\\d+)/rel_attn/k/kernel'\n"
            "to = 'transformer.layer.\\1.rel_attn.q'\n[[map]]\n"
            "match = 'model/transformer/layer_(\\d+)/rel_attn/([vor])/kernel'\n"
            "to = 'transformer.layer.\\1.rel_attn.\\2'",
        ),
    ],
    ids=["transpose-removed", "names-swapped"],
)
def test_a_broken_copy_of_the_rules_file_makes_the_comparison_fail(release, breakage, tmp_path):
    model = "classifier"  # the summary's kernel is square: untransposed, it still loads
    src = os.path.join(release, model, xlnet_release.FILE)
    good = tmp_path / "good"
    export_preset(src, str(good), "hf-xlnet")
    text = open(PRESETS["hf-xlnet"].rules_file).read()
    old, new = breakage
    assert text.count(old) == 1
    rules = tmp_path / "broken.toml"
    rules.write_text(text.replace(old, new))
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copy(good / "config.json", bad / "config.json")
    config = json.loads((good / "config.json").read_text())
    shapes = {n: v.shape for n, v in xlnet_release.weights(model).items()}
    cut, _ = xlnet.PRESET.from_source(shapes, xlnet_release.CONFIGS[model])
    options = with_rules(tfckpt.Options(**load_rules(str(rules)), allow_unmatched=True), cut)
    p = plan_export(
        src,
        str(bad / "model.safetensors"),
        options,
        format="safetensors",
        made=xlnet.PRESET.made(config),
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
    info, got = consume(str(bad), model, release, tmp_path)
    assert info["missing_keys"] == [] and info["mismatched_keys"] == []  # it loads whole
    want = expected(release, model)["logits"]
    assert np.abs(got["logits"] - want).max() > 100 * tolerance(want)


def _families() -> dict[str, list[str]]:
    """Each other family's release names, as their tests write them."""
    return {
        "hf-bert": list(bert_release.weights("pretraining")),
        "hf-albert": list(albert_release.weights("pretraining")),
        "hf-electra": list(electra_release.weights()),
        "hf-roformer": list(roformer_release.weights("mlm")),
        "hf-gpt2": list(gpt2_release.weights()),
        "hf-gpt-neo": list(gpt_neo_release.weights(next(iter(gpt_neo_release.VARIANTS)))),
        "hf-t5": list(t5_release.weights(next(iter(t5_release.VARIANTS)))),
    }


def test_auto_tells_xlnet_from_every_other_family_and_refuses_an_ambiguous_match():
    for model in xlnet_release.CONFIGS:
        names = list(xlnet_release.weights(model))
        assert [p.name for p in PRESETS.values() if p.knows(names)] == ["hf-xlnet"]
        assert find("auto", names).name == "hf-xlnet"
    others = _families()
    for family, names in others.items():
        assert not xlnet.PRESET.knows(names), family
        assert find("auto", names).name == family
    both = list(xlnet_release.weights("pretrain")) + others["hf-bert"]
    with pytest.raises(tfckpt.CheckpointError, match="of hf-bert and of hf-xlnet.*--preset"):
        find("auto", both)


def _written(tmp_path, values: dict, config: dict | None, name: str = "x") -> str:
    prefix = str(tmp_path / name / xlnet_release.FILE)
    tfckpt.save(values, prefix)
    if config is not None:
        (tmp_path / name / "xlnet_config.json").write_text(json.dumps(config))
    return prefix


def test_refusals_name_the_family_the_weights_and_the_reason(tmp_path):
    out = str(tmp_path / "hf")
    values = xlnet_release.weights("classifier")
    config = xlnet_release.CONFIGS["classifier"]
    bare = _written(tmp_path, values, None, "bare")
    with pytest.raises(tfckpt.CheckpointError, match="hf-xlnet needs the release's config"):
        export_preset(bare, out, "hf-xlnet")
    prefix = _written(tmp_path, values, config)
    cases = [
        ({"n_layer": 2}, "hf-xlnet: the config says 2 layers, the checkpoint holds 3"),
        (
            {"n_token": 41},
            "hf-xlnet: the config gives transformer.word_embedding.weight the shape "
            "\\[41, 16\\], the checkpoint \\[40, 16\\]",
        ),
        ({"d_head": 4}, "hf-xlnet: d_head 4: transformers' XLNet takes d_model // n_head \\(8\\)"),
        ({"n_head": 3}, "hf-xlnet: d_model 16 is not a multiple of n_head 3"),
        ({"ff_activation": "swish"}, "hf-xlnet: ff_activation 'swish': not one of gelu, relu"),
        ({"summary_type": "attn"}, "hf-xlnet: summary_type 'attn': .*no place for"),
        ({"untie_r": False}, "hf-xlnet: untie_r = false: .*a layer each"),
    ]
    for given, message in cases:
        with pytest.raises(tfckpt.CheckpointError, match=message) as e:
            export_preset(prefix, out, "hf-xlnet", config_values=given)
        assert e.value.path == str(tmp_path / "x" / "xlnet_config.json")
    assert not os.path.exists(out)
    # untie_r = false as the checkpoint holds it: one bias shared by every layer.
    tied = dict(values)
    for b in ("r_w_bias", "r_r_bias", "r_s_bias"):
        tied[f"model/transformer/{b}"] = tied[f"model/transformer/{b}"][0]
    with pytest.raises(
        tfckpt.CheckpointError,
        match="hf-xlnet: model/transformer/r_w_bias is \\[2, 8\\]: untie_r = false shares",
    ):
        export_preset(_written(tmp_path, tied, config, "tied"), out, "auto")
    # A graph built without segments: no seg_embed, which transformers' XLNet has.
    no_seg = {k: v for k, v in values.items() if "seg_embed" not in k and "r_s_bias" not in k}
    with pytest.raises(tfckpt.CheckpointError, match="hf-xlnet: .*has no model/transformer/r_s"):
        export_preset(_written(tmp_path, no_seg, config, "noseg"), out, "auto")
    # Two tasks' heads (run_classifier's --cls_scope): transformers' class has one.
    two = dict(values)
    two["model/classification_mnli/logit/kernel"] = values[
        "model/classification_sst-2/logit/kernel"
    ]
    two["model/classification_mnli/logit/bias"] = values["model/classification_sst-2/logit/bias"]
    with pytest.raises(
        tfckpt.CheckpointError,
        match="hf-xlnet: .*classification_mnli.* would both be named 'logits_proj",
    ):
        export_preset(_written(tmp_path, two, config, "two"), out, "auto")
    sm = export_preset(
        _written(tmp_path, two, config, "two2"), out, "auto", exclude=["classification_mnli"]
    )
    assert any("XLNetForSequenceClassification" in w for w in sm.warnings)
    # A tensor the family's model has no place for.
    odd = dict(values)
    odd["model/transformer/layer_0/rel_attn/extra/kernel"] = values[
        "model/transformer/layer_0/rel_attn/q/kernel"
    ]
    with pytest.raises(
        tfckpt.CheckpointError, match="hf-xlnet: 1 tensor.*no name_map rule.*extra/kernel"
    ):
        export_preset(_written(tmp_path, odd, config, "odd"), str(tmp_path / "hf2"), "auto")


def test_a_regression_head_and_a_single_layer_are_exported(tmp_path):
    values = xlnet_release.weights("race")  # one layer: its biases renamed, not split
    values = {k: v for k, v in values.items() if not k.startswith("logits/")}
    values["model/regression_sts-b/logit/kernel"] = np.ones((16, 1), np.float32)
    values["model/regression_sts-b/logit/bias"] = np.zeros((1,), np.float32)
    prefix = _written(tmp_path, values, xlnet_release.CONFIGS["race"])
    sm = export_preset(prefix, str(tmp_path / "hf"), "auto")
    assert any("hf-xlnet (XLNetForSequenceClassification)" in w for w in sm.warnings)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["problem_type"] == "regression" and config["id2label"] == {"0": "LABEL_0"}
    st = pytest.importorskip("safetensors.numpy").load_file(
        str(tmp_path / "hf" / "model.safetensors")
    )
    assert st["logits_proj.weight"].shape == (1, 16)
    assert np.array_equal(
        st["transformer.layer.0.rel_attn.seg_embed"], values["model/transformer/seg_embed"][0]
    )
