"""``verify SRC --against OUT``: a conversion checked bit for bit, and every way it can be wrong.

Sources are written by TensorFlow (``tf.raw_ops.SaveV2``, the BERT release's names);
outputs by tfckpt, then damaged with the real ``safetensors`` package or by flipping
one bit of the file, and checked again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tfckpt
from tfckpt.interop.presets import export_preset
from tfckpt.interop.proof import verify_against

tf = pytest.importorskip("tensorflow")
st = pytest.importorskip("safetensors.numpy")

import bert_release  # noqa: E402

QUERY = "bert.encoder.layer.0.attention.self.query.weight"  # [16, 16]: a transpose keeps it


@pytest.fixture()
def source(tmp_path):
    """A run_classifier checkpoint TensorFlow wrote, with its config beside it."""
    directory = tmp_path / "src"
    directory.mkdir()
    values = bert_release.weights("classifier")
    values["vocab"] = np.array([b"[PAD]", b"[CLS]"], dtype=object)
    tf.raw_ops.SaveV2(
        prefix=str(directory / "bert_model.ckpt"),
        tensor_names=list(values),
        shape_and_slices=[""] * len(values),
        tensors=[tf.constant(v) for v in values.values()],
    )
    (directory / "bert_config.json").write_text(json.dumps(bert_release.CONFIG))
    return str(directory / "bert_model.ckpt")


def preset_export(source, out_dir, **kw):
    # The vocabulary no preset rule maps is left out, and listed.
    return export_preset(source, out_dir, "hf-bert", allow_unmapped=True, **kw)


def test_a_preset_export_is_proved_and_every_source_tensor_accounted_for(source, tmp_path):
    out_dir = str(tmp_path / "hf")
    sm = preset_export(source, out_dir, max_shard_bytes=20_000)
    assert any(w.startswith("verified: ") for w in sm.warnings)
    proof = verify_against(source, out_dir, preset="hf-bert", allow_unmapped=True)
    assert proof.mismatched == [] and proof.missing == [] and proof.unexpected == []
    assert proof.checked == len(sm.tensors)
    # allowed to go unmapped is still not accounted for: the proof says so
    assert proof.unaccounted == [("vocab", "no name_map rule")] and not proof.ok
    left = dict(proof.left_out)
    assert left["global_step"] == "excluded"
    assert all(left[n] == "excluded" for n in bert_release.weights("classifier") if "adam" in n)


def _flip_one_bit(path: str, tensor: str) -> None:
    data = bytearray(open(path, "rb").read())
    n = int.from_bytes(data[:8], "little")
    start, _ = json.loads(data[8 : 8 + n])[tensor]["data_offsets"]
    data[8 + n + start + 5] ^= 0x10
    with open(path, "wb") as f:
        f.write(data)


def test_a_flipped_bit_a_missing_tensor_an_extra_one_and_a_wrong_transpose(source, tmp_path):
    out_dir = tmp_path / "hf"
    preset_export(source, str(out_dir))
    path = str(out_dir / "model.safetensors")
    _flip_one_bit(path, QUERY)
    proof = verify_against(source, str(out_dir), preset="hf-bert", exclude=["vocab"])
    assert [n for n, _ in proof.mismatched] == [QUERY]
    assert "element 1 is" in proof.mismatched[0][1]  # byte 5 of float32 element 1
    assert proof.unaccounted == [] and proof.checked > 10
    tensors = st.load_file(path)
    query = tensors.pop(QUERY)
    tensors["extra.weight"] = np.zeros(3, np.float32)
    tensors["bert.encoder.layer.0.attention.self.key.weight"] = np.ascontiguousarray(
        tensors["bert.encoder.layer.0.attention.self.key.weight"].T  # as without --permute
    )
    tensors["classifier.weight"] = tensors["classifier.weight"].astype(np.float16)
    st.save_file(tensors, path)
    proof = verify_against(source, str(out_dir), preset="hf-bert", exclude=["vocab"])
    assert proof.missing == [QUERY] and proof.unexpected == ["extra.weight"]
    assert ("bert/encoder/layer_0/attention/self/query/kernel", f"{QUERY} missing") in (
        proof.unaccounted
    )
    how = dict(proof.mismatched)
    assert "element 1 is" in how["bert.encoder.layer.0.attention.self.key.weight"]
    assert how["classifier.weight"] == "dtype float16, expected float32"
    assert query.shape == (16, 16) and not proof.ok


def test_checkpoints_and_npz_with_casts_and_value_transforms(source, tmp_path):
    changes = dict(
        cast="float16",
        exclude=["adam", "vocab"],
        split=[(r"(.*)/query/kernel$", 1, [r"\1/query/a", r"\1/query/b"])],
        permute=[(r"query/(a|b)$", (1, 0))],
        chunk_bytes=4096,  # tiles
    )
    dst = str(tmp_path / "fp16" / "model")
    tfckpt.convert(
        source, dst, **{k: v for k, v in changes.items() if k != "cast"}, dtype="float16"
    )
    proof = verify_against(source, dst, **changes)
    assert proof.ok and proof.checked == len(tfckpt.open(dst).keys())
    wrong = verify_against(source, dst, **{**changes, "permute": []})
    assert {n for n, _ in wrong.mismatched} == {
        f"bert/encoder/layer_{i}/attention/self/query/{p}" for i in range(2) for p in "ab"
    }
    assert all("shape [8, 16], expected [16, 8]" in h for _, h in wrong.mismatched)
    assert not verify_against(source, dst, exclude=["adam", "vocab"]).ok  # not cast
    npz = str(tmp_path / "w.npz")
    tfckpt.export(source, npz, **changes)
    assert verify_against(source, npz, **changes).ok


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tfckpt", *args], capture_output=True, text=True)


def test_the_command_line(source, tmp_path):
    out_dir = str(tmp_path / "hf")
    made = run("export", source, out_dir, "--preset", "auto", "--allow-unmapped")
    assert made.returncode == 0, made.stderr
    assert "verified: " in made.stderr and "tensors equal the source's bit for bit" in made.stderr
    skipped = run(
        "export", source, out_dir + "2", "--preset", "auto", "--allow-unmapped", "--no-verify"
    )
    assert skipped.returncode == 0 and "verified" not in skipped.stderr
    good = run("verify", source, "--against", out_dir, "--preset", "hf-bert", "--exclude", "vocab")
    assert good.returncode == 0, good.stderr
    assert good.stdout.startswith(f"ok: {os.path.join(out_dir, 'model.safetensors')}: 41 tensors")
    _flip_one_bit(os.path.join(out_dir, "model.safetensors"), "classifier.bias")
    bad = run("verify", source, "--against", out_dir, "--preset", "hf-bert", "--allow-unmapped")
    assert bad.returncode == 1
    lines = bad.stderr.splitlines()
    assert len(lines) == 2 and "classifier.bias: element 1 is" in lines[0]
    assert "vocab: not in the output (no name_map rule)" in lines[1]
    data = json.loads(
        run(
            "verify",
            source,
            "--against",
            out_dir,
            "--preset",
            "hf-bert",
            "--exclude",
            "vocab",
            "--json",
        ).stdout
    )
    assert data["ok"] is False and data["mismatched"][0]["name"] == "classifier.bias"
    misuse = run("verify", source, "--preset", "hf-bert")
    assert misuse.returncode == 2 and "--preset: for verify --against OUT only" in misuse.stderr
    nothing = run("verify", source, "--against", str(tmp_path))
    assert nothing.returncode == 2 and len(nothing.stderr.splitlines()) == 1


def test_a_checkpoint_against_itself(source):
    """verify writes nothing: a checkpoint checked against itself is what it becomes
    with no transform (each tensor equal), and not with a cast; named by its prefix or its
    ``.index``; the source stays byte for byte."""
    files = {
        n: open(os.path.join(os.path.dirname(source), n), "rb").read()
        for n in os.listdir(os.path.dirname(source))
    }
    proof = verify_against(source, source)
    assert proof.ok and proof.checked == len(tfckpt.open(source).keys())
    for against in (source, source + ".index"):
        same = run("verify", source, "--against", against)
        assert same.returncode == 0 and same.stdout.startswith("ok: "), same.stderr
    cast = run("verify", source, "--against", source, "--dtype", "float16", "--exclude", "vocab")
    assert cast.returncode == 1 and "Traceback" not in cast.stderr, cast.stderr
    assert not verify_against(source, source, cast="float16", exclude=["vocab"]).ok
    assert files == {
        n: open(os.path.join(os.path.dirname(source), n), "rb").read()
        for n in os.listdir(os.path.dirname(source))
    }


def test_a_checkpoint_directory_as_the_output(source, tmp_path):
    """A directory holding a checkpoint (no model files) is checked as its checkpoint, as
    every other command reads a directory; an empty one is one error naming it."""
    out = tmp_path / "fp16"
    tfckpt.convert(source, f"{out}/", dtype="float16", exclude=["adam", "vocab"])
    same = run(
        "verify",
        source,
        "--against",
        f"{out}/",
        "--dtype",
        "float16",
        "--exclude",
        "adam",
        "--exclude",
        "vocab",
    )
    assert same.returncode == 0 and same.stdout.startswith("ok: "), same.stderr
    assert verify_against(source, str(out), cast="float16", exclude=["adam", "vocab"]).ok
    empty = tmp_path / "empty"
    empty.mkdir()
    gone = run("verify", source, "--against", f"{empty}/")
    assert gone.returncode == 2 and len(gone.stderr.strip().splitlines()) == 1, gone.stderr
    assert str(empty) in gone.stderr and "Traceback" not in gone.stderr
