"""TF1 graph files and SavedModels written by TensorFlow, and TensorFlow's own account of
them, for the tests of ``dump GRAPH.meta`` and ``check --against``.

- :func:`tf1_graph`: a TF1 graph with placeholders, a trainable and a non-trainable
  variable, a local variable, partitioned variables (float32 and float16), collections of
  every kind and a ``Saver`` (V1 or V2, resource or reference variables, sharded or not),
  saved once: its ``.meta`` and a checkpoint.
- :func:`tf1_saved_model`: the same graph through ``tf.compat.v1.saved_model``'s builder,
  with a signature.
- :func:`tf_account`: what TensorFlow reports after ``import_meta_graph``.
- :func:`saver_restore`: a real ``Saver.restore`` of a checkpoint into a graph file's graph.
- :func:`strip_saver`, :func:`tf1_graph_without_saver`: graphs without a ``saver_def``;
  :func:`default_saver_meta`: the default Saver ``import_meta_graph`` builds for one.

Every graph is built in its own ``tf.Graph``, so graph-mode state never leaks between them.
"""

from __future__ import annotations

from pathlib import Path

import tensorflow as tf

v1 = tf.compat.v1


def _build(resource: bool) -> dict:
    """The graph's tensors and variables, built in the current default graph."""
    x = v1.placeholder(tf.float32, [None, 4], name="x")
    v1.placeholder(tf.int64, None, name="labels")  # unknown rank
    v1.placeholder_with_default(tf.constant(0.5), [], name="keep")
    w = v1.get_variable("dense/w", [4, 3], use_resource=resource)
    step = v1.get_variable(
        "step",
        [],
        dtype=tf.int64,
        trainable=False,
        initializer=v1.zeros_initializer(),
        use_resource=resource,
    )
    emb = v1.get_variable(
        "emb", [10, 4], partitioner=v1.fixed_size_partitioner(3), use_resource=resource
    )
    half = v1.get_variable(
        "half",
        [6, 2],
        dtype=tf.float16,
        partitioner=v1.fixed_size_partitioner(2),
        use_resource=resource,
    )
    v1.get_variable(
        "counter",
        [2],
        collections=[v1.GraphKeys.LOCAL_VARIABLES],
        initializer=v1.zeros_initializer(),
        use_resource=resource,
    )
    logits = tf.identity(tf.matmul(x, w), name="logits")
    v1.add_to_collection("outputs", logits)
    v1.add_to_collection("sizes", 3)
    v1.add_to_collection("sizes", 7)
    v1.add_to_collection("rates", 0.25)
    del step, emb, half
    return {"x": x, "logits": logits}


def tf1_graph(directory: Path, *, resource: bool, version: str, sharded: bool = False) -> dict:
    """Build, initialise and save the graph: ``{"meta", "prefix"}``."""
    directory.mkdir(parents=True, exist_ok=True)
    write_version = {"V1": v1.train.SaverDef.V1, "V2": v1.train.SaverDef.V2}[version]
    with tf.Graph().as_default():
        _build(resource)
        saver = v1.train.Saver(write_version=write_version, sharded=sharded, max_to_keep=3)
        with v1.Session() as sess:
            sess.run([v1.global_variables_initializer(), v1.local_variables_initializer()])
            prefix = saver.save(sess, str(directory / "model.ckpt"), global_step=7)
    # A sharded V1 save's prefix is a file pattern; its graph file is named without it.
    return {"meta": str(directory / "model.ckpt-7.meta"), "prefix": prefix}


def strip_saver(meta: str, out: str) -> str:
    """A copy of the graph file ``meta`` without its ``saver_def`` (its save and restore
    ops stay in the graph), as TensorFlow's own proto writes it."""
    from tensorflow.core.protobuf import meta_graph_pb2

    proto = meta_graph_pb2.MetaGraphDef.FromString(Path(meta).read_bytes())
    proto.ClearField("saver_def")
    Path(out).write_bytes(proto.SerializeToString())
    return out


def tf1_graph_without_saver(directory: Path, *, resource: bool) -> dict:
    """The graph of :func:`tf1_graph` exported by ``export_meta_graph`` before any Saver
    exists (no saver_def, no save ops), then saved by a Saver: ``{"meta", "prefix"}``."""
    directory.mkdir(parents=True, exist_ok=True)
    meta = str(directory / "graph.meta")
    with tf.Graph().as_default():
        _build(resource)
        proto = v1.train.export_meta_graph(meta)
        assert not proto.HasField("saver_def")
        saver = v1.train.Saver()
        with v1.Session() as sess:
            sess.run([v1.global_variables_initializer(), v1.local_variables_initializer()])
            prefix = saver.save(sess, str(directory / "model.ckpt"))
    return {"meta": meta, "prefix": prefix}


