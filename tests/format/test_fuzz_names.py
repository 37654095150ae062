"""Structured names: whatever bytes TensorFlow takes as a tensor name, tfckpt takes too.

Seeded generators build names of every awkward kind — control characters, escape
sequences, bidi overrides, bytes that are not UTF-8, a leading NUL, keys that look like
the slice keys of partitioned tensors, separators, prefixes of one another, very long —
and TensorFlow saves them (some partitioned) with ``SaveV2``. Each checkpoint is then
listed, read, dumped, verified, rewritten and printed by tfckpt: names and values must
equal TensorFlow's, TensorFlow must read back what tfckpt writes, and no command may
print a control character or a traceback.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from cli_helpers import assert_terminal_safe, run  # noqa: E402

import tfckpt  # noqa: E402
from tfckpt.format import orderedcode  # noqa: E402

SEEDS = range(6)
NAMES_PER_CHECKPOINT = 24


def _random_bytes(rng: random.Random, n: int) -> bytes:
    return bytes(rng.randrange(256) for _ in range(n))


def _name(rng: random.Random) -> bytes:
    kind = rng.randrange(9)
    if kind == 0:  # control characters and terminal escapes among text
        return rng.choice(
            [
                b"\x1b[2J",
                b"\x1b]0;t\x07",
                b"\x1b]52;c;eA==\x07",
                b"\n",
                b"\r",
                b"\x7f",
                b"\xc2\x9b",
                b"\t",
            ]
        ) + b"w" * rng.randrange(1, 4)
    if kind == 1:  # bidi overrides and isolates, zero-width characters
        return "x\u202e\u2066\u200by".encode() + _random_bytes(rng, rng.randrange(3))
    if kind == 2:  # bytes that are not UTF-8
        return b"\xff" + _random_bytes(rng, rng.randrange(1, 8))
    if kind == 3:  # a leading NUL
        return b"\x00" + _random_bytes(rng, rng.randrange(0, 6)).replace(b"\x00", b"n")
    if kind == 4:  # the slice key of a tensor that is not partitioned here
        return orderedcode.encode_slice_key(f"ghost{rng.randrange(99)}", [(0, 1)])
    if kind == 5:  # separators and path-like names
        return rng.choice([b"../../etc/passwd", b"a//b", b"/", b".ATTRIBUTES/x", b"a/./b"])
    if kind == 6:  # long
        return b"L" * rng.randrange(1000, 5000) + _random_bytes(rng, 2)
    if kind == 7:  # any bytes at all
        return _random_bytes(rng, rng.randrange(1, 12))
    return b"scope/" + _random_bytes(rng, rng.randrange(1, 4))  # shares a prefix


def _names(seed: int) -> list[bytes]:
    rng = random.Random(seed)
    names: set[bytes] = set()
    while len(names) < NAMES_PER_CHECKPOINT:
        name = _name(rng)
        names.add(name)
        if rng.random() < 0.2:  # a name and a longer one starting with it
            names.add(name + b"/more")
    return sorted(names)


@pytest.fixture(scope="module", params=SEEDS, ids=[f"seed{s}" for s in SEEDS])
def named(request, tmp_path_factory):
    """A SaveV2 checkpoint of generated names, every fourth one partitioned in two."""
    names = _names(request.param)
    prefix = str(tmp_path_factory.mktemp(f"names{request.param}") / "model.ckpt")
    rng = np.random.default_rng(request.param)
    values, keys, specs, tensors = {}, [], [], []
    for i, name in enumerate(names):
        values[name] = rng.standard_normal(4).astype(np.float32)
        if i % 4 == 0:
            keys += [name, name]
            specs += ["4 0,1", "4 1,3"]
            tensors += [values[name][:1], values[name][1:]]
        else:
            keys.append(name)
            specs.append("")
            tensors.append(values[name])
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=tf.constant(keys),
        shape_and_slices=specs,
        tensors=[tf.constant(t) for t in tensors],
    )
    return prefix, values


def _as_bytes(name: str) -> bytes:
    return orderedcode.encode_name(name)


def test_names_and_values_equal_tensorflows(named):
    prefix, values = named
    reader = tf.train.load_checkpoint(prefix)
    with tfckpt.open(prefix) as ckpt:
        assert sorted(_as_bytes(k) for k in ckpt.keys()) == sorted(values)
        for name in ckpt.keys():
            ours = ckpt[name]
            np.testing.assert_array_equal(ours, values[_as_bytes(name)])
            np.testing.assert_array_equal(ours, reader.get_tensor(_as_bytes(name)))


def test_every_command_prints_safely(named, tmp_path):
    prefix, values = named
    commands = [
        ["dump", prefix],
        ["dump", prefix, "--tensor", "."],
        ["stats", prefix],
        ["verify", prefix],
        ["diff", prefix, prefix],
        ["convert", prefix, f"{tmp_path}/plan/", "--dtype", "float16", "--dry-run"],
    ]
    for argv in commands:
        proc = run(*argv)
        assert proc.returncode == 0, (argv, proc.stderr)
        assert_terminal_safe(proc, argv)
    listed = json.loads(run("dump", prefix, "--json").stdout)
    assert sorted(_as_bytes(t["name"]) for t in listed["tensors"]) == sorted(values)


def test_rewrites_read_back_by_tensorflow(named, tmp_path):
    prefix, values = named
    out = f"{tmp_path}/f64/model.ckpt"
    proc = run("convert", prefix, out, "--dtype", "float64")
    assert proc.returncode == 0, proc.stderr
    assert_terminal_safe(proc, "convert")
    reader = tf.train.load_checkpoint(out)
    for name, value in values.items():
        np.testing.assert_array_equal(reader.get_tensor(name), value.astype(np.float64))
    assert run("verify", out).returncode == 0
