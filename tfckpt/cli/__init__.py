"""Command line: ``tfckpt COMMAND ...`` / ``python -m tfckpt COMMAND ...``.

Argument parsing and the entry point; the commands live in :mod:`tfckpt.commands`,
the work in library functions.
Errors about checkpoints print one line on stderr and exit with status 2.

Human-readable output reaches the terminal only through :func:`tfckpt.display.emit`,
which escapes
what names, paths and messages from files could do to a terminal; ``--json`` prints
JSON alone on stdout, names exact.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
import traceback
import warnings

from tfckpt.cli.display import emit
from tfckpt.errors import CheckpointError, CheckpointPathWarning
from tfckpt.io.storage import using_options
from tfckpt.rewrite import collector
from tfckpt.rewrite.cast import CAST_TARGETS, OVERFLOW_POLICIES
from tfckpt.rewrite.options import BACKENDS, DEFAULTS, PREFER
from tfckpt.version import __version__

EXIT_ERROR = 2


def parse_size(text: str, *, minimum: int = 1) -> int:
    """A byte count as the command line takes it (``64M``, ``1.5GiB``, ``4096``).

    >>> parse_size("64M")
    67108864
    """
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    m = re.fullmatch(r"\s*(\d{1,30}(?:\.\d{1,30})?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not m or int(float(m[1]) * units[m[2]]) < minimum:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 512M, 2G)")
    return int(float(m[1]) * units[m[2]])


def _parse_size_or_zero(text: str) -> int:
    return parse_size(text, minimum=0)


def _add_dtype_rule_options(g) -> None:
    g.add_argument(
        "--keep-dtype",
        metavar="REGEX",
        action="append",
        help="tensors whose source name (TF2: key or model path) matches keep their dtype "
        "(repeatable; before --dtype-rule and --dtype)",
    )
    g.add_argument(
        "--dtype-rule",
        metavar="REGEX=DTYPE",
        action="append",
        help="cast floating-point tensors whose source name (TF2: key or model path) matches "
        "to DTYPE (repeatable; the first matching rule wins, before --dtype)",
    )


def _add_transform_options(p: argparse.ArgumentParser, *, dtype_required: bool = False) -> None:
    g = p.add_argument_group("cast")
    g.add_argument(
        "--dtype",
        choices=CAST_TARGETS,
        required=dtype_required,
        help="cast floating-point tensors to this dtype",
    )
    g.add_argument(
        "--from",
        dest="cast_from",
        metavar="DTYPES",
        help="only cast these source dtypes (comma-separated, e.g. float32,float64)",
    )
    _add_dtype_rule_options(g)
    g.add_argument(
        "--backend",
        choices=BACKENDS,
        default=DEFAULTS.backend,
        help="who rounds: numpy (default), tf (tf.cast on the best device for "
        "tensors of at least --tf-threshold), auto (tf only with a GPU)",
    )
    g.add_argument(
        "--tf-threshold",
        type=_parse_size_or_zero,
        default=DEFAULTS.tf_threshold,
        metavar="SIZE",
        help="smallest tensor cast by the tf backend (default 64M)",
    )
    g.add_argument(
        "--overflow",
        choices=OVERFLOW_POLICIES,
        default=DEFAULTS.overflow,
        help="values beyond the target's range: fail (default), clip to the "
        "largest finite value, or keep IEEE inf",
    )
    g = p.add_argument_group("select")
    g.add_argument(
        "--include",
        metavar="REGEX",
        action="append",
        help="keep only tensors whose name (TF2: key or model path) matches (repeatable)",
    )
    g.add_argument(
        "--exclude",
        metavar="REGEX",
        action="append",
        help="drop tensors whose name matches (repeatable, after --include)",
    )
    g.add_argument(
        "--drop-object",
        metavar="NAME_OR_PATH",
        action="append",
        help="TF2: cut this object from the object graph, with everything only it "
        "reaches (a bare name anywhere, or a path a/b/c from the root)",
    )
    g = p.add_argument_group("rename")
    g.add_argument(
        "--map",
        metavar="OLD=NEW",
        action="append",
        help="rename: regex OLD matched at the start of names, replaced by NEW "
        "(back-references allowed); first matching rule wins",
    )
    g.add_argument("--map-file", metavar="F.json", help="exact renames as a JSON object")
    g = p.add_argument_group("output")
    g.add_argument(
        "--prefer",
        choices=PREFER[1:],
        help="which source wins a name present in several (default: error)",
    )
    g.add_argument(
        "--max-shard-bytes",
        type=parse_size,
        metavar="SIZE",
        help="re-shard the output (default: keep the sources' shards)",
    )
    g.add_argument("--overwrite", action="store_true", help="replace an existing destination")
    g.add_argument(
        "--no-fsync",
        dest="durable",
        action="store_false",
        help="skip the fsyncs before the commit: faster; a killed run still leaves "
        "no partial checkpoint, but a power cut may",
    )
    g.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    g.add_argument("--json", action="store_true", help="print the plan or summary as JSON")
    g.add_argument(
        "--executor",
        metavar="SPEC",
        help="run the per-shard tasks on: threads:N, processes:N, or a Dask "
        "scheduler dask://HOST:PORT (default: here, one after another)",
    )
    g.add_argument(
        "--chunk-bytes",
        type=parse_size,
        default=DEFAULTS.chunk_bytes,
        metavar="SIZE",
        help="memory budget for tensor data in flight (default 64M)",
    )
    p.set_defaults(func="cmd_transform")


EXAMPLES = {
    "dump": """examples:
  tfckpt dump train/model.ckpt-7
  tfckpt dump train/ --filter '^optimizer/' --json
  tfckpt dump train/ --tensor global_step --tensor '^logits/' --full
  tfckpt dump saved_model_dir --object-graph
  tfckpt dump train/ --all""",
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
  tfckpt export bert/bert_model.ckpt hf/model.safetensors --map-file bert2hf.json \\
      --permute 'dense/kernel$=1,0' --max-shard-bytes 2G""",
    "import": """examples:
  tfckpt import model.safetensors ckpt/model
  tfckpt import hf/model.safetensors.index.json ckpt/model --permute 'kernel$=1,0'""",
}


