"""hf-mobilenet-v1, hf-mobilenet-v2: slim's MobileNet v1 and v2 (tensorflow/models) into
transformers, checked by transformers.

TensorFlow writes each variant during the test with slim's names and layouts (with the
optimizer's slots, the moving-average shadows and global_step a training run leaves) and
computes its outputs from it as slim's inference graph does (``tests/mobilenet_release.py``);
tfckpt exports it with the preset; transformers with PyTorch loads the directory
(``tests/hf_consumer.py``): no missing, unexpected or mismatched keys, and the same outputs
to within float32 rounding. The same export with a copy of the rules file broken on
purpose loads as cleanly and computes something else. TensorFlow and PyTorch each run in a
process of their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tfckpt
from tfckpt.interop.presets import PRESETS, export_preset, family, find

pytest.importorskip("tensorflow")
pytest.importorskip("transformers")
pytest.importorskip("torch")

pytestmark = pytest.mark.hf

import mobilenet_release  # noqa: E402

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = mobilenet_release.VARIANTS


def run(*args, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def preset(variant: str) -> str:
    return f"hf-mobilenet-v{VARIANTS[variant]['version']}"


def architecture(variant: str) -> str:
    c = VARIANTS[variant]
    head = "ForImageClassification" if c["classes"] else "Model"
    return f"MobileNetV{c['version']}{head}"


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """The variants' checkpoints TensorFlow wrote (``DIR/VARIANT/FILE``), with their outputs."""
    directory = str(tmp_path_factory.mktemp("mobilenet"))
    run(os.path.join(TESTS, "mobilenet_release.py"), directory)
    return directory


def source(release: str, variant: str) -> str:
    return os.path.join(release, variant, mobilenet_release.file_name(variant))


def expected(release: str, variant: str, raw: bool = False) -> np.ndarray:
    """slim's outputs: the logits, or the last feature map as transformers orders it (NCHW)."""
    got = np.load(os.path.join(release, variant, "outputs.npz"))
    key = ("logits" if VARIANTS[variant]["classes"] else "features") + ("_raw" if raw else "")
    return got[key] if VARIANTS[variant]["classes"] else got[key].transpose(0, 3, 1, 2)


def consume(out_dir: str, variant: str, tmp) -> tuple[dict, np.ndarray]:
    """transformers' loading info and output for the variant's images."""
    inputs = os.path.join(tmp, "inputs.npz")
    np.savez(inputs, pixel_values=mobilenet_release.pixels(variant).transpose(0, 3, 1, 2))
    result = os.path.join(tmp, f"result-{os.path.basename(out_dir)}.npz")
    run(os.path.join(TESTS, "hf_consumer.py"), out_dir, architecture(variant), inputs, result)
    got = dict(np.load(result))
    output = "logits" if VARIANTS[variant]["classes"] else "last_hidden_state"
    return json.loads(str(got.pop("loading_info"))), got[output]


def tolerance(want: np.ndarray) -> float:
    """float32 keeps 24 bits. Each output is a chain of up to 52 convolutions, each a sum
    of at most 9 * 1280 products, and batch norms, which TensorFlow and PyTorch round in
    other orders: 2^-14 of the output's scale leaves 10 bits for that, and is far under
    what a wrong weight does (a kernel turned, a shadow for a variable: whole percents)."""
    return 2.0**-14 * max(1.0, float(np.abs(want).max()))


