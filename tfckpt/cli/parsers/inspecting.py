"""The parsers of the commands that read: dump, check, diff, stats, verify."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tfckpt.cli import options as opt
from tfckpt.cli.parsers.base import command

if TYPE_CHECKING:
    from tfckpt.cli.parsers.base import Subparsers

PATH_HELP = "the checkpoint: a prefix, its .index, or a directory (its latest checkpoint)"


def add_dump(sub: Subparsers) -> None:
    """``tfckpt dump PATH``."""
    p = command(
        sub,
        "dump",
        "list the tensors of a checkpoint",
        "Show what a checkpoint holds; reads only the index unless values are asked for. "
        "Names are listed in natural order (layer_2 before layer_10); SIZE is the bytes of "
        "a tensor's data on disk.",
    )
    p.add_argument(
        "path",
        metavar="PATH",
        help="checkpoint prefix, .index file, directory, SavedModel or .meta graph",
    )
    opt.add_json(p)
    opt.add_filter(p)
    p.add_argument(
        "--tensor",
        metavar="NAME_OR_REGEX",
        action="append",
        help="print the values of these tensors (repeatable); NAME[INDEX] prints a part, "
        "reading only its bytes, e.g. 'emb[0:5]' or 'kernel[..., -1]'",
    )
    p.add_argument("--full", action="store_true", help="with --tensor, print every element")
    p.add_argument(
        "--object-graph",
        action="store_true",
        help="TF2: show the object graph that tf.train.Checkpoint.restore matches",
    )
    p.add_argument(
        "--all",
        action="store_true",
        help="list every checkpoint in the directory PATH: the state file's in its "
        "order, then the others; step, tensors, size (as dump's total: the bytes of the "
        "tensor data on disk; tfckpt ls shows the files' sizes)",
    )
    p.set_defaults(func="inspect.cmd_dump")


def add_check(sub: Subparsers) -> None:
    """``tfckpt check CKPT --against TARGET``."""
    p = command(
        sub,
        "check",
        "predict whether a restore would succeed",
        "Say, from the files alone and before TensorFlow runs, whether restoring the checkpoint "
        "CKPT into TARGET would succeed.\n\n"
        "The report names every value TARGET restores that CKPT lacks, every dtype and shape "
        "mismatch (and whether a cast fixes it), partitioned tensors whose stored slices cannot "
        "give what TARGET reads, and what CKPT holds that nothing reads. TARGET: a TF1 graph "
        "(.meta: what its Saver restores; without a saver_def, the default Saver import_meta_graph "
        "builds), a SavedModel directory, a Keras .h5 file (what model.load_weights(CKPT) does in "
        "the model that wrote it; or a directory or archive holding one), or a checkpoint "
        "standing for the program that wrote it.",
    )
    p.add_argument("path", metavar="CKPT", help="the checkpoint to restore")
    p.add_argument("--against", required=True, metavar="TARGET", help="what restores it")
    p.add_argument(
        "--allow-missing",
        action="store_true",
        help="values CKPT lacks are information, not failures (as expect_partial())",
    )
    p.add_argument(
        "--assert-consumed",
        action="store_true",
        help="tensors of CKPT nothing reads are failures (as assert_consumed())",
    )
    p.add_argument(
        "--cast",
        action="store_true",
        help="predict tfckpt.restore / tfckpt.keras.load_weights, which cast floating-point "
        "values to each variable's dtype (TensorFlow's restores do not)",
    )
    opt.add_json(p)
    p.set_defaults(func="checking.cmd_check")


def add_diff(sub: Subparsers) -> None:
    """``tfckpt diff A B``."""
    p = command(
        sub,
        "diff",
        "compare two checkpoints",
        "Names only in A or B, dtype and shape changes, and value differences of common "
        "tensors (compared in the wider dtype).",
    )
    p.add_argument("a", metavar="A", help="a checkpoint (the reference)")
    p.add_argument("b", metavar="B", help="the checkpoint compared with A")
    p.add_argument("--atol", type=float, default=0.0, help="absolute tolerance (default 0)")
    p.add_argument("--rtol", type=float, default=0.0, help="relative tolerance (default 0)")
    p.add_argument("--names-only", action="store_true", help="compare names, dtypes, shapes")
    opt.add_filter(p)
    opt.add_json(p)
    p.set_defaults(func="inspect.cmd_diff")


def add_stats(sub: Subparsers) -> None:
    """``tfckpt stats PATH``."""
    p = command(
        sub,
        "stats",
        "value statistics, and what a float16/bfloat16 cast would do",
        "Per tensor: min, max, mean, std, NaN and inf counts, fraction of zeros; for "
        "floating-point tensors, how many values would overflow, become zero or become "
        "subnormal in float16 and bfloat16. Streams in bounded memory. With --html, also "
        "a page of pictures of it (needs the report extra: matplotlib).",
    )
    p.add_argument("path", metavar="PATH", help=PATH_HELP)
    opt.add_filter(p)
    opt.add_json(p)
    g = p.add_argument_group("report")
    g.add_argument(
        "--html",
        metavar="FILE",
        help="also write a self-contained HTML page: per tensor, its values on a log scale "
        "over the --dtype's normal, subnormal and overflow ranges",
    )
    g.add_argument(
        "--dtype",
        choices=("float16", "bfloat16"),
        default="float16",
        help="the cast the --html page shows (default float16)",
    )
    opt.add_report_top(g)
    g.add_argument("--overwrite", action="store_true", help="replace an existing --html file")
    p.set_defaults(func="inspect.cmd_stats")


def add_verify(sub: Subparsers) -> None:
    """``tfckpt verify PATH``."""
    p = command(
        sub,
        "verify",
        "check a checkpoint's integrity",
        "Every block checksum, tensor CRC32C, shard extent, shard file, slice cover, "
        "string framing and object-graph key.",
    )
    p.add_argument("path", metavar="PATH", help=PATH_HELP)
    p.add_argument(
        "--tf",
        action="store_true",
        help="also read every tensor with TensorFlow and compare bit-for-bit",
    )
    p.add_argument(
        "--reference",
        metavar="SRC",
        help="with --tf: the checkpoint this one was converted from; cast tensors "
        "must equal TensorFlow's tf.cast of it",
    )
    g = p.add_argument_group(
        "proof of a conversion",
        "With --against OUT: PATH is the source; every tensor of OUT (a model directory, "
        "safetensors, npz or a checkpoint) must equal, bit for bit, what PATH becomes with "
        "the same preset, rules, names, value transforms and casts given here, and every "
        "tensor of PATH must be written or left out by a rule.",
    )
    g.add_argument("--against", metavar="OUT", help="the output to check against PATH")
    g.add_argument("--preset", metavar="NAME", help="the preset OUT was exported with")
    g.add_argument("--keep-keys", action="store_true", help="as export was given it")
    g.add_argument("--with-optimizer", action="store_true", help="as export was given it")
    g.add_argument("--with-bookkeeping", action="store_true", help="as export was given it")
    opt.add_chunk_bytes(g)
    with opt.shared(p):
        opt.add_cast_group(p)
        opt.add_select_group(p)
        opt.add_rename_group(p)
        opt.add_values_group(p)
    opt.add_json(p)
    opt.brief(
        p,
        show=("--rules",),
        hide=("--keep-keys", "--with-optimizer", "--with-bookkeeping", "--chunk-bytes"),
    )
    p.set_defaults(func="inspect.cmd_verify")
