"""The cycle collector is paused while plans are built and executed (and while a command
of the command line runs), and resumes as it was."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import tfckpt
from tfckpt import cli
from tfckpt.checkpoint.reader import Checkpoint
from tfckpt.rewrite import tasks as engine  # where shard tasks are run


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("many") / "model")
    tfckpt.save({f"s{i // 50}/v{i}": np.full(8, i, np.float32) for i in range(3000)}, prefix)
    return prefix


@pytest.fixture
def collector_seen(monkeypatch):
    """Whether the collector was enabled when the plan read its sources' tables and when
    each shard task ran."""
    seen: dict[str, list[bool]] = {"plan": [], "task": []}
    table, task = Checkpoint.table, engine.run_shard_task

    def spied_table(self, *a, **k):
        seen["plan"].append(gc.isenabled())
        return table(self, *a, **k)

    def spied_task(*a, **k):
        seen["task"].append(gc.isenabled())
        return task(*a, **k)

    monkeypatch.setattr(Checkpoint, "table", spied_table)
    monkeypatch.setattr(engine, "run_shard_task", spied_task)
    return seen


def test_plan_and_execute_pause_the_collector(many, tmp_path, collector_seen):
    assert gc.isenabled()
    p = tfckpt.plan(many, str(tmp_path / "out"), cast="float16")
    assert gc.isenabled()
    tfckpt.execute(p)
    assert gc.isenabled()
    assert collector_seen == {"plan": [False], "task": [False]}
    with tfckpt.open(str(tmp_path / "out")) as out:
        assert len(out) == 3000 and out["s7/v350"].dtype == np.float16


def test_a_command_pauses_the_collector(many, tmp_path, collector_seen):
    assert cli.main(["convert", many, str(tmp_path / "cli"), "--dtype", "float16"]) == 0
    assert collector_seen == {"plan": [False], "task": [False]}
    assert gc.isenabled()


def test_the_collector_resumes_as_it_was(many, tmp_path):
    gc.disable()
    try:
        tfckpt.plan(many, str(tmp_path / "a"), cast="float16")
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(tfckpt.CheckpointError):
        tfckpt.plan(str(tmp_path / "missing"), str(tmp_path / "b"))
    assert gc.isenabled()