def close(got: np.ndarray, want: np.ndarray) -> bool:
    return got.shape == want.shape and bool(np.abs(got - want).max() <= tolerance(want))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_auto_recognises_mobilenet_and_transformers_computes_what_slim_does(
    release, variant, tmp_path
):
    c = VARIANTS[variant]
    out_dir = str(tmp_path / "hf")
    size = f"image_size={c['size']}"
    proc = run("-m", "tfckpt", "export", source(release, variant), out_dir, "--preset", "auto",
               "--config-value", size)  # fmt: skip
    assert f"preset auto: {preset(variant)} ({architecture(variant)})" in proc.stderr
    assert "verified:" in proc.stderr
    assert sorted(os.listdir(out_dir)) == ["config.json", "model.safetensors"]
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == f"mobilenet_v{c['version']}"
    assert config["architectures"] == [architecture(variant)]
    assert config["depth_multiplier"] == c["multiplier"] and config["image_size"] == c["size"]
    assert config["tf_padding"] is True and config["layer_norm_eps"] == 0.001
    assert config["hidden_act"] == "relu6" and config["min_depth"] == 8
    if c["classes"]:
        assert len(config["id2label"]) == c["classes"]
    if c["version"] == 2:
        assert config["finegrained_output"] is c["finegrain"]
    st = pytest.importorskip("safetensors.numpy").load_file(
        os.path.join(out_dir, "model.safetensors")
    )
    counters = [n for n in st if n.endswith("num_batches_tracked")]
    assert counters and all(st[n].shape == () and st[n] == 0 for n in counters)
    info, got = consume(out_dir, variant, tmp_path)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []
    assert info["mismatched_keys"] == []
    want = expected(release, variant)
    np.testing.assert_allclose(got, want, rtol=0, atol=tolerance(want))
    if c["ema"]:  # the shadows were taken, not the variables
        assert not close(got, expected(release, variant, raw=True))


@pytest.mark.parametrize("variant", [v for v in sorted(VARIANTS) if VARIANTS[v]["ema"]])
def test_ema_false_takes_the_raw_variables(release, variant, tmp_path):
    out_dir = str(tmp_path / "hf")
    sm = export_preset(source(release, variant), out_dir, preset(variant),
                       config_values={"ema": False})  # fmt: skip
    every = mobilenet_release.weights(variant)
    left_out = [n for n in every if n.endswith(mobilenet_release.EMA) or "/RMSProp" in n]
    assert sm.dropped == len(left_out) + 1  # and global_step
    _, got = consume(out_dir, variant, tmp_path)
    want = expected(release, variant, raw=True)
    np.testing.assert_allclose(got, want, rtol=0, atol=tolerance(want))


def _turned(rules: str) -> str:
    """The rules with every convolution kernel's height and width exchanged: the same
    shapes (3x3 kernels), other values."""
    general = "match = '(convolution|classifier)\\.weight$'\naxes = [3, 2, 0, 1]"
    assert general in rules
    return rules.replace(general, general.replace("[3, 2, 0, 1]", "[3, 2, 1, 0]"))


@pytest.mark.parametrize("variant", ["v1", "v2"])
def test_a_broken_rules_file_makes_transformers_compute_something_else(
    release, variant, tmp_path, monkeypatch
):
    """The comparison can fail: a copy of the preset's rules with the kernels' axes turned,
    read in place of the shipped ones, exports a model transformers loads whole whose
    logits are not slim's."""
    copy = tmp_path / "presets"
    copy.mkdir()
    name = preset(variant)
    rules = open(os.path.join(family.HERE, f"{name}.toml")).read()
    (copy / f"{name}.toml").write_text(_turned(rules))
    monkeypatch.setattr(family, "HERE", str(copy))
    out_dir = str(tmp_path / "hf")
    export_preset(source(release, variant), out_dir, name)
    info, got = consume(out_dir, variant, tmp_path)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []
    assert info["mismatched_keys"] == []
    assert not close(got, expected(release, variant))


