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


def tfckpt_import(src: str, dst: str, *flags: str) -> None:
    """Stream a safetensors or npz file into a V2 checkpoint, in bounded memory."""
    from tfckpt import cli

    t = time.perf_counter()
    rc = cli.main(["import", src, dst, "--overwrite", *flags])
    seconds = time.perf_counter() - t
    _check(rc)
    _report(seconds, 0)


def tfckpt_export_modules(src: str, dst: str, *flags: str) -> None:
    """An export that reports the modules it imported (``modules``: those of ``WATCHED``)."""
    from tfckpt import cli

    t = time.perf_counter()
    rc = cli.main(["export", src, dst, "--overwrite", *flags])
    seconds = time.perf_counter() - t
    _check(rc)
    _report(seconds, os.path.getsize(dst), modules=[m for m in WATCHED if m in sys.modules])


# Modules whose import an export must not pay for.
WATCHED = ("ml_dtypes", "tensorflow", "torch", "safetensors")


def tf_list_export(src: str, dst: str) -> None:
    """TensorFlow's reader to npz: load_checkpoint, every tensor in memory, numpy.savez."""
    tf = _tf()
    import numpy as np

    t = time.perf_counter()
    reader = tf.train.load_checkpoint(src)
    names = sorted(reader.get_variable_to_dtype_map())
    os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
    np.savez(dst, **{name: np.asarray(reader.get_tensor(name)) for name in names})
    _report(time.perf_counter() - t, os.path.getsize(dst))


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


def tf_import(src: str, dst: str, dtype: str) -> None:
    """The usual way back: safetensors.numpy's load_file (every tensor in memory), then
    tf.cast and SaveV2 of those tensors."""
    tf = _tf()
    from safetensors.numpy import load_file

    t = time.perf_counter()
    arrays = load_file(src)
    names = sorted(arrays)
    target = tf.as_dtype(dtype)
    tensors = []
    for name in names:
        value = tf.constant(arrays[name])
        tensors.append(tf.cast(value, target) if value.dtype.is_floating else value)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    tf.raw_ops.SaveV2(
        prefix=dst, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors
    )
    _report(time.perf_counter() - t, 0)


def tfckpt_average(first: str, second: str, dst: str) -> None:
    """The mean of two checkpoints, streamed (float64 sums, chunk by chunk)."""
    from tfckpt import cli

    t = time.perf_counter()
    rc = cli.main(["average", first, second, "-o", dst, "--overwrite"])
    seconds = time.perf_counter() - t
    _check(rc)
    _report(seconds, 0)


def tf_average(first: str, second: str, dst: str) -> None:
    """The TensorFlow way: load_checkpoint both, every tensor in memory, the mean of the
    floating-point ones (others from the second, the newest), SaveV2."""
    tf = _tf()
    import numpy as np

    t = time.perf_counter()
    a, b = tf.train.load_checkpoint(first), tf.train.load_checkpoint(second)
    dtypes = b.get_variable_to_dtype_map()
    names = sorted(dtypes)
    tensors = []
    for name in names:
        value = np.asarray(b.get_tensor(name))
        if dtypes[name].is_floating:
            mean = (value.astype(np.float64) + np.asarray(a.get_tensor(name))) / 2
            value = mean.astype(value.dtype)
        tensors.append(tf.constant(value))
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    tf.raw_ops.SaveV2(
        prefix=dst, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors
    )
    _report(time.perf_counter() - t, 0)


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


def _data_files(src: str) -> list[str]:
    d, base = os.path.dirname(src), os.path.basename(src)
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.startswith(base + ".data-"))


