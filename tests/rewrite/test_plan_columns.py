"""A plan's tensors, a shard task's items and the cast counts kept as columns.

A plan of 200 000 small tensors must not hold objects per tensor (see
benchmarks/paths.py): PlannedTensors keeps the rows as columns and PlannedTensor is a
row of it, read and written through; TaskItems makes a shard task's items from the
plan's rows when they are read and carries its own rows when pickled; CastCountTable
holds the counts; TensorTable's int columns are Ints. These tests pin the behaviour
the rest of the engine relies on: the same fields as before, writes that land in the
plan, and pickled tasks that stream the same items.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import tfckpt
from tfckpt.format.bundle import Ints, TensorInfo, TensorTable
from tfckpt.rewrite.cast import CastCounts, CastCountTable, check_overflow
from tfckpt.rewrite.plans import PlannedTensor, PlannedTensors
from tfckpt.rewrite.tasks import run_shard_task, shard_tasks


def _info(name: str, shard: int | None = 0, offset: int | None = 0) -> TensorInfo:
    return TensorInfo(name, "float32", (2, 3), 24, shard, offset, None if shard is None else 7)


def test_a_planned_tensor_alone_has_every_field_and_its_defaults():
    pt = PlannedTensor(1, "a", "b", _info("a"), "float16", 12, dtype_by="cast")
    assert (pt.source, pt.name, pt.new_name, pt.new_dtype, pt.bytes_out) == (
        1,
        "a",
        "b",
        "float16",
        12,
    )
    assert pt.dtype_by == "cast" and pt.info == _info("a")
    assert (pt.restored_whole, pt.averaged, pt.sliced, pt.perm, pt.shape, pt.parts, pt.edit) == (
        False,
        False,
        None,
        None,
        None,
        None,
        None,
    )
    assert pt.renamed and pt.cast and pt.out_shape == (2, 3)
    with pytest.raises(TypeError, match="unknown planned tensor fields: colour"):
        PlannedTensor(0, "a", "a", _info("a"), "float32", 24, colour="red")


def test_a_row_is_read_and_written_through_its_table():
    table = PlannedTensors.of(
        [
            PlannedTensor(0, "a", "a", _info("a"), "float32", 24),
            PlannedTensor(0, "b", "b", _info("b", offset=24), "float32", 24, perm=(1, 0)),
        ]
    )
    assert len(table) == 2 and [t.name for t in table] == ["a", "b"]
    assert table.extras == {1: {"perm": (1, 0)}}
    row = table[0]
    row.shape = (3, 2)
    row.new_name = "A"
    row.info = _info("a", offset=48)
    again = table[0]
    assert (again.shape, again.new_name, again.info.offset) == ((3, 2), "A", 48)
    assert table.new_name == ["A", "b"] and table.infos.offsets == [48, 24]
    assert table[-1].perm == (1, 0) and table[0:1] == [table[0]]
    with pytest.raises(IndexError):
        table[2]


def test_take_reorders_rows_with_their_extras_and_replaced_makes_a_new_row():
    table = PlannedTensors.of(
        [
            PlannedTensor(0, "a", "a", _info("a"), "float32", 24, edit="E"),
            PlannedTensor(1, "b", "c", _info(None, None, None), "float16", 12),
        ]
    )
    swapped = table.take([1, 0])
    assert [t.name for t in swapped] == ["b", "a"]
    assert swapped.extras == {1: {"edit": "E"}}
    assert swapped[0].info.shard is None and swapped[1].info.shard == 0
    copy = table[1].replaced(new_name="d", sliced=True)
    assert (copy.new_name, copy.sliced, table[1].new_name, table[1].sliced) == (
        "d",
        True,
        "c",
        None,
    )
    assert copy == PlannedTensor(1, "b", "d", _info(None, None, None), "float16", 12, sliced=True)


def test_ints_read_like_a_list_of_ints_and_none():
    column = Ints([5, None, 1 << 62])
    assert list(column) == [5, None, 1 << 62] and column[1] is None and None in column
    column.append(None)
    column[0] = None
    assert column == [None, None, 1 << 62, None] and sum(Ints([2, 3])) == 5
    assert pickle.loads(pickle.dumps(column)) == column
    table = TensorTable.of([_info("a"), _info("b", None, None)])
    assert isinstance(table.offsets, Ints) and table.info(1) == _info("b", None, None)
    assert table.take([1, 0]).names == ["b", "a"] and table.take([1]).crc32c == [None]


def test_cast_count_table_adds_runs_and_merges_shards():
    t = CastCountTable()
    t.add("a", (1, 0, 2, 10))
    t.add("a", (0, 1, 0, 5))  # the next piece of the same tensor
    t.extend(["b", "c"], np.array([[0, 0, 0, 4], [0, 3, 0, 4]]))
    assert t["a"] == CastCounts(1, 1, 2, 15) and dict(t) == {
        "a": CastCounts(1, 1, 2, 15),
        "b": CastCounts(0, 0, 0, 4),
        "c": CastCounts(0, 3, 0, 4),
    }
    assert t.nonzero("to_zero") == {"a": 1, "c": 3} and t.nonzero("overflow") == {"a": 1}
    # Only rows with a count not zero keep their counts; the others their elements.
    np.testing.assert_array_equal(t.array(), [[1, 1, 2, 15], [0, 0, 0, 4], [0, 3, 0, 4]])
    d = CastCountTable()
    d.extend(["x", "y"], np.array([[0, 0, 0, 3], [0, 0, 0, 2]]))
    d.add("y", (2, 0, 0, 1))  # a later piece of y overflows
    d.add("y", (1, 0, 1, 1))
    assert dict(d) == {"x": CastCounts(0, 0, 0, 3), "y": CastCounts(3, 0, 1, 4)}
    assert t.merged([d]).nonzero("overflow") == {"a": 1, "y": 3}
    other = CastCountTable()
    other.add("a", (0, 0, 1, 1))  # the slices of "a" written to another shard
    merged = t.merged([other])
    assert merged["a"] == CastCounts(1, 1, 3, 16) and len(merged) == 3
    assert t.merged([]) is t
    assert dict(pickle.loads(pickle.dumps(merged))) == dict(merged)
    with pytest.raises(tfckpt.CastOverflowError):
        check_overflow(merged, "error", "out")


def test_a_pickled_task_streams_what_it_streams_here(tf_checkpoints, tmp_path):
    """A task pickled for an executor elsewhere carries its own rows of the plan, and its
    items and its shard's bytes are those of the task run where the plan was made."""
    src = tf_checkpoints("tf1_partitioned").path
    p = tfckpt.plan(src, tmp_path / "out" / "model", cast="float16")
    tasks = shard_tasks(p)
    for task in tasks:
        copy = pickle.loads(pickle.dumps(task))
        assert list(copy.items) == list(task.items)
        assert copy.items.bytes_in == task.items.bytes_in == task.bytes_in
        assert copy.items.sources() == task.items.sources()
        here = run_shard_task(task)
        data = open(task.path, "rb").read()
        there = run_shard_task(copy)
        assert open(copy.path, "rb").read() == data
        assert {k: v.SerializeToString() for k, v in here.entries.items()} == {
            k: v.SerializeToString() for k, v in there.entries.items()
        }
        assert dict(here.counts) == dict(there.counts)


def test_a_pickled_average_task_streams_what_it_streams_here(tf_checkpoints, tmp_path):
    """An average's rows carry their weights: pickled, its tasks read every source for
    the means (and the newest alone for copies) and write the same bytes."""
    from tfckpt.rewrite.average import plan_average

    src = tf_checkpoints("tf1_partitioned").path
    p = plan_average([src, src], tmp_path / "avg" / "model", weights=[1, 3], cast="float16")
    try:
        tasks = shard_tasks(p)
        assert any(item.weights for task in tasks for item in task.items)
        for task in tasks:
            copy = pickle.loads(pickle.dumps(task))
            assert list(copy.items) == list(task.items)
            assert copy.items.bytes_in == task.items.bytes_in
            assert copy.items.sources() == task.items.sources() == {0, 1}
            run_shard_task(task)
            data = open(task.path, "rb").read()
            run_shard_task(copy)
            assert open(copy.path, "rb").read() == data
    finally:
        p.close()
