"""Presets given hostile or impossible configs: one line naming the config file and the
setting, exit 2, nothing written, the release untouched; and the verification that
loads the written config.json with transformers itself.

The BERT release is written by TensorFlow (``tests/bert_release.py``, in a process of its
own), the other families' variables with tfckpt's writer under the releases' names
(``tests/*_release.py``); transformers runs as the export runs it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
from cli_helpers import assert_cli_error, in_process

import tfckpt
from tfckpt.interop.presets import config_values, export_preset
from tfckpt.interop.presets.family import MAX_DEPTH, Refused, parse_json
from tfckpt.interop.presets.loading import verify_config
from tfckpt.interop.presets.validation import config_json
from tfckpt.io.storage import storage_for

pytest.importorskip("tensorflow")
pytest.importorskip("transformers")

import albert_release  # noqa: E402
import electra_release  # noqa: E402
import gpt2_release  # noqa: E402
import t5_release  # noqa: E402

pytestmark = pytest.mark.hf

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEEP = "[" * 100_000 + "]" * 100_000  # json.loads recurses once a level


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory) -> str:
    """A BERT pretraining release TensorFlow wrote: bert_model.ckpt, bert_config.json."""
    directory = str(tmp_path_factory.mktemp("bert"))
    done = subprocess.run(
        [sys.executable, os.path.join(TESTS, "bert_release.py"), directory, "pretraining"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return directory


def snapshot(directory) -> dict[str, str]:
    """Every file under ``directory``: its SHA-256."""
    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
    return out


def refused(src_dir, args: list[str], *fragments: str, out=None) -> str:
    """``tfckpt export ARGS`` fails with one line holding ``fragments``; nothing is
    written and the release is as it was."""
    before = snapshot(src_dir)
    out = out or os.path.join(os.path.dirname(src_dir), "hf-refused")
    line = assert_cli_error(in_process("export", *args, out), *fragments)
    assert not os.path.exists(out)
    assert snapshot(src_dir) == before
    return line


@pytest.fixture
def bert(bert_dir, tmp_path) -> str:
    """A copy of the release whose bert_config.json a test may change."""
    shutil.copytree(bert_dir, tmp_path / "bert")
    return str(tmp_path / "bert")


def set_config(directory: str, name: str, **changes) -> str:
    path = os.path.join(directory, name)
    with open(path) as f:
        config = json.load(f)
    config.update(changes)
    with open(path, "w") as f:
        json.dump(config, f)  # Python's writer spells NaN and Infinity
    return path


BERT_FILE_CASES = {
    "heads 0": (
        {"num_attention_heads": 0},
        "num_attention_heads must be a positive integer, not 0",
    ),
    "heads not dividing": (
        {"num_attention_heads": 3},
        "hidden_size 16 is not a multiple of num_attention_heads 3",
    ),
    "heads negative": ({"num_attention_heads": -4}, "must be a positive integer, not -4"),
    "size a float": ({"hidden_size": 16.0}, "hidden_size must be a positive integer, not 16.0"),
    "size a string": ({"intermediate_size": "32"}, "intermediate_size must be a positive"),
    "NaN": ({"hidden_dropout_prob": float("nan")}, "NaN is not a number JSON has"),
    "infinity": ({"initializer_range": float("inf")}, "Infinity is not a number JSON has"),
    "rate above 1": ({"attention_probs_dropout_prob": 2}, "must be a rate from 0 to 1, not 2"),
    "float a string": ({"initializer_range": "0.02"}, "initializer_range must be a number"),
}


@pytest.mark.parametrize("case", sorted(BERT_FILE_CASES))
def test_a_bert_config_transformers_would_refuse_is_refused_before_a_write(bert, case):
    changes, message = BERT_FILE_CASES[case]
    config = set_config(bert, "bert_config.json", **changes)
    line = refused(bert, [os.path.join(bert, "bert_model.ckpt"), "--preset", "hf-bert"], message)
    assert config in line


def test_a_deeply_nested_or_huge_config_file_is_refused(bert, tmp_path):
    config = os.path.join(bert, "bert_config.json")
    ckpt = os.path.join(bert, "bert_model.ckpt")
    with open(config) as f:
        text = f.read()
    with open(config, "w") as f:
        f.write(text.replace("{", '{"extra": ' + DEEP + ", ", 1))
    refused(bert, [ckpt, "--preset", "hf-bert"], config, f"nested deeper than {MAX_DEPTH}")
    with open(config, "w") as f:
        f.write(text.replace("0.02", "1e400"))  # a float's range ends near 1.8e308
    refused(bert, [ckpt, "--preset", "hf-bert"], config, "1e400 is not a finite number")
    big = str(tmp_path / "big.json")
    with open(big, "w") as f:
        f.write(text + " " * (9 << 20))
    refused(bert, [ckpt, "--preset", "hf-bert", "--config", big], big, "at most 8 MiB")


@pytest.mark.parametrize(
    "value, message",
    [
        (f"extra={DEEP}", "--config-value extra: nested deeper than"),
        ("hidden_dropout_prob=NaN", "--config-value hidden_dropout_prob: NaN is not a number"),
        ("hidden_dropout_prob=-Infinity", "-Infinity is not a number JSON has"),
        ("num_attention_heads=0", "not 0 (set by --config-value num_attention_heads)"),
        ("num_attention_heads=5", "not a multiple of num_attention_heads 5 (set by --config-value"),
        ("hidden_dropout_prob=1.5", "hidden_dropout_prob must be a rate from 0 to 1, not 1.5"),
    ],
)
def test_a_config_value_transformers_would_refuse_is_refused(bert_dir, value, message):
    ckpt = os.path.join(bert_dir, "bert_model.ckpt")
    refused(bert_dir, [ckpt, "--preset", "hf-bert", "--config-value", value], message)


def test_other_families_refuse_heads_sizes_and_non_finite_numbers(tmp_path):
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    tfckpt.save(gpt2_release.weights(), str(gpt2 / "model.ckpt"))
    (gpt2 / "hparams.json").write_text(json.dumps({**gpt2_release.HPARAMS, "n_head": 0}))
    ckpt = str(gpt2 / "model.ckpt")
    refused(str(gpt2), [ckpt, "--preset", "hf-gpt2"], "hparams.json", "n_head must be a positive")
    (gpt2 / "hparams.json").write_text(json.dumps({**gpt2_release.HPARAMS, "n_head": 3}))
    refused(str(gpt2), [ckpt, "--preset", "hf-gpt2"], "n_embd 16 is not a multiple of n_head 3")

    albert = tmp_path / "albert"
    albert.mkdir()
    tfckpt.save(albert_release.weights("pretraining"), str(albert / "model.ckpt"))
    (albert / "albert_config.json").write_text(json.dumps(albert_release.CONFIGS["pretraining"]))
    ckpt = str(albert / "model.ckpt")
    refused(
        str(albert),
        [ckpt, "--preset", "hf-albert", "--config-value", "num_attention_heads=0"],
        "albert_config.json",
        "num_attention_heads must be a positive integer, not 0",
    )
    refused(
        str(albert),
        [ckpt, "--preset", "hf-albert", "--config-value", "initializer_range=1e999"],
        "--config-value initializer_range: 1e999 is not a finite number",
    )

    electra = tmp_path / "electra"
    electra.mkdir()
    tfckpt.save(electra_release.weights(), str(electra / "model.ckpt"))
    ckpt = str(electra / "model.ckpt")
    for value, message in [
        ("num_attention_heads=0", "num_attention_heads must be a positive integer, not 0"),
        ("hidden_dropout_prob=7", "hidden_dropout_prob must be a rate from 0 to 1, not 7"),
    ]:
        refused(str(electra), [ckpt, "--preset", "hf-electra", "--config-value", value], message)

    t5 = tmp_path / "t5"
    t5.mkdir()
    tfckpt.save(t5_release.weights("t5.1.1"), str(t5 / "model.ckpt"))
    # No heads: the attention bias [heads, buckets] of shape [0, 32] (once a division by 0).
    headless = dict(t5_release.weights("t5.1.1"))
    for name in [n for n in headless if n.endswith("relative_attention_bias")]:
        headless[name] = headless[name][:0]
    tfckpt.save(headless, str(t5 / "headless.ckpt"))
    (t5 / "operative_config.gin").write_text(t5_release.gin_config("t5.1.1"))
    refused(
        str(t5),
        [str(t5 / "headless.ckpt"), "--preset", "hf-t5"],
        "relative_attention_bias.weight has the shape [32, 0]: no size may be 0",
    )
    gin = t5_release.gin_config("t5.1.1") + "\ndropout_rate = 1e999\n"  # a float: infinity
    (t5 / "operative_config.gin").write_text(gin)
    refused(
        str(t5),
        [str(t5 / "model.ckpt"), "--preset", "hf-t5"],
        "operative_config.gin",
        "dropout_rate is inf: JSON holds finite numbers only",
    )


def test_a_written_config_holds_no_nan_and_is_checked_by_its_class():
    """The checks themselves, on what a translator could hand over from Python."""
    with pytest.raises(tfckpt.CheckpointError, match="is nan: JSON holds finite numbers only"):
        config_json({"model_type": "bert", "task": {"scores": [1.0, float("nan")]}})
    nested: dict = {}
    inner = nested
    for _ in range(10_000):  # deeper than json.dumps could recurse
        inner["x"] = inner = {}
    with pytest.raises(tfckpt.CheckpointError, match="nested deeper than 32"):
        config_json({"model_type": "bert", "deep": nested})
    data = config_json({"model_type": "t5", "d_model": 8, "layer_norm_epsilon": 1})
    assert json.loads(data)["layer_norm_epsilon"] == 1.0  # T5Config's is a float
    with pytest.raises(tfckpt.CheckpointError, match="d_kv must be a positive integer, not True"):
        config_json({"model_type": "t5", "d_kv": True})
    with pytest.raises(Refused, match="Infinity"):
        parse_json("Infinity")
    assert config_values(["a=[1, 2]", "b=gelu", "c=0.5"]) == {"a": [1, 2], "b": "gelu", "c": 0.5}


def test_the_verification_loads_the_written_config_with_transformers(bert_dir, tmp_path):
    out = tmp_path / "hf"
    sm = export_preset(os.path.join(bert_dir, "bert_model.ckpt"), str(out), "hf-bert")
    version = __import__("transformers").__version__
    assert (
        f"config.json: transformers {version} loads it as BertConfig and builds "
        "BertForPreTraining" in sm.warnings
    )
    store = storage_for(str(out), None)
    assert verify_config(store, str(out)).built == "BertForPreTraining"
    config = str(out / "config.json")
    good = json.loads((out / "config.json").read_text())
    # Changed after the write: the same proof now fails, as transformers refuses it.
    edits = [
        ({"num_attention_heads": 3}, "refuses the model of the config: ValueError: The hidden"),
        ({"hidden_size": "16"}, "refuses the config: StrictDataclassFieldValidationError"),
    ]
    ckpt = os.path.join(bert_dir, "bert_model.ckpt")
    rc, stdout, stderr = in_process("verify", ckpt, "--against", out, "--preset", "hf-bert")
    assert rc == 0 and stdout.startswith("ok: "), (stdout, stderr)
    assert "config.json: transformers" in stderr
    for change, message in edits:
        (out / "config.json").write_text(json.dumps({**good, **change}))
        with pytest.raises(tfckpt.CheckpointError, match=message) as e:
            verify_config(store, str(out))
        assert e.value.path == config and "\n" not in str(e.value)
        # tfckpt verify --against: every tensor equal, but the directory is not loadable.
        rc, stdout, stderr = in_process("verify", ckpt, "--against", out, "--preset", "hf-bert")
        assert rc == 1 and not stdout.startswith("ok: ") and "transformers refuses" in stderr
    (out / "config.json").write_text(json.dumps({**good, "hidden_dropout_prob": float("nan")}))
    with pytest.raises(tfckpt.CheckpointError, match="NaN is not a number JSON has"):
        verify_config(store, str(out))