def test_auto_tells_mobilenets_from_every_other_family():
    import bert_release
    import gpt_neo_release

    for variant in VARIANTS:
        names = list(mobilenet_release.weights(variant))
        assert [p.name for p in PRESETS.values() if p.knows(names)] == [preset(variant)]
        assert find("auto", names).name == preset(variant)
    for names in (bert_release.weights("pretraining"), gpt_neo_release.weights("adam")):
        assert not any(
            p.name.startswith("hf-mobilenet") for p in PRESETS.values() if p.knows(list(names))
        )
    both = list(mobilenet_release.weights("v1")) + list(mobilenet_release.weights("v2-head"))
    with pytest.raises(tfckpt.CheckpointError, match="of hf-mobilenet-v1 and of hf-mobilenet-v2"):
        find("auto", both)


def _saved(tmp_path, variant: str, change=None) -> str:
    """The variant's checkpoint written by tfckpt (no TensorFlow), ``change``d: the prefix."""
    values = mobilenet_release.weights(variant)
    if change is not None:
        change(values)
    prefix = str(tmp_path / "src" / mobilenet_release.file_name(variant))
    tfckpt.save(values, prefix)
    return prefix


@pytest.mark.parametrize(
    "variant, values, message",
    [
        (
            "v1",
            {"depth_multiplier": 0.5},
            "hf-mobilenet-v1: transformers' model of the checkpoint: with depth_multiplier 0.5, "
            r"mobilenet_v1.conv_stem.convolution.weight is \[8, 3, 3, 3\] there, \[16, 3, 3, 3\]",
        ),
        ("v1", {"min_depth": 0}, "hf-mobilenet-v1: min_depth must be a positive integer"),
        ("v2", {"depth_multiplier": -1}, "depth_multiplier must be a positive number, not -1"),
        (
            "v2-head",
            {"finegrained_output": True},
            "no depth_multiplier of the releases' makes these shapes "
            "\\(the nearest, depth_multiplier 0.5, finegrained_output True: mobilenet_v2.conv_1x1"
            r".convolution.weight is \[640, 160, 1, 1\] there, \[1280, 160, 1, 1\] here\)",
        ),
        ("v2", {"expand_ratio": 4}, "hf-mobilenet-v2: .*expand_1x1.convolution.weight is"),
        ("v1", {"ema": "yes"}, "hf-mobilenet-v1: ema = 'yes': expected true .* or false"),
        ("v2-head", {"ema": True}, "hf-mobilenet-v2: ema = true, but the checkpoint holds no"),
    ],
)
def test_settings_the_tensors_contradict_are_refused_naming_them(
    tmp_path, variant, values, message
):
    prefix = _saved(tmp_path, variant)
    with pytest.raises(tfckpt.CheckpointError, match=message):
        export_preset(prefix, str(tmp_path / "hf"), preset(variant), config_values=values)
    assert not os.path.exists(tmp_path / "hf")


def test_a_missing_layer_is_refused_naming_it(tmp_path):
    def drop(values):
        for name in [n for n in values if n.startswith("MobilenetV1/Conv2d_13_pointwise/")]:
            del values[name]

    prefix = _saved(tmp_path, "v1", drop)
    with pytest.raises(tfckpt.CheckpointError, match="the checkpoint has no mobilenet_v1.layer.25"):
        export_preset(prefix, str(tmp_path / "hf"), "hf-mobilenet-v1")
    assert not os.path.exists(tmp_path / "hf")


def test_a_tensor_transformers_has_no_place_for_is_refused_naming_the_family(tmp_path):
    """A quantized release's ranges (mobilenet_v1_1.0_224_quant) have no place in
    transformers' MobileNetV1; the command line says so in one line."""
    extra = "MobilenetV1/Conv2d_0/act_quant/max"

    def add(values):
        values[extra] = np.array(6.0, np.float32)

    prefix = _saved(tmp_path, "v1", add)
    out = tmp_path / "hf"
    proc = subprocess.run(
        [sys.executable, "-m", "tfckpt", "export", prefix, str(out), "--preset", "auto"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"{prefix}: hf-mobilenet-v1: 1 tensor(s) no name_map rule names" in proc.stderr
    assert f": {extra}, which transformers' model of this family has no place" in proc.stderr
    assert not out.exists()