def _sub(sub, name: str, help: str, description: str) -> argparse.ArgumentParser:
    p = sub.add_parser(
        name,
        help=help,
        description=description,
        epilog=EXAMPLES[name],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--storage-option",
        dest="storage_options",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="an fsspec option for every URL (repeatable): true/false, numbers and JSON "
        "are typed, a dotted KEY sets a nested one, e.g. anon=true, "
        "endpoint_url=http://127.0.0.1:9000, client_kwargs.region_name=eu-west-1",
    )
    return p


MAX_OPTION_TEXT = 1 << 16  # characters of one --storage-option
MAX_OPTION_DEPTH = 16  # levels of nesting, in a dotted key and its JSON value together


def _depth(value: object, limit: int) -> int:
    """How deeply ``value`` nests lists and dicts (a scalar: 0), counted up to ``limit + 1``
    (without recursion: the value may be nested deeper than Python's stack)."""
    depth, level = 0, [value]
    while depth <= limit:
        containers = [x for x in level if isinstance(x, (list, dict))]
        if not containers:
            break
        depth += 1
        level = [v for x in containers for v in (x.values() if isinstance(x, dict) else x)]
    return depth


def _parse_storage_option(text: str) -> tuple[list[str], object]:
    """``KEY=VALUE`` as (the dotted key's parts, the typed value)."""
    key, sep, raw = text.partition("=")
    parts = key.strip().split(".")
    if len(text) > MAX_OPTION_TEXT:
        raise CheckpointError(
            f"--storage-option {text[:20]!r}...: longer than {MAX_OPTION_TEXT} characters"
        )
    if not sep or not all(parts):
        raise CheckpointError(f"--storage-option takes KEY=VALUE, not {text!r}")
    value = _typed_option_value(key, raw)
    if len(parts) + _depth(value, MAX_OPTION_DEPTH) > MAX_OPTION_DEPTH:
        raise CheckpointError(
            f"--storage-option {key}: nested more than {MAX_OPTION_DEPTH} levels deep"
        )
    return parts, value


def _typed_option_value(key: str, raw: str) -> object:
    value: object = raw
    lowered = raw.strip().lower()
    if lowered in ("true", "false"):
        value = lowered == "true"
    elif lowered in ("none", "null"):
        value = None
    elif re.fullmatch(r"[+-]?\d+", raw.strip()):
        value = int(raw)
    elif raw.strip()[:1] in ("{", "[") or re.fullmatch(
        r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?", raw.strip()
    ):
        try:
            value = json.loads(raw)
        except ValueError as e:
            raise CheckpointError(f"--storage-option {key}: not JSON: {e}") from None
        except RecursionError:
            raise CheckpointError(
                f"--storage-option {key}: nested more than {MAX_OPTION_DEPTH} levels deep"
            ) from None
    return value


