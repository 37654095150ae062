"""The contenders, each run as its own process by ``run.py``: ``python contenders.py NAME ARGS``.

Each prints one JSON line with what it measured in-process (seconds after its
imports, bytes handled), so the harness can report whole-process and in-process
figures side by side.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time


def _report(seconds: float, nbytes: int, **extra) -> None:
    print(json.dumps({"seconds": seconds, "bytes": nbytes, **extra}))


def _check(rc: int, output: str = "") -> None:
    """A failed command is no benchmark figure: end this process with its exit status."""
    if rc != 0:
        sys.stderr.write(output)
        sys.exit(rc)


def _tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    return tf


def tfckpt_convert(src: str, dst: str, dtype: str, *flags: str) -> None:
    from tfckpt import cli

    t = time.perf_counter()
    rc = cli.main(["convert", src, dst, "--dtype", dtype, "--overwrite", *flags])
    seconds = time.perf_counter() - t
    _check(rc)
    _report(seconds, 0)


def tf_convert(src: str, dst: str, dtype: str) -> None:
    """The TensorFlow way: load_checkpoint, tf.cast, SaveV2 (everything in memory)."""
    tf = _tf()
    t = time.perf_counter()
    reader = tf.train.load_checkpoint(src)
    dtypes = reader.get_variable_to_dtype_map()
    names = sorted(dtypes)
    target = tf.as_dtype(dtype)
    tensors = []
    for name in names:
        value = tf.constant(reader.get_tensor(name))
        tensors.append(tf.cast(value, target) if dtypes[name].is_floating else value)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    tf.raw_ops.SaveV2(
        prefix=dst, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors
    )
    _report(time.perf_counter() - t, 0)


def tf1_saver_builder_convert(src: str, dst: str, dtype: str) -> None:
    """The well-known TF1 answer: a float16 graph restored through a casting saver builder."""
    tf = _tf()
    from tensorflow.python.training.saver import BulkSaverBuilder

    v1 = tf.compat.v1
    target = tf.as_dtype(dtype)
    t = time.perf_counter()

    class CastingSaverBuilder(BulkSaverBuilder):
        def bulk_restore(self, filename_tensor, saveables, preferred_shard, restore_sequentially):
            specs = [
                (s.name, s.slice_spec, s.dtype) for saveable in saveables for s in saveable.specs
            ]
            names, slices, dtypes = zip(*specs)
            stored = [tf.float32 if d.base_dtype == target else d for d in dtypes]
            with tf.device("cpu:0"):
                values = tf.raw_ops.RestoreV2(
                    prefix=filename_tensor,
                    tensor_names=names,
                    shape_and_slices=slices,
                    dtypes=stored,
                )
            return [tf.cast(v, d) for v, d in zip(values, dtypes)]

    reader = tf.train.load_checkpoint(src)
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    with tf.Graph().as_default():
        variables = [
            v1.get_variable(
                n, shape=shapes[n], dtype=target if dtypes[n].is_floating else dtypes[n]
            )
            for n in sorted(shapes)
        ]
        loader = v1.train.Saver(variables, builder=CastingSaverBuilder())
        saver = v1.train.Saver(variables)
        with v1.Session() as sess:
            loader.restore(sess, src)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            saver.save(sess, dst, write_meta_graph=False, write_state=False)
    _report(time.perf_counter() - t, 0)


def tfckpt_export(src: str, dst: str, *flags: str) -> None:
    """Stream every tensor to safetensors, in bounded memory."""
    from tfckpt import cli

    t = time.perf_counter()
    rc = cli.main(["export", src, dst, "--overwrite", *flags])
    seconds = time.perf_counter() - t
    _check(rc)
    _report(seconds, os.path.getsize(dst))


def tf_export(src: str, dst: str) -> None:
    """The TensorFlow way: load_checkpoint, every tensor in memory, safetensors' save_file."""
    tf = _tf()
    import numpy as np
    from safetensors.numpy import save_file

    t = time.perf_counter()
    reader = tf.train.load_checkpoint(src)
    names = sorted(reader.get_variable_to_dtype_map())
    # A scalar comes back as a numpy scalar, which save_file does not take.
    tensors = {name: np.asarray(reader.get_tensor(name)) for name in names}
    os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
    save_file(tensors, dst)
    seconds = time.perf_counter() - t
    _report(seconds, os.path.getsize(dst))


def cp_data(src: str, dst: str) -> None:
    """The physical floor: copy the same files."""
    t = time.perf_counter()
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    d = os.path.dirname(src)
    base = os.path.basename(src)
    copied = 0
    for f in os.listdir(d):
        if f.startswith(base + "."):
            shutil.copyfile(os.path.join(d, f), os.path.join(os.path.dirname(dst), f))
            copied += 1
    seconds = time.perf_counter() - t
    _check(0 if copied else 1, f"no files of {src}\n")
    _report(seconds, 0)


def tfckpt_read_all(src: str) -> None:
    import tfckpt

    t = time.perf_counter()
    n = 0
    with tfckpt.open(src) as ckpt:
        for name in ckpt.keys():
            n += ckpt[name].nbytes
    _report(time.perf_counter() - t, n)


def tf_read_all(src: str) -> None:
    tf = _tf()
    t = time.perf_counter()
    reader = tf.train.load_checkpoint(src)
    n = 0
    for name in reader.get_variable_to_shape_map():
        n += reader.get_tensor(name).nbytes
    _report(time.perf_counter() - t, n)


def tfckpt_list(src: str) -> None:
    import io
    from contextlib import redirect_stdout

    from tfckpt import cli

    t = time.perf_counter()
    with redirect_stdout(io.StringIO()) as out:
        rc = cli.main(["dump", "--json", src])
    seconds = time.perf_counter() - t
    _check(rc, out.getvalue())
    _report(seconds, len(out.getvalue()))


def tf_list(src: str) -> None:
    tf = _tf()
    t = time.perf_counter()
    names = tf.train.list_variables(src)
    _report(time.perf_counter() - t, len(names))


def tfckpt_dump(src: str) -> None:
    import io
    from contextlib import redirect_stdout

    from tfckpt import cli

    t = time.perf_counter()
    with redirect_stdout(io.StringIO()) as out:
        rc = cli.main(["dump", src])
    seconds = time.perf_counter() - t
    _check(rc, out.getvalue())
    _report(seconds, 0)


def tf_inspect(src: str) -> None:
    import io
    from contextlib import redirect_stdout

    _tf()
    from tensorflow.python.tools import inspect_checkpoint

    t = time.perf_counter()
    with redirect_stdout(io.StringIO()):
        inspect_checkpoint.print_tensors_in_checkpoint_file(src, tensor_name="", all_tensors=False)
    _report(time.perf_counter() - t, 0)


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
