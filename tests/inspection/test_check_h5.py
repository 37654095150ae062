"""``tfckpt check --against`` a Keras HDF5 file, and against a template with an
optimizer's slots, predicts what tf.keras does.

tests/check_h5_files.py writes every target and checkpoint with tf.keras, in a process
of its own, and records for each pair whether the real restore succeeded
(``load_weights``, ``tf.train.Checkpoint(...).read`` then ``assert_consumed`` /
``assert_existing_objects_matched`` / ``expect_partial``); here ``tfckpt check`` runs on
each pair and its exit status must say the same. The table holds both outcomes of each
kind of difference (a layer missing, one more, another width, another dtype, a slot of
another shape, slots absent).
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("tf_keras")
pytest.importorskip("h5py")

from cli_helpers import assert_cli_error, in_process, run_role  # noqa: E402

import tfckpt  # noqa: E402

FLAGS = {
    "default": [],
    "existing": [],
    "consumed": ["--assert-consumed"],
    "partial": ["--allow-missing"],
}


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    out = tmp_path_factory.mktemp("check_h5")
    run_role("check_h5_files.py", "write", out)
    return json.loads((out / "table.json").read_text())


def _check(ckpt, target, mode) -> tuple[int, dict]:
    rc, out, err = in_process("check", ckpt, "--against", target, *FLAGS[mode], "--json")
    assert rc in (0, 1) and not err, (rc, err)
    data = json.loads(out)
    assert data["ok"] is (rc == 0)
    return rc, data


def _predicted(table, kind: str) -> list:
    wrong = []
    rows = [r for r in table if r[0] == kind]
    for _, target, case, ckpt, mode, ok, message in rows:
        rc, data = _check(ckpt, target, mode)
        if (rc == 0) != ok:
            wrong.append((target, case, mode, ok, message, data["findings"]))
    assert rows and not wrong, wrong
    return rows


def _outcomes(rows) -> dict:
    return {(t.rsplit("/", 1)[-1], c, m): ok for _, t, c, _, m, ok, _ in rows}


def test_check_against_a_keras_h5_predicts_load_weights(table):
    rows = _predicted(table, "h5")
    outcomes = _outcomes(rows)
    # Both outcomes of each difference are in the table.
    assert outcomes["w.h5", "same-h5", "default"] and outcomes["m.h5", "same-obj", "consumed"]
    assert not outcomes["w.h5", "extra-h5", "default"]  # load_weights refuses another count
    assert outcomes["w.h5", "same-m5", "default"] and not outcomes["m.h5", "shape-m5", "default"]
    assert outcomes["w.h5", "extra-tf", "existing"] and not outcomes["w.h5", "extra-tf", "consumed"]
    assert not outcomes["w.h5", "missing-tf", "existing"]
    assert outcomes["w.h5", "missing-obj", "partial"]
    assert outcomes["w.h5", "dtype-h5", "default"]  # numpy casts
    assert not outcomes["w.h5", "dtype-tf", "partial"]  # TensorFlow does not
    assert not outcomes["m.h5", "shape-obj", "partial"]


def test_check_against_hugging_faces_tf_model_h5(table):
    rows = _predicted(table, "hf")
    assert [ok for *_, ok, _ in rows] == [True] * 3 + [False] * 3
    assert "tf_model.h5" in rows[0][1]


def test_check_against_a_template_with_optimizer_slots(table):
    rows = _predicted(table, "slots")
    outcomes = _outcomes(rows)
    for opt in ("adam", "legacy-adam"):
        assert all(outcomes["ckpt", f"{opt}-with-slots", m] for m in FLAGS if m != "default")
        assert not outcomes["ckpt", f"{opt}-no-slots", "existing"]
        assert outcomes["ckpt", f"{opt}-no-slots", "partial"]
        assert not outcomes["ckpt", f"{opt}-slot-shape", "partial"]


def _findings(data: dict, fails: bool = True) -> list[tuple[str, str | None]]:
    return [(f["kind"], f["tensor"]) for f in data["findings"] if f["fails"] is fails]


def test_the_report_names_what_differs(table):
    pairs = {(r[0], r[1].rsplit("/", 1)[-1], r[2]): (r[1], r[3]) for r in table}
    target, ckpt = pairs["h5", "w.h5", "extra-h5"]
    rc, data = _check(ckpt, target, "default")
    assert rc == 1 and "Keras HDF5" in data["target"]
    assert _findings(data) == [
        ("missing", None),
        ("unused", "extra/kernel"),
        ("unused", "extra/bias"),
    ]
    assert "lists 4 layers with weights, the target 3" in data["findings"][0]["detail"]
    # load_weights of an .h5 has no partial mode: the count fails whatever the flags.
    assert _check(ckpt, target, "partial")[0] == 1
    assert _check(pairs["h5", "w.h5", "missing-h5"][1], target, "partial")[0] == 1
    target, ckpt = pairs["h5", "w.h5", "dtype-h5"]
    rc, data = _check(ckpt, target, "default")
    assert rc == 0 and _findings(data, fails=False) == [
        ("dtype", "d1/kernel"),
        ("dtype", "d1/bias"),
    ]
    assert data["findings"][0]["castable"] is True
    target, ckpt = pairs["h5", "w.h5", "dtype-tf"]
    rc, data = _check(ckpt, target, "partial")
    assert _findings(data) == [
        ("dtype", "layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE"),
        ("dtype", "layer_with_weights-0/bias/.ATTRIBUTES/VARIABLE_VALUE"),
    ]
    target, ckpt = pairs["slots", "ckpt", "adam-slot-shape"]
    rc, data = _check(ckpt, target, "existing")
    (shape,) = _findings(data)
    assert (
        shape[0] == "shape" and "[5, 3] in the checkpoint, [4, 3]" in data["findings"][0]["detail"]
    )


def test_from_python_and_errors(table, tmp_path):
    target = next(r[1] for r in table if r[0] == "h5" and r[1].endswith("w.h5"))
    same = next(r[3] for r in table if r[2] == "same-h5")
    result = tfckpt.check(same, against=target)
    assert result.ok and result.wanted == 8
    tf1 = tfckpt.save(
        {"d1/kernel": __import__("numpy").zeros((4, 3), "float32")}, str(tmp_path / "tf1")
    )
    assert_cli_error(in_process("check", tf1, "--against", target), "TF1 checkpoint")
