"""Rules files (``--rules F.toml``, ``load_rules``) and ``name_map`` rules.

A TOML file bundles selection, names, value transforms and dtypes; ``[[map]]`` rules
name whole source names, and every kept tensor must be named by one unless
``allow_unmapped`` (then it is left out).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import tfckpt
from tfckpt.rewrite.rulesfile import load_rules

RNG = np.random.default_rng(3)
SOURCE = {
    "bert/encoder/layer_0/attention/self/query/kernel": RNG.standard_normal((8, 8)).astype(
        np.float32
    ),
    "bert/encoder/layer_0/attention/self/query/bias": RNG.standard_normal(8).astype(np.float32),
    "bert/encoder/layer_1/attention/self/key/kernel": RNG.standard_normal((8, 8)).astype(
        np.float32
    ),
    "bert/embeddings/LayerNorm/gamma": RNG.standard_normal(8).astype(np.float32),
    "bert/encoder/layer_0/attention/self/query/kernel/adam_m": np.zeros((8, 8), np.float32),
    "global_step": np.array(3, np.int64),
}
RULES = r"""
description = "a BERT-like test model"
exclude = ["adam_[mv]$", "^global_step$"]
cast = "float16"
keep_dtype = ["LayerNorm"]

[rename_exact]
"bert/embeddings/LayerNorm/gamma" = "bert.embeddings.LayerNorm.weight"

[[map]]
match = 'bert/encoder/layer_(\d+)/attention/self/(query|key|value)/kernel'
to = 'bert.encoder.layer.\1.attention.self.\2.weight'

[[map]]
match = 'bert/encoder/layer_(\d+)/attention/self/(query|key|value)/bias'
to = 'bert.encoder.layer.\1.attention.self.\2.bias'

[[permute]]
match = '(query|key|value)\.weight$'
axes = [1, 0]
"""


@pytest.fixture()
def source(tmp_path):
    prefix = str(tmp_path / "src" / "model")
    tfckpt.save(SOURCE, prefix)
    return prefix


def write(tmp_path, text: str, name: str = "rules.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def read_all(prefix) -> dict[str, np.ndarray]:
    with tfckpt.open(prefix) as ckpt:
        return {n: np.array(ckpt[n]) for n in ckpt.keys()}


def test_a_rules_file_names_transforms_and_casts(source, tmp_path):
    dst = str(tmp_path / "out" / "model")
    tfckpt.select(source, dst, **load_rules(write(tmp_path, RULES)))
    got = read_all(dst)
    q = SOURCE["bert/encoder/layer_0/attention/self/query/kernel"]
    assert sorted(got) == sorted(
        [
            "bert.embeddings.LayerNorm.weight",
            "bert.encoder.layer.0.attention.self.query.bias",
            "bert.encoder.layer.0.attention.self.query.weight",
            "bert.encoder.layer.1.attention.self.key.weight",
        ]
    )
    assert np.array_equal(
        got["bert.encoder.layer.0.attention.self.query.weight"], q.T.astype(np.float16)
    )
    assert got["bert.embeddings.LayerNorm.weight"].dtype == np.float32  # kept


def test_an_unmapped_tensor_is_an_error_listing_every_one(source, tmp_path):
    rules = load_rules(write(tmp_path, RULES.replace('"^global_step$"', '"^nothing$"')))
    rules["exclude"] = ["^nothing$"]  # the Adam slot and global_step are kept now
    rules["allow_unmatched"] = True  # ^nothing$ matches nothing, as meant
    with pytest.raises(tfckpt.CheckpointError) as e:
        tfckpt.select(source, str(tmp_path / "out"), **rules)
    message = str(e.value)
    assert "2 tensor(s) no name_map rule names" in message
    assert "global_step" in message and "query/kernel/adam_m" in message
    p = tfckpt.plan(source, str(tmp_path / "out"), allow_unmapped=True, **rules)
    assert {n for _, n, why in p.dropped if why == "no name_map rule"} == {
        "global_step",
        "bert/encoder/layer_0/attention/self/query/kernel/adam_m",
    }


@pytest.mark.parametrize(
    "text, message",
    [
        ("includ = ['x']", "unknown key 'includ'"),
        ("exclude = 3", "exclude must be a string or a list of strings"),
        ("[[map]]\nmatch = 'a'", "must have exactly the keys match and to"),
        ("[[permute]]\nmatch = 'a'\naxes = 'x'", "axes a list of whole numbers"),
        ("cast = 16", "cast must be a str"),
        ("a = [", "not a TOML rules file"),
    ],
)
def test_a_bad_rules_file_is_an_error_naming_it(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(tfckpt.CheckpointError, match=message) as e:
        load_rules(path)
    assert e.value.path == path


def test_the_command_line_takes_a_rules_file(source, tmp_path):
    path = write(tmp_path, RULES)
    dst = str(tmp_path / "cli" / "model")
    run = subprocess.run(
        [sys.executable, "-m", "tfckpt", "select", source, dst, "--rules", path],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert "bert.encoder.layer.1.attention.self.key.weight" in read_all(dst)
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfckpt",
            "select",
            source,
            dst + "2",
            "--rules",
            path,
            "--include",
            "kernel",
        ],
        capture_output=True,
        text=True,
    )
    # --include keeps only kernels: the LayerNorm rename_exact has nothing to name, fine
    assert bad.returncode == 0, bad.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "tfckpt", "select", source, dst + "3", "--rules", path + "x"],
        capture_output=True,
        text=True,
    )
    assert missing.returncode != 0 and len(missing.stderr.splitlines()) == 1
    assert "cannot read the rules file" in missing.stderr