def cp_durable(src: str, dst: str) -> None:
    """The durable floor: copy the same files, then fsync each copy and the directory (what
    tfckpt's default does for its output)."""
    t = time.perf_counter()
    out = os.path.dirname(dst)
    os.makedirs(out, exist_ok=True)
    d, base = os.path.dirname(src), os.path.basename(src)
    copied = 0
    for f in os.listdir(d):
        if f.startswith(base + "."):
            target = os.path.join(out, f)
            shutil.copyfile(os.path.join(d, f), target)
            fd = os.open(target, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            copied += 1
    fd = os.open(out, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    seconds = time.perf_counter() - t
    _check(0 if copied else 1, f"no files of {src}\n")
    _report(seconds, 0)


def read_data(src: str, chunk_mib: str = "8") -> None:
    """The read floor: every data file, from the page cache, into one reused buffer."""
    files = _data_files(src)
    _check(0 if files else 1, f"no data files of {src}\n")
    buf = bytearray(int(chunk_mib) << 20)
    t = time.perf_counter()
    n = 0
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while True:
                got = f.readinto(buf)
                if not got:
                    break
                n += got
    _report(time.perf_counter() - t, n, throughput=n)


def write_data(dst: str, mib: str, fsync: str = "no", chunk_mib: str = "8") -> None:
    """The write floor: ``mib`` MiB from one reused buffer into a new file (then fsync)."""
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    buf = os.urandom(int(chunk_mib) << 20)
    total = int(mib) << 20
    t = time.perf_counter()
    with open(dst, "wb", buffering=0) as f:
        done = 0
        while done < total:
            done += f.write(buf[: total - done])
        if fsync == "fsync":
            os.fsync(f.fileno())
    _report(time.perf_counter() - t, total, throughput=total)


def crc32c_alone(mib: str) -> None:
    """CRC32C over ``mib`` MiB in 8 MiB pieces (the check on read, the checksum on write)."""
    import crc32c
    import numpy as np

    data = np.random.default_rng(0).integers(0, 256, int(mib) << 20, dtype=np.uint8)
    step = 8 << 20
    t = time.perf_counter()
    crc = 0
    for i in range(0, data.size, step):
        crc = crc32c.crc32c(data[i : i + step], crc)
    _report(time.perf_counter() - t, data.nbytes, throughput=data.nbytes)


def cast_alone(how: str, target: str, mib: str, chunk_mib: str = "8") -> None:
    """float32 -> ``target`` in-process, chunk by chunk into reused buffers, after imports
    and data generation. ``how``: ``simd`` (tfckpt's default Caster), ``reference`` (its
    numpy/ml-dtypes path, on both cores), ``simd-1thread`` (NumKong alone, no checks, on
    one core), ``simd-2threads`` (the same, each chunk split over two threads), ``tf-cast``
    (``tf.cast`` on the CPU, whole chunks), ``tf-backend`` (the Caster with tfckpt's
    ``tf.cast`` converter on the CPU, what ``--backend tf`` runs)."""
    import numpy as np

    if how == "reference":
        os.environ["TFCKPT_CAST"] = "reference"
    from tfckpt.format import dtypes as _dt
    from tfckpt.rewrite.cast import Caster

    values = np.random.default_rng(0).standard_normal(int(mib) << 18, dtype=np.float32) * 0.05
    step = (int(chunk_mib) << 20) // 4
    src, tgt = _dt.lookup("float32"), _dt.lookup(target)
    ring = [np.empty(step * tgt.fixed_itemsize, np.uint8) for _ in range(3)]
    turn = [0]

    def buffers(nbytes: int) -> np.ndarray:
        turn[0] += 1
        return ring[turn[0] % len(ring)][:nbytes]

    if how in ("simd", "reference"):
        caster = Caster(src, tgt, buffers=buffers)
        expect = "numkong" if how == "simd" else "numpy"
        _check(0 if caster.rounding == expect else 1, f"{how}: rounding is {caster.rounding}\n")
        cast = caster
    elif how == "simd-1thread":
        import numkong

        def cast(chunk):
            return numkong.astype(chunk, target, out=buffers(chunk.size * 2).view(tgt.numpy))
    elif how == "simd-2threads":
        from concurrent.futures import ThreadPoolExecutor

        import numkong

        pool = ThreadPoolExecutor(2)

        def cast(chunk):
            out = buffers(chunk.size * 2).view(tgt.numpy)
            h = chunk.size // 2
            parts = [(chunk[:h], out[:h]), (chunk[h:], out[h:])]
            list(pool.map(lambda p: numkong.astype(p[0], target, out=p[1]), parts))
            return out
    elif how == "tf-cast":
        tf = _tf()
        dtype = tf.as_dtype(target)

        def cast(chunk):
            with tf.device("/CPU:0"):
                return tf.cast(tf.constant(chunk), dtype).numpy()
    elif how == "tf-backend":
        _tf()
        from tfckpt.tf import cast as tf_cast

        cast = Caster(src, tgt, convert=tf_cast.converter("/CPU:0"), buffers=buffers)
    else:
        _check(2, f"unknown cast {how}\n")
    cast(values[:step])  # warm: pools, kernels, buffers
    t = time.perf_counter()
    for i in range(0, values.size, step):
        cast(values[i : i + step])
    _report(time.perf_counter() - t, values.nbytes, throughput=values.nbytes)


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
    text = out.getvalue()
    _check(rc, text)
    _report(seconds, len(text))


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
