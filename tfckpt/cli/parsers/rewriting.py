"""The parsers of the commands that write a checkpoint or files from one: convert,
rename, select, merge, graft, flatten, average, export, import, presets, match, edit."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from tfckpt.cli import options as opt
from tfckpt.cli.parsers.base import command

if TYPE_CHECKING:
    from tfckpt.cli.parsers.base import Subparsers

SRC_HELP = "the checkpoint: a prefix, its .index, or a directory (its latest checkpoint)"
DST_HELP = (
    "the output prefix, or a directory (the source's name is kept; from a SavedModel "
    "directory, a SavedModel)"
)


def add_convert(sub: Subparsers) -> None:
    """``tfckpt convert SRC DST``."""
    p = command(
        sub,
        "convert",
        "cast floating-point tensors to another dtype",
        "Write a copy of SRC with floating-point tensors cast, e.g. float32 -> float16.\n\n"
        "Without --dtype, a plain copy: the way to turn a V1 checkpoint into a V2 one. "
        "Accepts every transform option.",
    )
    p.add_argument("src", metavar="SRC", help=SRC_HELP)
    opt.add_output(p, "dst", "DST", DST_HELP)
    opt.add_transform_options(p, checkpoint_only=True)
    g = p.add_argument_group("report")
    g.add_argument(
        "--report",
        metavar="FILE",
        help="also write an HTML page of what the cast did to each tensor (needs the "
        "report extra: matplotlib; replaced only with --overwrite)",
    )
    opt.add_report_top(g)
    opt.brief(p, hide=("--report-top",))
    p.set_defaults(func="transform.cmd_transform")


def add_rename(sub: Subparsers) -> None:
    """``tfckpt rename SRC DST``."""
    p = command(
        sub,
        "rename",
        "rename tensors by regex rules or an exact map",
        "Write a copy of SRC with tensors renamed; TF2 object graphs are re-keyed so "
        "restore still finds every value.",
    )
    p.add_argument("src", metavar="SRC", help=SRC_HELP)
    opt.add_output(p, "dst", "DST", DST_HELP)
    opt.add_transform_options(p, checkpoint_only=True)
    opt.brief(p, show=("--map", "--map-file", "--rules"))
    p.set_defaults(func="transform.cmd_transform")


def add_select(sub: Subparsers) -> None:
    """``tfckpt select SRC DST``."""
    p = command(
        sub,
        "select",
        "keep only some tensors or TF2 objects",
        "Write a copy of SRC with only the selected tensors.",
    )
    p.add_argument("src", metavar="SRC", help=SRC_HELP)
    opt.add_output(p, "dst", "DST", DST_HELP)
    opt.add_transform_options(p, checkpoint_only=True)
    opt.brief(p, show=("--drop-object",))
    p.set_defaults(func="transform.cmd_transform")


def add_merge(sub: Subparsers) -> None:
    """``tfckpt merge SRC... -o DST``."""
    p = command(
        sub,
        "merge",
        "combine several checkpoints into one",
        "Write one checkpoint holding the tensors of all SOURCES; TF2 object graphs are "
        "joined at the root.",
    )
    p.add_argument("sources", nargs="+", metavar="SRC", help="the checkpoints to join")
    opt.add_output_option(p, DST_HELP, required=True)
    opt.add_transform_options(p, checkpoint_only=True)
    opt.brief(p, show=("--prefer",))
    p.set_defaults(func="transform.cmd_transform")


def add_graft(sub: Subparsers) -> None:
    """``tfckpt graft TEMPLATE SRC... -o DST``."""
    p = command(
        sub,
        "graft",
        "fill a TF2 template with values found by name (TF1 -> TF2)",
        "Write a checkpoint with TEMPLATE's object graph, keys, dtypes and shapes (TEMPLATE: a TF2 "
        "checkpoint of the target model, e.g. freshly initialised); each value comes from the SRC "
        "tensor whose name, after --map, equals the template tensor's key or path.\n\n"
        "A template tensor's path is its key without /.ATTRIBUTES/VARIABLE_VALUE; a slot "
        "variable's also VARIABLE_PATH/SLOT_NAME. Shapes must match; floating-point values are "
        "cast to the template's dtype. A template tensor without a source is an error, except "
        "save_counter (taken from the first source that has one). TF2 sources are matched by their "
        "keys. A template's Adam, momentum SGD, Adagrad, RMSprop or Ftrl slots come from the TF1 "
        "slots VAR/Adam and VAR/Adam_1, VAR/Momentum (times -learning_rate), VAR/Adagrad, "
        "VAR/RMSProp and VAR/RMSProp_1, or VAR/Ftrl and VAR/Ftrl_1 of the tensor that fills their "
        "variable, its step count from global_step or Adam's beta1_power and beta2_power.",
    )
    p.add_argument("template", metavar="TEMPLATE", help="a TF2 checkpoint of the target model")
    p.add_argument("sources", nargs="+", metavar="SRC", help="the checkpoints to join")
    opt.add_output_option(p, DST_HELP, required=True)
    opt.add_transform_options(p)
    p.add_argument(
        "--allow-missing",
        action="store_true",
        help="keep the template's value where no source has the tensor",
    )
    p.add_argument(
        "--adam-betas",
        type=_betas,
        default=None,
        metavar="B1,B2",
        help="the TF1 AdamOptimizer's beta1,beta2 (default 0.9,0.999): the step count "
        "of a source without global_step comes from its beta1_power and beta2_power",
    )
    opt.brief(p, show=("--map",), hide=("--adam-betas",))
    p.set_defaults(func="transform.cmd_graft")


def _betas(text: str) -> tuple[float, float]:
    try:
        b1, b2 = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected B1,B2 (e.g. 0.9,0.999), not {text!r}") from None
    return b1, b2


def add_flatten(sub: Subparsers) -> None:
    """``tfckpt flatten SRC DST``."""
    p = command(
        sub,
        "flatten",
        "write a TF2 checkpoint as a name-based one (TF2 -> TF1)",
        "Write SRC without its object graph, each tensor named by its path, as a TF1 "
        "Saver names them; --map applies to these names.\n\n"
        "A path is the key without /.ATTRIBUTES/VARIABLE_VALUE (other attributes: "
        "PATH/ATTRIBUTE), a slot variable's VARIABLE_PATH/SLOT_NAME. Accepts every "
        "transform option.",
    )
    p.add_argument("src", metavar="SRC", help=SRC_HELP)
    opt.add_output(p, "dst", "DST", DST_HELP)
    opt.add_transform_options(p)
    p.add_argument(
        "--tf1-slots",
        action="store_true",
        help="name a TF2/Keras optimizer's state as TF1's optimizers do: VAR/Adam, "
        "VAR/Adam_1, VAR/Momentum... (VAR: the variable's new name), global_step",
    )
    p.add_argument(
        "--adam-betas",
        type=_betas,
        default=None,
        metavar="B1,B2",
        help="the optimizer's beta_1,beta_2 for --tf1-slots' powers (default 0.9,0.999)",
    )
    opt.brief(p, show=("--map", "--drop-object"), hide=("--adam-betas",))
    p.set_defaults(func="transform.cmd_flatten")


def add_average(sub: Subparsers) -> None:
    """``tfckpt average SRC... -o DST``: the transform options that apply to a mean,
    worded for it, without renames, selection by name or executors."""
    p = command(
        sub,
        "average",
        "the element-wise mean of several checkpoints",
        "Write the (weighted) mean of every floating-point tensor of the SRCs.\n\n"
        "The mean is summed in "
        "float64 chunk by chunk and rounded to each tensor's dtype (or --dtype); integer, "
        "bool and string tensors (and a TF2 object graph) come from the newest source, the "
        "last given. Names, dtypes and shapes must agree.",
    )
    p.add_argument("sources", nargs="+", metavar="SRC", help="oldest first (with --last: DIR)")
    opt.add_output_option(p, DST_HELP, required=True)
    p.add_argument(
        "--last",
        type=int,
        metavar="N",
        help="average the N newest checkpoints that the state file of the directory DIR lists",
    )
    p.add_argument(
        "--weights",
        nargs="+",
        metavar="W",
        help="one weight per source, in their order (default: equal)",
    )
    p.add_argument(
        "--use-ema",
        action="store_true",
        help="write each exponential moving average in place of its variable and drop the "
        "averages (TF1: v/ExponentialMovingAverage; TF2: a Keras optimizer's use_ema)",
    )
    opt.add_dtype_options(p, dtype_help="write floating-point tensors in this dtype")
    opt.add_allow_unmatched(p)
    opt.add_overflow(
        p, "means beyond the output dtype's range: fail (default), clip, or keep IEEE inf"
    )
    opt.add_drop_object(p, "TF2: cut this object from the object graph (as in select)")
    opt.add_write_options(
        p,
        shard_help="re-shard the output (default: the newest source's shards)",
        fsync_help="skip the fsyncs before the commit",
    )
    opt.add_chunk_bytes(
        p, "memory budget for tensor data in flight, all sources together (default 64M)"
    )
    opt.add_plan_output(p)
    opt.brief(
        p,
        hide=(
            "--from",
            "--keep-dtype",
            "--dtype-rule",
            "--cast-bookkeeping",
            "--allow-unmatched",
            "--max-shard-bytes",
            "--no-fsync",
            "--chunk-bytes",
            "--json",
        ),
    )
    p.set_defaults(func="transform.cmd_average")


def add_export(sub: Subparsers) -> None:
    """``tfckpt export SRC OUT``."""
    p = command(
        sub,
        "export",
        "write the tensors to safetensors or npz",
        "Stream the tensors of SRC into OUT.safetensors (sharded with --max-shard-bytes, "
        "as Hugging Face does) or OUT.npz, in bounded memory.\n\n"
        "TF2 keys become readable "
        "and the optimizer's state is left out unless asked for. Accepts every "
        "transform option; --map and --map-file apply to the readable names.",
    )
    p.add_argument("src", metavar="SRC", help=SRC_HELP)
    opt.add_output(p, "out", "OUT", "OUT.safetensors or OUT.npz; with --preset, a directory")
    opt.add_transform_options(p)
    g = p.add_argument_group("export")
    g.add_argument(
        "--preset",
        metavar="NAME",
        help="write a directory transformers loads, by a family's rules: auto, or one "
        "'tfckpt presets' lists",
    )
    g.add_argument(
        "--config",
        metavar="F.json",
        help="with --preset: the release's config (default: beside SRC)",
    )
    g.add_argument(
        "--config-value",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="with --preset: a setting of the release's config, over its file's (VALUE "
        "read as JSON where it is, else as text; NaN, Infinity and nesting past 32 levels "
        "refused); repeatable",
    )
    g.add_argument(
        "--no-verify",
        dest="verify",
        action="store_false",
        help="with --preset: skip loading config.json with transformers (before and after "
        "the write), reading the output back and comparing every tensor, bit for bit, with "
        "what the preset makes of SRC",
    )
    g.add_argument("--format", choices=("safetensors", "npz"), help="default: from OUT's name")
    g.add_argument("--keep-keys", action="store_true", help="TF2: keep the full checkpoint keys")
    g.add_argument("--with-optimizer", action="store_true", help="TF2: keep the optimizer's state")
    g.add_argument(
        "--with-bookkeeping",
        action="store_true",
        help="keep save_counter / global_step (left out by default: not weights)",
    )
    g.add_argument(
        "--skip-unsupported",
        action="store_true",
        help="leave out tensors the format cannot hold (with a note) instead of failing",
    )
    opt.brief(
        p,
        hide=(
            "--config-value",
            "--no-verify",
            "--format",
            "--with-bookkeeping",
            "--skip-unsupported",
        ),
    )
    p.set_defaults(func="transform.cmd_export")


def add_import(sub: Subparsers) -> None:
    """``tfckpt import IN OUT_PREFIX``."""
    p = command(
        sub,
        "import",
        "read safetensors or npz into a checkpoint",
        "Stream the tensors of IN (a .safetensors file, the .index.json of sharded "
        "ones, or an .npz) into a V2 checkpoint at OUT_PREFIX.",
    )
    p.add_argument(
        "src", metavar="IN", help="a .safetensors file, a .safetensors.index.json, or an .npz"
    )
    opt.add_output(p, "out", "OUT_PREFIX", "the new checkpoint's prefix")
    opt.add_transform_options(p)
    opt.brief(p, show=("--map", "--permute"))
    p.set_defaults(func="transform.cmd_export")


def add_presets(sub: Subparsers) -> None:
    """``tfckpt presets``."""
    p = command(
        sub,
        "presets",
        "list the presets of export --preset",
        "The model families export --preset knows: each a rules file (names, layouts, what "
        "is left out) and a translation of the release's config into Hugging Face's.",
    )
    opt.add_json(p)
    p.set_defaults(func="transform.cmd_presets")


def add_match(sub: Subparsers) -> None:
    """``tfckpt match SRC TARGET``."""
    p = command(
        sub,
        "match",
        "suggest a rules file that maps a checkpoint onto another layout",
        "Pair the tensors of the checkpoint SRC with the names of TARGET by shape (transposed "
        "and size-1 axes too), name, block number and order, reading indexes and headers "
        "only.\n\nPrints each pair with its confidence and what is left over; with -o writes "
        "the rules file to review, then to pass to export, convert or rename --rules.",
    )
    p.add_argument("src", metavar="SRC", help="the checkpoint whose tensors are to be renamed")
    p.add_argument(
        "target",
        metavar="TARGET",
        help="the names wanted: a .safetensors file, a model.safetensors.index.json or the "
        "directory holding either, an .npz, a checkpoint, or a weight list (.json: "
        "[[name, shape], ...] or {name: shape})",
    )
    p.add_argument("-o", "--output", metavar="RULES.toml", help="write the rules file here")
    p.add_argument("--overwrite", action="store_true", help="replace an existing rules file")
    p.add_argument(
        "--min-confidence",
        type=float,
        default=0.0,
        metavar="X",
        help="write the pairs under confidence X (0 to 1) commented out, so that an "
        "export names their tensors until they are reviewed (default 0: none)",
    )
    opt.add_json(p)
    p.set_defaults(func="matching.cmd_match")


def add_edit(sub: Subparsers) -> None:
    """``tfckpt edit SRC [DST | --in-place]``."""
    p = command(
        sub,
        "edit",
        "set, fill, scale, add, delete, resize or remap tensors",
        "Write SRC with some tensors changed, to DST or over SRC (--in-place).\n\n"
        "--in-place commits atomically: the old checkpoint stays whole until the new one "
        "is in place. Names "
        "are checkpoint keys or TF2 flat names; REGEX patterns are searched in them. "
        "Resized and remapped variables take their optimizer slots along (new rows zero).",
    )
    p.add_argument("src", metavar="SRC", help=SRC_HELP)
    opt.add_output(p, "dst", "DST", "output prefix or directory (or --in-place)", optional=True)
    p.add_argument("--in-place", action="store_true", help="replace SRC atomically")
    g = p.add_argument_group("values")
    pair = "NAME=VALUE"
    g.add_argument(
        "--set",
        action="append",
        metavar=pair,
        default=[],
        help="a literal of the tensor's shape (a number, true/false, a JSON list) or "
        "@FILE.npy, cast without loss",
    )
    g.add_argument(
        "--add",
        action="append",
        metavar="NAME=@FILE.npy",
        default=[],
        help="a new tensor (TF2 sources: only with --as-tf1)",
    )
    g.add_argument(
        "--delete",
        action="append",
        metavar="REGEX",
        default=[],
        help="delete matching tensors (TF2: their objects, slots)",
    )
    g.add_argument("--fill", action="append", metavar="NAME=zeros|ones|VALUE", default=[])
    g.add_argument(
        "--scale",
        action="append",
        metavar="NAME=FACTOR",
        default=[],
        help="multiply a floating-point tensor (in float64)",
    )
    g.add_argument(
        "--as-tf1", action="store_true", help="write no TF2 object graph (a name-based checkpoint)"
    )
    r = p.add_argument_group("rows (vocabularies, classes)")
    r.add_argument(
        "--resize",
        action="append",
        metavar="REGEX=ROWS[:INIT]",
        default=[],
        help="cut or grow --axis to ROWS; INIT: zeros (default), mean, normal:STD:SEED",
    )
    r.add_argument(
        "--remap-rows",
        action="append",
        metavar="REGEX",
        default=[],
        help="reorder --axis by token: --old-vocab to --new-vocab",
    )
    r.add_argument("--old-vocab", metavar="FILE", help="the tokens of the rows now, one a line")
    r.add_argument("--new-vocab", metavar="FILE", help="the tokens of the rows wanted, one a line")
    r.add_argument(
        "--init",
        default="zeros",
        metavar="INIT",
        help="new rows of --remap-rows: zeros (default), mean, normal:STD:SEED",
    )
    r.add_argument(
        "--allow-no-overlap",
        action="store_true",
        help="remap even when no token of --new-vocab is in --old-vocab (every row new)",
    )
    r.add_argument("--axis", type=int, default=0, help="the axis of rows (default 0)")
    o = p.add_argument_group("output")
    opt.add_write_options(o, shard_help="re-shard the output (default: keep the source's shards)")
    opt.add_checkpoint_only(o)
    opt.add_plan_output(o)
    opt.add_chunk_bytes(o)
    opt.brief(
        p,
        hide=(
            "--fill",
            "--as-tf1",
            "--old-vocab",
            "--new-vocab",
            "--init",
            "--allow-no-overlap",
            "--axis",
            "--max-shard-bytes",
            "--no-fsync",
            "--json",
            "--chunk-bytes",
            "--checkpoint-only",
        ),
    )
    p.set_defaults(func="transform.cmd_edit", executor=None)