def default_saver_meta(meta: str, out: str) -> str | None:
    """The graph of ``meta`` as ``import_meta_graph`` leaves it, written with the
    saver_def of the Saver it returned (for a graph without one, the default Saver it
    built, with its save and restore ops); None when it returned no Saver."""
    with tf.Graph().as_default():
        saver = v1.train.import_meta_graph(meta)
        if saver is None:
            return None
        v1.train.export_meta_graph(out, saver_def=saver.saver_def)
    return out


def tf1_saved_model(directory: Path) -> str:
    """The graph as a TF1 SavedModel (tag ``serve``, a ``serving_default`` signature)."""
    with tf.Graph().as_default():
        tensors = _build(resource=True)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            builder = v1.saved_model.Builder(str(directory))
            signature = v1.saved_model.predict_signature_def(
                inputs={"x": tensors["x"]}, outputs={"logits": tensors["logits"]}
            )
            builder.add_meta_graph_and_variables(
                sess, ["serve"], signature_def_map={"serving_default": signature}
            )
            builder.save()
    return str(directory)


def _shape(shape) -> list | None:
    return None if shape.rank is None else shape.as_list()


def tf_account(meta: str) -> dict:
    """What TensorFlow says of the graph in ``meta`` after importing it."""
    with tf.Graph().as_default() as graph:
        saver = v1.train.import_meta_graph(meta)
        variables = [
            {"name": v.op.name, "dtype": v.dtype.base_dtype.name, "shape": _shape(v.shape)}
            for v in v1.global_variables()
        ]
        partitions = {}
        for v in v1.global_variables():
            info = v._save_slice_info
            if info is not None:
                partitions[v.op.name] = {
                    "full_name": info.full_name,
                    "full_shape": list(info.full_shape),
                    "offset": list(info.var_offset),
                    "shape": list(info.var_shape),
                }
        placeholders = [
            {
                "name": op.name,
                "dtype": op.get_attr("dtype").name,
                "shape": _shape(op.outputs[0].shape),
                "with_default": op.type == "PlaceholderWithDefault",
            }
            for op in graph.get_operations()
            if op.type in ("Placeholder", "PlaceholderWithDefault")
        ]
        sd = saver.saver_def
        return {
            "variables": variables,
            "trainable": [v.op.name for v in v1.trainable_variables()],
            "local": [v.op.name for v in v1.local_variables()],
            "partitions": partitions,
            "saver": {
                "filename_tensor": sd.filename_tensor_name,
                "save_tensor": sd.save_tensor_name,
                "restore_op": sd.restore_op_name,
                "version": v1.train.SaverDef.CheckpointFormatVersion.Name(sd.version),
                "sharded": sd.sharded,
                "max_to_keep": sd.max_to_keep,
            },
            "collections": sorted(graph.get_all_collection_keys()),
            "outputs": [t.name for t in graph.get_collection("outputs")],
            "sizes": list(graph.get_collection("sizes")),
            "rates": list(graph.get_collection("rates")),
            "placeholders": placeholders,
        }


def saved_model_signatures(directory: str) -> dict:
    """The SavedModel's signatures as TensorFlow's loader gives them."""
    with tf.Graph().as_default(), v1.Session() as sess:
        mg = v1.saved_model.loader.load(sess, ["serve"], directory)
    out = {}
    for key, sig in mg.signature_def.items():
        out[key] = {
            "method_name": sig.method_name,
            **{
                side: [
                    {
                        "key": k,
                        "name": t.name,
                        "dtype": tf.as_dtype(t.dtype).name,
                        "shape": _shape(tf.TensorShape(t.tensor_shape)),
                    }
                    for k, t in sorted(getattr(sig, side).items())
                ]
                for side in ("inputs", "outputs")
            },
        }
    return out


def saver_restore(meta: str, prefix: str) -> tuple[bool, str]:
    """Restore ``prefix`` with the Saver of the graph in ``meta``, in a fresh graph:
    whether it succeeded, and TensorFlow's message if not."""
    with tf.Graph().as_default():
        try:
            saver = v1.train.import_meta_graph(meta)
        except (TypeError, ValueError, IndexError, AttributeError, KeyError) as e:
            # Without a saver_def: the default Saver refused the graph's collections.
            return False, f"import_meta_graph: {type(e).__name__}: {e}"
        if saver is None:
            return False, "import_meta_graph built no Saver"
        with v1.Session() as sess:
            try:
                saver.restore(sess, prefix)
            except (tf.errors.OpError, ValueError) as e:
                return False, str(e).split("\n")[0]
    return True, ""


def saved_model_restore(directory: str, prefix: str) -> tuple[bool, str]:
    """Restore ``prefix`` with the Saver of a TF1 SavedModel's MetaGraph."""
    with tf.Graph().as_default(), v1.Session() as sess:
        mg = v1.saved_model.loader.load(sess, ["serve"], directory)
        saver = v1.train.Saver(saver_def=mg.saver_def)
        try:
            saver.restore(sess, prefix)
        except (tf.errors.OpError, ValueError) as e:
            return False, str(e).split("\n")[0]
    return True, ""
