"""One parser builder per command: its arguments, help, description and examples.

The options several commands share come from :mod:`tfckpt.cli.options`; each builder
names the function that runs its command (``func``, see :mod:`tfckpt.cli.commands`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

from tfckpt.cli import options as opt

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

EXAMPLES = {
    "edit": """examples:
  tfckpt edit train/model.ckpt-7 out/model.ckpt --set global_step=0
  tfckpt edit run/ckpt-3 --in-place --delete '^model/dense_2/' --scale 'model/dense/kernel=0.5'
  tfckpt edit nmt/model.ckpt warm/model.ckpt --remap-rows 'embedding$' \\
      --old-vocab vocab.55k.txt --new-vocab vocab.70k.txt --init normal:0.01:7
  tfckpt edit cls/model.ckpt out/model.ckpt --resize 'logits/(kernel|bias)$=1000' --axis -1""",
    "dump": """examples:
  tfckpt dump train/model.ckpt-7
  tfckpt dump train/ --filter '^optimizer/' --json
  tfckpt dump train/ --tensor global_step --tensor '^logits/' --full
  tfckpt dump saved_model_dir --object-graph
  tfckpt dump train/ --all
  tfckpt dump train/model.ckpt-900.meta           # a TF1 graph: variables, Saver, signatures""",
    "check": """examples:
  tfckpt check train/model.ckpt-900 --against export/model.ckpt-900.meta
  tfckpt check pretrained/ --against saved_model_dir/
  tfckpt check tf2/ckpt-3 --against template/ckpt-1 --assert-consumed
  tfckpt check fp16/model.ckpt --against model.meta --cast --json

exit status: 0 a restore would succeed, 1 it would fail (the report says why), 2 error""",
    "diff": """examples:
  tfckpt diff fp32/model.ckpt fp16/model.ckpt        # how much error did float16 add?
  tfckpt diff old/ new/ --names-only                 # which variables does new/ lack?
  tfckpt diff a b --atol 1e-3 --json

exit status: 0 same, 1 different, 2 error""",
    "stats": """examples:
  tfckpt stats train/model.ckpt-7                    # is it safe to cast to float16?
  tfckpt stats train/ --filter 'kernel' --json""",
    "verify": """examples:
  tfckpt verify train/model.ckpt-7
  tfckpt verify fp16/model.ckpt --tf --reference train/model.ckpt-7
  tfckpt verify bert/bert_model.ckpt --against hf/ --preset hf-bert
  tfckpt verify gpt2/model.ckpt --against out.safetensors --rules gpt2.toml --dtype float16

exit status: 0 intact, 1 problems found (one line each on stderr), 2 error""",
    "convert": """examples:
  tfckpt convert train/model.ckpt-7 fp16/ --dtype float16
  tfckpt convert train/ bf16/model --dtype bfloat16 --from float32 --exclude '/Adam'
  tfckpt convert big/ small/ --dtype float16 --overflow clip --dry-run
  tfckpt convert bert/ fp16/ --dtype float16 --keep-dtype 'LayerNorm|layer_norm|embeddings' \\
      --dtype-rule 'pooler/=bfloat16'""",
    "rename": """examples:
  tfckpt rename pre/model new/model --map 'simple-conv1/=complex-conv1/'
  tfckpt rename pre/ new/ --map '(.*)/weights$=\\1/kernel' --map-file exact.json""",
    "select": """examples:
  tfckpt select pre/model new/model --include '^simple-conv1/(weights|biases)$'
  tfckpt select trained/ shipped/ --drop-object optimizer
  tfckpt select trained/ small/ --exclude 'BatchNorm'""",
    "merge": """examples:
  tfckpt merge a/model.ckpt b/model.ckpt -o c/model.ckpt
  tfckpt merge a/ b/ -o c/ --prefer last""",
    "graft": """examples:
  tfckpt graft tf2/template tf1/model.ckpt -o tf2/model \\
      --map 'simple-conv1/weights=model/layer_with_weights-0/kernel' \\
      --map 'simple-conv1/biases=model/layer_with_weights-0/bias'
  tfckpt graft template/ tf1/ -o out/ --map '(.*)/weights$=\\1/kernel' --dry-run
  tfckpt graft template/ tf1/ -o out/ --drop-object optimizer --allow-missing""",
    "flatten": """examples:
  tfckpt flatten tf2/ckpt-3 tf1/model.ckpt
  tfckpt flatten tf2/ tf1/model.ckpt --drop-object optimizer --map 'model/=' --dry-run""",
    "average": """examples:
  tfckpt average train/model.ckpt-800 train/model.ckpt-900 train/model.ckpt-1000 -o avg/
  tfckpt average --last 5 train/ -o avg/model --use-ema --drop-object optimizer
  tfckpt average a/ckpt-3 b/ckpt-3 -o avg/ --weights 1 3 --dtype bfloat16

the last checkpoint given (with --last: the state file's latest) is the newest""",
    "export": """examples:
  tfckpt export train/ckpt-7 model.safetensors
  tfckpt export train/ model.npz --dtype float16 --overflow clip
  tfckpt export uncased_L-12_H-768_A-12/bert_model.ckpt hf/ --preset auto
  tfckpt export bert/model.ckpt-900 hf/ --preset hf-bert --config bert_config.json \\
      --dtype bfloat16 --max-shard-bytes 2G
  tfckpt export my/ckpt model.safetensors --rules my_model.toml""",
    "match": """examples:
  tfckpt match my/model.ckpt hf/model.safetensors -o my_model.toml
  tfckpt match old/ckpt-9 weights.json --min-confidence 0.5 -o review.toml
  tfckpt match tf1/model.ckpt tf2/template --json

then review the file, and: tfckpt export SRC OUT.safetensors --rules FILE.toml --dry-run""",
    "presets": """examples:
  tfckpt presets
  tfckpt export uncased_L-12_H-768_A-12/bert_model.ckpt hf/ --preset hf-bert""",
    "ls": """examples:
  tfckpt ls train/
  tfckpt ls s3://bucket/runs/train/ --json""",
    "prune": """examples:
  tfckpt prune train/ --keep-last 5 --dry-run
  tfckpt prune train/ --keep-last 3 --keep-every-steps 10000 --keep 4200""",
    "cp": """examples:
  tfckpt cp train/ s3://bucket/runs/train/          # every checkpoint and the state file
  tfckpt cp train/ckpt-7 best/                       # one checkpoint, under its name
  tfckpt cp train/model.ckpt-900 release/model.ckpt  # one checkpoint, renamed""",
    "mv": """examples:
  tfckpt mv scratch/run7/ s3://bucket/runs/run7/
  tfckpt mv train/ckpt-7 best/

the copy is verified (every checksum read back) before the source is deleted""",
    "import": """examples:
  tfckpt import model.safetensors ckpt/model
  tfckpt import hf/model.safetensors.index.json ckpt/model --permute 'kernel$=1,0'""",
}