def _storage_options(pairs: list[tuple[list[str], object]]) -> dict | None:
    """The ``--storage-option`` pairs (:func:`_parse_storage_option`) as one (nested)
    dict; None without any."""
    if not pairs:
        return None
    out: dict = {}
    for parts, value in pairs:
        level = out
        for i, part in enumerate(parts[:-1]):
            level = level.setdefault(part, {})
            if not isinstance(level, dict):
                raise CheckpointError(
                    f"--storage-option {'.'.join(parts)}: {'.'.join(parts[: i + 1])} "
                    "is set to a value, not to options"
                )
        level[parts[-1]] = value
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfckpt",
        description="Read, inspect and rewrite TensorFlow checkpoints directly from their files.",
    )
    parser.add_argument("--version", action="version", version=f"tfckpt {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = _sub(
        sub,
        "dump",
        "list the tensors of a checkpoint",
        "Show what a checkpoint holds; reads only the index unless values are asked for.",
    )
    p.add_argument("path", help="checkpoint prefix, .index file, directory or SavedModel")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--filter", metavar="REGEX", help="only tensors whose name matches")
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
    p.set_defaults(func="cmd_dump")

    p = _sub(
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
    p.add_argument("--filter", metavar="REGEX", help="only tensors whose name matches")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func="cmd_diff")

    p = _sub(
        sub,
        "stats",
        "value statistics, and what a float16/bfloat16 cast would do",
        "Per tensor: min, max, mean, std, NaN and inf counts, fraction of zeros; for "
        "floating-point tensors, how many values would overflow, become zero or become "
        "subnormal in float16 and bfloat16. Streams in bounded memory.",
    )
    p.add_argument("path")
    p.add_argument("--filter", metavar="REGEX", help="only tensors whose name matches")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func="cmd_stats")

    p = _sub(
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
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func="cmd_verify")

    p = _sub(
        sub,
        "convert",
        "cast floating-point tensors to another dtype",
        "Write a copy of SRC with floating-point tensors cast, e.g. float32 -> float16. "
        "Without --dtype, a plain copy: the way to turn a V1 checkpoint into a V2 one. "
        "Accepts every transform option.",
    )
    p.add_argument("src")
    p.add_argument("dst", help="output prefix, or a directory (the source's name is kept)")
    _add_transform_options(p)

    p = _sub(
        sub,
        "rename",
        "rename tensors by regex rules or an exact map",
        "Write a copy of SRC with tensors renamed; TF2 object graphs are re-keyed so "
        "restore still finds every value.",
    )
    p.add_argument("src")
    p.add_argument("dst")
    _add_transform_options(p)

    p = _sub(
        sub,
        "select",
        "keep only some tensors or TF2 objects",
        "Write a copy of SRC with only the selected tensors.",
    )
    p.add_argument("src")
    p.add_argument("dst")
    _add_transform_options(p)

    p = _sub(
        sub,
        "merge",
        "combine several checkpoints into one",
        "Write one checkpoint holding the tensors of all SOURCES; TF2 object graphs are "
        "joined at the root.",
    )
    p.add_argument("sources", nargs="+", metavar="SRC")
    p.add_argument("-o", "--output", required=True, metavar="DST")
    _add_transform_options(p)

    p = _sub(
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
        "by their keys.",
    )
    p.add_argument("template")
    p.add_argument("sources", nargs="+", metavar="SRC")
    p.add_argument("-o", "--output", required=True, metavar="DST")
    _add_transform_options(p)
    p.add_argument(
        "--allow-missing",
        action="store_true",
        help="keep the template's value where no source has the tensor",
    )
    p.set_defaults(func="cmd_graft")

    p = _sub(
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
    _add_transform_options(p)
    p.set_defaults(func="cmd_flatten")

    p = _sub(
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
    p.add_argument(
        "--dtype", choices=CAST_TARGETS, help="write floating-point tensors in this dtype"
    )
    p.add_argument(
        "--from",
        dest="cast_from",
        metavar="DTYPES",
        help="only cast these source dtypes (comma-separated, e.g. float32,float64)",
    )
    _add_dtype_rule_options(p)
    p.add_argument(
        "--overflow",
        choices=OVERFLOW_POLICIES,
        default=DEFAULTS.overflow,
        help="means beyond the output dtype's range: fail (default), clip, or keep IEEE inf",
    )
    p.add_argument(
        "--drop-object",
        metavar="NAME_OR_PATH",
        action="append",
        help="TF2: cut this object from the object graph (as in select)",
    )
    p.add_argument(
        "--max-shard-bytes",
        type=parse_size,
        metavar="SIZE",
        help="re-shard the output (default: the newest source's shards)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing destination")
    p.add_argument(
        "--no-fsync", dest="durable", action="store_false", help="skip the fsyncs before the commit"
    )
    p.add_argument(
        "--chunk-bytes",
        type=parse_size,
        default=DEFAULTS.chunk_bytes,
        metavar="SIZE",
        help="memory budget for tensor data in flight, all sources together (default 64M)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    p.add_argument("--json", action="store_true", help="print the plan or summary as JSON")
    p.set_defaults(func="cmd_average")

    p = _sub(
        sub,
        "export",
        "write the tensors to safetensors or npz",
        "Stream the tensors of SRC into OUT.safetensors (sharded with --max-shard-bytes, "
        "as Hugging Face does) or OUT.npz, in bounded memory. TF2 keys become readable "
        "and the optimizer's state is left out unless asked for. Accepts every "
        "transform option; --map and --map-file apply to the readable names.",
    )
    p.add_argument("src")
    p.add_argument("out", help="OUT.safetensors or OUT.npz")
    _add_export_options(p)
    g = p.add_argument_group("export")
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

    p = _sub(
        sub,
        "import",
        "read safetensors or npz into a checkpoint",
        "Stream the tensors of IN (a .safetensors file, the .index.json of sharded "
        "ones, or an .npz) into a V2 checkpoint at OUT_PREFIX.",
    )
    p.add_argument("src", metavar="IN")
    p.add_argument("out", metavar="OUT_PREFIX")
    _add_export_options(p)
    return parser


def _add_export_options(p: argparse.ArgumentParser) -> None:
    _add_transform_options(p)
    p.add_argument(
        "--permute",
        metavar="REGEX=AXES",
        action="append",
        help="reorder the axes of tensors whose (new) name matches, e.g. 'kernel$=1,0' "
        "([in,out] -> [out,in]) or 'conv.*/kernel$=3,2,0,1' (HWIO -> OIHW); first match wins",
    )
    p.set_defaults(func="cmd_export")


def _show_warning(default):
    """Library warnings about paths as one ``tfckpt: note:`` line on stderr; others as usual."""

    shown: set[str] = set()  # one note per fact, however many times a path is resolved

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, CheckpointPathWarning):
            if str(message) not in shown:
                shown.add(str(message))
                emit(f"tfckpt: note: {message}", err=True)
        else:
            default(message, category, filename, lineno, file, line)

    return show


def main(argv: list[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):
        # An output encoding narrower than UTF-8 (PYTHONIOENCODING=ascii) shows an escape
        # for a character of a name it lacks, not a traceback.
        if (
            hasattr(stream, "reconfigure")
            and (stream.encoding or "").lower().replace("-", "") != "utf8"
        ):
            stream.reconfigure(errors="backslashreplace")
    program = argv is None and threading.current_thread() is threading.main_thread()
    try:
        with collector.paused():  # a command's records, by the hundred thousand
            try:
                return _main(argv)
            finally:
                if program:
                    # The program itself (not a caller in-process): its work is over,
                    # and a Ctrl-C from here on (the collector resuming, the exit)
                    # would only turn a finished run into an interrupted one.
                    signal.signal(signal.SIGINT, signal.SIG_IGN)
    except KeyboardInterrupt:
        print("tfckpt: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with (
            warnings.catch_warnings(),
            using_options(
                _storage_options(list(map(_parse_storage_option, args.storage_options))),
                "--storage-option",
            ),
        ):
            warnings.simplefilter("default", CheckpointPathWarning)
            warnings.showwarning = _show_warning(warnings.showwarning)
            # Commands load with their module, when one runs: --help and --version need none.
            from tfckpt.cli import commands

            return getattr(commands, args.func)(args)
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, like other Unix tools.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (CheckpointError, re.error, OSError) as e:
        if args.debug:
            for line in traceback.format_exc().splitlines():
                emit(line, err=True)
        if isinstance(e, re.error):
            message = f"bad regular expression: {e}"
        elif isinstance(e, OSError) and not isinstance(e, CheckpointError):
            message = f"{e.filename or ''}: {e.strerror or e}".lstrip(": ")
        else:
            message = str(e)
        emit(f"tfckpt: error: {message}", err=True)
        return EXIT_ERROR
