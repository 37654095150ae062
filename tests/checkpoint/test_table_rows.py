"""``Checkpoint.table(names)`` for names in the index's order, a subset, or any order.

Names given in the index's order (a plan of a whole checkpoint, less its object graph)
are read where they are listed, without the index's dict of keys; any other list takes
the general path. Both must describe each tensor exactly as ``info`` does.
"""

from __future__ import annotations

import random

import pytest

import tfckpt


@pytest.mark.parametrize("which", ["tf1_partitioned", "keras_manager", "savev2_slices"])
def test_table_rows_equal_info_for_any_list_of_names(tf_checkpoints, which):
    with tfckpt.open(tf_checkpoints(which).path) as ckpt:
        names = ckpt.keys()
        rng = random.Random(7)
        lists = [
            names,  # all, in order
            names[1:],  # all but the first (a TF2 plan less its object graph)
            names[::2],  # a subset in order
            list(reversed(names)),  # out of order
            rng.sample(names, len(names)),  # shuffled
            names[:1] + names[:1],  # a name twice
        ]
        for wanted in lists:
            table = ckpt.table(wanted)
            assert table.names == wanted
            assert [table.info(i) for i in range(len(wanted))] == [ckpt.info(n) for n in wanted]
        with pytest.raises(tfckpt.CheckpointError, match="no such tensor"):
            ckpt.table(names[:1] + ["no/such/tensor"])