def _command(sub: Subparsers, name: str, help: str, description: str) -> argparse.ArgumentParser:
    """A command's parser, with its examples and the option every command takes."""
    p = sub.add_parser(
        name,
        help=help,
        description=description,
        epilog=EXAMPLES[name],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    opt.add_storage_option(p)
    return p


def add_dump(sub: Subparsers) -> None:
    """``tfckpt dump PATH``."""
    p = _command(
        sub,
        "dump",
        "list the tensors of a checkpoint",
        "Show what a checkpoint holds; reads only the index unless values are asked for.",
    )
    p.add_argument(
        "path", help="checkpoint prefix, .index file, directory, SavedModel or .meta graph"
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
        "order, then the others; step, tensors, size",
    )
    p.set_defaults(func="inspect.cmd_dump")


def add_check(sub: Subparsers) -> None:
    """``tfckpt check CKPT --against TARGET``."""
    p = _command(
        sub,
        "check",
        "predict whether a restore would succeed",
        "Say, from the files alone and before TensorFlow runs, whether restoring the "
        "checkpoint CKPT into TARGET would succeed: every value TARGET restores that CKPT "
        "lacks, every dtype and shape mismatch (and whether a cast fixes it), partitioned "
        "tensors whose stored slices cannot give what TARGET reads, and what CKPT holds "
        "that nothing reads. TARGET: a TF1 graph (.meta: what its Saver restores), a "
        "SavedModel directory, or a checkpoint standing for the program that wrote it.",
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
    p = _command(
        sub,
        "diff",
        "compare two checkpoints",
        "Names only in A or B, dtype and shape changes, and value differences of common "
        "tensors (compared in the wider dtype).",
    )
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--atol", type=float, default=0.0, help="absolute tolerance (default 0)")
    p.add_argument("--rtol", type=float, default=0.0, help="relative tolerance (default 0)")
    p.add_argument("--names-only", action="store_true", help="compare names, dtypes, shapes")
    opt.add_filter(p)
    opt.add_json(p)
    p.set_defaults(func="inspect.cmd_diff")


def add_stats(sub: Subparsers) -> None:
    """``tfckpt stats PATH``."""
    p = _command(
        sub,
        "stats",
        "value statistics, and what a float16/bfloat16 cast would do",
        "Per tensor: min, max, mean, std, NaN and inf counts, fraction of zeros; for "
        "floating-point tensors, how many values would overflow, become zero or become "
        "subnormal in float16 and bfloat16. Streams in bounded memory.",
    )
    p.add_argument("path")
    opt.add_filter(p)
    opt.add_json(p)
    p.set_defaults(func="inspect.cmd_stats")


def add_verify(sub: Subparsers) -> None:
    """``tfckpt verify PATH``."""
    p = _command(
        sub,
        "verify",
        "check a checkpoint's integrity",
        "Every block checksum, tensor CRC32C, shard extent, shard file, slice cover, "
        "string framing and object-graph key.",
    )
    p.add_argument("path")
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
    opt.add_cast_group(p)
    opt.add_select_group(p)
    opt.add_rename_group(p)
    opt.add_values_group(p)
    opt.add_json(p)
    p.set_defaults(func="inspect.cmd_verify")


def add_convert(sub: Subparsers) -> None:
    """``tfckpt convert SRC DST``."""
    p = _command(
        sub,
        "convert",
        "cast floating-point tensors to another dtype",
        "Write a copy of SRC with floating-point tensors cast, e.g. float32 -> float16. "
        "Without --dtype, a plain copy: the way to turn a V1 checkpoint into a V2 one. "
        "Accepts every transform option.",
    )
    p.add_argument("src")
    p.add_argument("dst", help="output prefix, or a directory (the source's name is kept)")
    opt.add_transform_options(p)
    p.set_defaults(func="transform.cmd_transform")


def add_rename(sub: Subparsers) -> None:
    """``tfckpt rename SRC DST``."""
    p = _command(
        sub,
        "rename",
        "rename tensors by regex rules or an exact map",
        "Write a copy of SRC with tensors renamed; TF2 object graphs are re-keyed so "
        "restore still finds every value.",
    )
    p.add_argument("src")
    p.add_argument("dst")
    opt.add_transform_options(p)
    p.set_defaults(func="transform.cmd_transform")


def add_select(sub: Subparsers) -> None:
    """``tfckpt select SRC DST``."""
    p = _command(
        sub,
        "select",
        "keep only some tensors or TF2 objects",
        "Write a copy of SRC with only the selected tensors.",
    )
    p.add_argument("src")
    p.add_argument("dst")
    opt.add_transform_options(p)
    p.set_defaults(func="transform.cmd_transform")


def add_merge(sub: Subparsers) -> None:
    """``tfckpt merge SRC... -o DST``."""
    p = _command(
        sub,
        "merge",
        "combine several checkpoints into one",
        "Write one checkpoint holding the tensors of all SOURCES; TF2 object graphs are "
        "joined at the root.",
    )
    p.add_argument("sources", nargs="+", metavar="SRC")
    p.add_argument("-o", "--output", required=True, metavar="DST")
    opt.add_transform_options(p)
    p.set_defaults(func="transform.cmd_transform")


def add_graft(sub: Subparsers) -> None:
    """``tfckpt graft TEMPLATE SRC... -o DST``."""
    p = _command(
        sub,
        "graft",
        "fill a TF2 template with values found by name (TF1 -> TF2)",
        "Write a checkpoint with TEMPLATE's object graph, keys, dtypes and shapes (TEMPLATE: "
        "a TF2 checkpoint of the target model, e.g. freshly initialised); each value comes "
        "from the SRC tensor whose name, after --map, equals the template tensor's key or "
        "path (the key without /.ATTRIBUTES/VARIABLE_VALUE; a slot variable also as "
        "VARIABLE_PATH/SLOT_NAME). Shapes must match; floating-point values are cast to "
        "the template's dtype. A template tensor without a source is an error, except "
        "save_counter (taken from the first source that has one). TF2 sources are matched "
        "by their keys. A template's Adam, momentum SGD, Adagrad, RMSprop or Ftrl slots "
        "come from the TF1 slots VAR/Adam and VAR/Adam_1, VAR/Momentum (times "
        "-learning_rate), VAR/Adagrad, VAR/RMSProp and VAR/RMSProp_1, or VAR/Ftrl and "
        "VAR/Ftrl_1 of the tensor that fills their "
        "variable, its step count from "
        "global_step or Adam's beta1_power and beta2_power.",
    )
    p.add_argument("template")
    p.add_argument("sources", nargs="+", metavar="SRC")
    p.add_argument("-o", "--output", required=True, metavar="DST")
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
    p.set_defaults(func="transform.cmd_graft")


def _betas(text: str) -> tuple[float, float]:
    try:
        b1, b2 = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected B1,B2 (e.g. 0.9,0.999), not {text!r}") from None
    return b1, b2


def add_flatten(sub: Subparsers) -> None:
    """``tfckpt flatten SRC DST``."""
    p = _command(
        sub,
        "flatten",
        "write a TF2 checkpoint as a name-based one (TF2 -> TF1)",
        "Write SRC without its object graph, each tensor named by its path (the key "
        "without /.ATTRIBUTES/VARIABLE_VALUE; other attributes PATH/ATTRIBUTE), slot "
        "variables VARIABLE_PATH/SLOT_NAME, as a TF1 Saver names them. --map applies to "
        "these names. Accepts every transform option.",
    )
    p.add_argument("src")
    p.add_argument("dst")
    opt.add_transform_options(p)
    p.add_argument(
        "--tf1-slots",
        action="store_true",
        help="name a TF2/Keras Adam's, momentum SGD's, Adagrad's, RMSprop's or Ftrl's "
        "state as TF1's optimizers do: VAR/Adam and VAR/Adam_1, VAR/Momentum, VAR/Adagrad, "
        "VAR/RMSProp and VAR/RMSProp_1, or VAR/Ftrl and VAR/Ftrl_1 (VAR: the variable's "
        "new name), global_step, and an Adam's beta1_power and beta2_power",
    )
    p.add_argument(
        "--adam-betas",
        type=_betas,
        default=None,
        metavar="B1,B2",
        help="the optimizer's beta_1,beta_2 for --tf1-slots' powers (default 0.9,0.999)",
    )
    p.set_defaults(func="transform.cmd_flatten")


def add_average(sub: Subparsers) -> None:
    """``tfckpt average SRC... -o DST``: the transform options that apply to a mean,
    worded for it, without renames, selection by name or executors."""
    p = _command(
        sub,
        "average",
        "the element-wise mean of several checkpoints",
        "Write the (weighted) mean of every floating-point tensor of the SRCs, summed in "
        "float64 chunk by chunk and rounded to each tensor's dtype (or --dtype); integer, "
        "bool and string tensors (and a TF2 object graph) come from the newest source, the "
        "last given. Names, dtypes and shapes must agree.",
    )
    p.add_argument("sources", nargs="+", metavar="SRC", help="oldest first (with --last: DIR)")
    p.add_argument("-o", "--output", required=True, metavar="DST")
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
    p.set_defaults(func="transform.cmd_average")


def add_export(sub: Subparsers) -> None:
    """``tfckpt export SRC OUT``."""
    p = _command(
        sub,
        "export",
        "write the tensors to safetensors or npz",
        "Stream the tensors of SRC into OUT.safetensors (sharded with --max-shard-bytes, "
        "as Hugging Face does) or OUT.npz, in bounded memory. TF2 keys become readable "
        "and the optimizer's state is left out unless asked for. Accepts every "
        "transform option; --map and --map-file apply to the readable names.",
    )
    p.add_argument("src")
    p.add_argument("out", help="OUT.safetensors or OUT.npz; with --preset, a directory")
    opt.add_transform_options(p)
    g = p.add_argument_group("export")
    g.add_argument(
        "--preset",
        metavar="NAME",
        help="write a directory Hugging Face transformers loads (config.json and "
        "model.safetensors) with a family's rules: auto, or one 'tfckpt presets' lists",
    )
    g.add_argument(
        "--config",
        metavar="F.json",
        help="with --preset: the release's config file (default: found beside SRC)",
    )
    g.add_argument(
        "--config-value",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="with --preset: a setting of the release's config, over its file's (VALUE "
        "read as JSON where it is, else as text); repeatable",
    )
    g.add_argument(
        "--no-verify",
        dest="verify",
        action="store_false",
        help="with --preset: skip reading the output back and comparing every tensor, bit "
        "for bit, with what the preset makes of SRC",
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
    p.set_defaults(func="transform.cmd_export")


def add_import(sub: Subparsers) -> None:
    """``tfckpt import IN OUT_PREFIX``."""
    p = _command(
        sub,
        "import",
        "read safetensors or npz into a checkpoint",
        "Stream the tensors of IN (a .safetensors file, the .index.json of sharded "
        "ones, or an .npz) into a V2 checkpoint at OUT_PREFIX.",
    )
    p.add_argument("src", metavar="IN")
    p.add_argument("out", metavar="OUT_PREFIX")
    opt.add_transform_options(p)
    p.set_defaults(func="transform.cmd_export")


# In the order `tfckpt --help` lists them.
def add_presets(sub: Subparsers) -> None:
    """``tfckpt presets``."""
    p = _command(
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
    p = _command(
        sub,
        "match",
        "suggest a rules file that maps a checkpoint onto another layout",
        "Pair the tensors of the checkpoint SRC with the names of TARGET by shape (transposed "
        "and size-1 axes too), name, block number and order, reading indexes and headers "
        "only. Prints each pair with its confidence and what is left over; with -o writes "
        "the rules file to review, then to pass to export, convert or rename --rules.",
    )
    p.add_argument("src", help="the checkpoint whose tensors are to be renamed")
    p.add_argument(
        "target",
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
    p = _command(
        sub,
        "edit",
        "set, fill, scale, add, delete, resize or remap tensors",
        "Write SRC with some tensors changed, to DST or over SRC (--in-place, committed "
        "atomically: the old checkpoint stays whole until the new one is in place). Names "
        "are checkpoint keys or TF2 flat names; REGEX patterns are searched in them. "
        "Resized and remapped variables take their optimizer slots along (new rows zero).",
    )
    p.add_argument("src")
    p.add_argument("dst", nargs="?", help="output prefix or directory (or --in-place)")
    p.add_argument("--in-place", action="store_true", help="replace SRC atomically")
    g = p.add_argument_group("values")
    pair = "NAME=VALUE"
    g.add_argument(
        "--set",
        action="append",
        metavar=pair,
        default=[],
        help="a literal (number, true/false, JSON list) of the tensor's shape, or "
        "@FILE.npy; cast to its dtype without loss (repeatable)",
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
        help="delete matching tensors; TF2: their objects and slots go too",
    )
    g.add_argument("--fill", action="append", metavar="NAME=zeros|ones|VALUE", default=[])
    g.add_argument(
        "--scale",
        action="append",
        metavar="NAME=FACTOR",
        default=[],
        help="multiply a floating-point tensor (in float64, rounded once)",
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
        help="reorder --axis by token from --old-vocab to --new-vocab",
    )
    r.add_argument("--old-vocab", metavar="FILE")
    r.add_argument("--new-vocab", metavar="FILE")
    r.add_argument(
        "--init",
        default="zeros",
        metavar="INIT",
        help="new rows of --remap-rows: zeros (default), mean, normal:STD:SEED",
    )
    r.add_argument("--axis", type=int, default=0, help="the axis of rows (default 0)")
    o = p.add_argument_group("output")
    opt.add_write_options(o, shard_help="re-shard the output (default: keep the source's shards)")
    opt.add_plan_output(o)
    opt.add_chunk_bytes(o)
    p.set_defaults(func="transform.cmd_edit", executor=None)


def add_ls(sub: Subparsers) -> None:
    """``tfckpt ls DIR``."""
    p = _command(
        sub,
        "ls",
        "list a directory's checkpoints and leftovers",
        "Every checkpoint in DIR (V2 and V1; TF1 model.ckpt-N and TF2 ckpt-N): step, time, "
        "size (index and data), shards, whether the state file lists it; and the leftovers "
        "of interrupted saves (data without an index, temporaries, part directories) and "
        "state-file entries naming checkpoints that are not there.",
    )
    p.add_argument("directory", metavar="DIR")
    opt.add_json(p)
    p.set_defaults(func="directories.cmd_ls")


def add_prune(sub: Subparsers) -> None:
    """``tfckpt prune DIR --keep-last N``."""
    p = _command(
        sub,
        "prune",
        "delete old checkpoints and leftovers; rewrite the state file",
        "Keep the N newest numbered checkpoints of DIR (and the steps --keep-every-steps "
        "and --keep name); delete every file of the others and the leftovers of "
        "interrupted saves; rewrite the state file as tf.train.CheckpointManager "
        "(max_to_keep=N) leaves it, the other kept checkpoints preserved for good. The "
        "state file is written before anything is deleted. Checkpoints whose name ends "
        "in no step are kept. Do not prune a directory a run is saving into.",
    )
    p.add_argument("directory", metavar="DIR")
    p.add_argument("--keep-last", type=int, required=True, metavar="N", help="N >= 1")
    p.add_argument(
        "--keep-every-steps", type=int, metavar="K", help="also keep steps that are multiples of K"
    )
    p.add_argument(
        "--keep", type=int, nargs="+", default=[], metavar="STEP", help="also keep these steps"
    )
    p.add_argument("--dry-run", action="store_true", help="only say what would be deleted")
    opt.add_json(p)
    p.set_defaults(func="directories.cmd_prune")


def _add_transfer(sub: Subparsers, name: str, help: str, description: str) -> None:
    p = _command(sub, name, help, description)
    p.add_argument("src", metavar="SRC", help="a checkpoint prefix, or a run's directory")
    p.add_argument(
        "dst", metavar="DST", help="the new prefix, or a directory (for a run: its new directory)"
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace checkpoints (and the state file) there, each in one step",
    )
    opt.add_json(p)
    p.set_defaults(func=f"directories.cmd_{name}")


def add_cp(sub: Subparsers) -> None:
    """``tfckpt cp SRC DST``."""
    _add_transfer(
        sub,
        "cp",
        "copy a checkpoint or a whole run, on local disks and object stores",
        "Copy one checkpoint (SRC a prefix) or a run (SRC a directory: its checkpoints and "
        "its state file, entries naming the copies) to DST, each checkpoint committed "
        "with its index last. Any fsspec URL on either side.",
    )


def add_mv(sub: Subparsers) -> None:
    """``tfckpt mv SRC DST``."""
    _add_transfer(
        sub,
        "mv",
        "move a checkpoint or a whole run: copy, verify, then delete the source",
        "As cp, then every copied checkpoint verified (each tensor's checksum read back) "
        "before the source is deleted (its state file first, then each index, then the "
        "data). A failure before that leaves the source as it was.",
    )


COMMANDS: tuple[Callable[[Subparsers], None], ...] = (
    add_dump,
    add_diff,
    add_stats,
    add_verify,
    add_check,
    add_convert,
    add_rename,
    add_select,
    add_merge,
    add_graft,
    add_flatten,
    add_average,
    add_export,
    add_import,
    add_presets,
    add_match,
    add_edit,
    add_ls,
    add_prune,
    add_cp,
    add_mv,
)
