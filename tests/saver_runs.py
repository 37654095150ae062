"""Training runs saved by TF1 ``Saver``s, for the tests of what users do with such runs.

- :func:`saver_run`: a ``Saver`` saving after each of ``STEPS`` steps, V1 or V2 files, with
  absolute paths in its state file; a partitioned variable among its variables.
- ``runs``: a V2 and a V1 run of the same steps, and the V2 run's values.
- ``v1_sharded``: a V1 ``Saver(sharded=True)`` run over two CPU devices.

A test module takes the fixtures it uses by name (``from saver_runs import runs``); tests
copy these directories before changing anything in them. Only imported after
``conftest.py`` has quietened TensorFlow's logging.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

STEPS = 3


def saver_run(directory, version) -> list[str]:
    """A TF1 Saver saving after each of STEPS steps (absolute paths in its state file)."""
    v1 = tf.compat.v1
    prefixes = []
    directory.mkdir()
    with tf.Graph().as_default():
        v = v1.get_variable("v", initializer=np.arange(6, dtype=np.float32) / 3)
        emb = v1.get_variable(
            "emb",
            [6, 2],
            initializer=v1.ones_initializer(),
            partitioner=v1.fixed_size_partitioner(2),
        )
        step = v1.train.get_or_create_global_step()
        train = tf.group(
            v.assign(v * 1.5 + 0.25), step.assign_add(1), *[p.assign(p * 3) for p in emb]
        )
        saver = v1.train.Saver(max_to_keep=STEPS, write_version=version)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for i in range(1, STEPS + 1):
                sess.run(train)
                prefixes.append(saver.save(sess, str(directory / "model.ckpt"), global_step=i))
    return prefixes


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A V2 and a V1 Saver run of the same steps, and the V2 run's values."""
    root = tmp_path_factory.mktemp("saver_runs")
    v2 = saver_run(root / "v2", tf.compat.v1.train.SaverDef.V2)
    v1 = saver_run(root / "v1", tf.compat.v1.train.SaverDef.V1)
    values = {p: tf.train.load_checkpoint(p).get_tensor("v") for p in v2}
    return {"root": root, "v2": v2, "v1": v1, "values": values}


@pytest.fixture(scope="module")
def v1_sharded(tmp_path_factory):
    """A TF1 Saver(V1, sharded=True) over two CPU devices: its state file names each
    save by the pattern of its files (model.ckpt-3-?????-of-00002)."""
    v1 = tf.compat.v1
    d = tmp_path_factory.mktemp("v1_sharded")
    saved = []
    with tf.Graph().as_default():
        with tf.device("/cpu:0"):
            a = v1.get_variable("a", initializer=np.arange(3, dtype=np.float32))
        with tf.device("/cpu:1"):
            b = v1.get_variable("b", initializer=np.ones(2, np.float32))
        train = tf.group(a.assign(a * 2 + 1), b.assign(b * 3))
        saver = v1.train.Saver(write_version=v1.train.SaverDef.V1, sharded=True, max_to_keep=3)
        config = v1.ConfigProto(device_count={"CPU": 2})
        with v1.Session(config=config) as sess:
            sess.run(v1.global_variables_initializer())
            for i in range(1, 4):
                sess.run(train)
                saved.append(saver.save(sess, str(d / "model.ckpt"), global_step=i))
    assert saved[-1].endswith("model.ckpt-3-?????-of-00002")
    return str(d), saved
