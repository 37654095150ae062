"""Options that several commands share, each defined once: the value types (sizes), and
helpers that add one option or a titled group of them to a command's parser.

A command that words an option differently (``average`` averages rather than casts)
passes its own help text; name, type, default and destination stay the same everywhere.
"""

from __future__ import annotations

import argparse
import contextlib
import re
from collections.abc import Iterator

from tfckpt.format import dtypes as _dt
from tfckpt.rewrite.cast import CAST_TARGETS, OVERFLOW_POLICIES
from tfckpt.rewrite.options import BACKENDS, DEFAULTS, PREFER

# What options are added to: a parser or one of its argument groups (argparse names their
# common base only privately).
Container = argparse._ActionsContainer


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


SHARED = "shared options"

# Markers on a parser's actions (attributes argparse leaves alone): whether an option is
# one many commands share (the transform groups, storage, debug) rather than the
# command's own, and whether a command's short --help shows it. Every option stays a
# real action of the parser: --help-all, completion and the docs' tables list it.
SHARED_MARK = "tfckpt_shared"
ESSENTIAL_MARK = "tfckpt_essential"

COMMON = ("--dtype", "--include", "--exclude", "--overwrite", "--dry-run")
"""The shared options a command's short help shows (where the command has them): the
ones people use most. Each command's own options are shown too; the rest are behind
``--help-all``."""


@contextlib.contextmanager
def shared(p: Container) -> Iterator[None]:
    """Mark the options added inside the block as shared ones (see :data:`COMMON`)."""
    start = len(p._actions)  # a group's list is its parser's
    yield
    for action in p._actions[start:]:
        setattr(action, SHARED_MARK, True)


def is_shared(action: argparse.Action) -> bool:
    """Whether ``action`` is an option many commands share rather than the command's own."""
    return bool(getattr(action, SHARED_MARK, False))


def is_essential(action: argparse.Action) -> bool:
    """Whether a command's short help shows ``action``: as :func:`brief` set it, else a
    positional, a command's own option, or a shared one in :data:`COMMON`."""
    marked = getattr(action, ESSENTIAL_MARK, None)
    if marked is not None:
        return bool(marked)
    if isinstance(action, argparse._HelpAction) or getattr(action, "help_all", False):
        return False  # the short help's last line names them
    if not action.option_strings or not is_shared(action):
        return True
    return any(o in COMMON for o in action.option_strings)


def brief(p: argparse.ArgumentParser, *, show: tuple = (), hide: tuple = ()) -> None:
    """A command's own judgement of its short help: the options (by flag) it shows
    beyond :func:`is_essential`'s, and those it leaves to ``--help-all``."""
    for flags, shown in ((show, True), (hide, False)):
        for flag in flags:
            found = [a for a in p._actions if flag in a.option_strings]
            if not found:
                raise ValueError(f"{p.prog}: no option {flag}")
            setattr(found[0], ESSENTIAL_MARK, shown)


def shared_group(p: argparse.ArgumentParser) -> Container:
    """The group of options a command shares with the others (storage, debug, who runs
    and rounds, memory), made on first use; its help lists them after the command's own
    (see :func:`tfckpt.cli.parsers.base.finish`)."""
    for g in p._action_groups:
        if g.title == SHARED:
            return g
    return p.add_argument_group(SHARED)


def dtype_name(text: str) -> str:
    """A cast target as the command line takes it: TensorFlow's name or any other one
    :func:`tfckpt.format.dtypes.lookup` knows (``half``, ``fp16``, ``bf16``...), as
    TensorFlow's name; an unknown one suggests the nearest."""
    try:
        dtype = _dt.lookup(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if dtype.name not in CAST_TARGETS:
        raise argparse.ArgumentTypeError(
            f"cannot cast to {text!r}; targets: {', '.join(CAST_TARGETS)}"
        )
    return dtype.name


DTYPE_NAMES = "float16, bfloat16, float32, float64, float8_e4m3fn, float8_e5m2"


def add_storage_option(p: Container) -> None:
    """``--storage-option KEY=VALUE``: the texts, which :mod:`tfckpt.cli` makes the checked
    options ``args.storage_options`` that each command hands to the library."""
    p.add_argument(
        "--storage-option",
        dest="storage_option_texts",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="an fsspec option for every URL (repeatable): true/false, numbers and JSON "
        "are typed, a dotted KEY sets a nested one, e.g. anon=true, "
        "endpoint_url=http://127.0.0.1:9000, client_kwargs.region_name=eu-west-1",
    )


OUTPUT_FLAGS = ("-o", "--output")


def add_output(
    p: argparse.ArgumentParser, dest: str, metavar: str, help: str, *, optional: bool = False
) -> None:
    """The output of a command that writes, named either way: the positional ``dest``
    (``metavar``) or ``-o/--output``; :class:`tfckpt.cli.parsers.base.Parser` takes one
    of the two (both, or neither where one is needed, is an error) into ``dest``.
    ``optional``: neither is needed either (``edit --in-place``)."""
    positional = p.add_argument(dest, metavar=metavar, nargs="?" if optional else None, help=help)
    flag = p.add_argument(
        *OUTPUT_FLAGS, dest="output", metavar=metavar, help=f"the same as {metavar}: give either"
    )
    p.output_alias = (positional, flag)  # type: ignore[attr-defined]  # read by Parser
    p.set_defaults(output_arg=dest)


def add_output_option(p: Container, help: str, metavar: str = "DST", **kwargs) -> None:
    """``-o/--output``: the output of a command that takes several sources."""
    p.add_argument(*OUTPUT_FLAGS, dest="output", metavar=metavar, help=help, **kwargs)
    p.set_defaults(output_arg="output")


def add_json(p: Container, help: str = "machine-readable output") -> None:
    """``--json``."""
    p.add_argument("--json", action="store_true", help=help)


def _count(text: str) -> int:
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"not a count: {text!r} (0, 1, 2, ...)")
    return int(text)


def add_report_top(p: Container) -> None:
    """``--report-top N``: how many tensors an HTML report draws (the table lists all)."""
    p.add_argument(
        "--report-top",
        type=_count,
        default=12,  # report.DEFAULT_TOP, not imported: the parsers load no report code
        metavar="N",
        help="tensors the HTML report draws, the most affected first (default 12; its "
        "table lists every tensor)",
    )


def add_filter(p: Container) -> None:
    """``--filter REGEX``: the tensors an inspecting command looks at."""
    p.add_argument("--filter", metavar="REGEX", help="only tensors whose name matches")


def add_dtype_options(
    g: Container, *, dtype_help: str = "cast floating-point tensors to this dtype"
) -> None:
    """``--dtype``, ``--from``, ``--keep-dtype``, ``--dtype-rule`` and
    ``--cast-bookkeeping``: which tensors are written in which floating-point dtype."""
    g.add_argument("--dtype", type=dtype_name, metavar="DTYPE", help=f"{dtype_help}: {DTYPE_NAMES}")
    g.add_argument(
        "--from",
        dest="cast_from",
        metavar="DTYPES",
        help="only cast these source dtypes (comma-separated, e.g. float32,float64; any "
        "name --dtype takes)",
    )
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
    g.add_argument(
        "--cast-bookkeeping",
        action="store_true",
        help="--dtype casts training bookkeeping too (metrics' state, an optimizer's step, "
        "learning rate and other hyperparameters, save_counter, global_step, TF1 Adam's "
        "beta1_power/beta2_power), which otherwise keeps its dtype as TensorFlow keeps it "
        "in a model of any dtype",
    )


def add_overflow(
    g: Container,
    help: str = "values beyond the target's range: fail (default), clip to the "
    "largest finite value, or keep IEEE inf",
) -> None:
    """``--overflow``: what a cast does with values beyond the target's range."""
    g.add_argument("--overflow", choices=OVERFLOW_POLICIES, default=DEFAULTS.overflow, help=help)


def add_cast_group(p: argparse.ArgumentParser) -> None:
    """The transforms' "cast" group: the dtype options, who rounds, and overflow."""
    g = p.add_argument_group("cast")
    add_dtype_options(g)
    add_overflow(g)
    shared = shared_group(p)
    shared.add_argument(
        "--backend",
        choices=BACKENDS,
        default=DEFAULTS.backend,
        help="who rounds: numpy (the default: NumKong's SIMD kernels where the CPU has "
        "them, else numpy and ml-dtypes; the same bits either way), tf (tf.cast on the "
        "best device for tensors of at least --tf-threshold), auto (tf only with a GPU)",
    )
    shared.add_argument(
        "--tf-threshold",
        type=_parse_size_or_zero,
        default=DEFAULTS.tf_threshold,
        metavar="SIZE",
        help="smallest tensor cast by the tf backend (default 64M)",
    )


def add_drop_object(
    g: Container,
    help: str = "TF2: cut this object (a name, or a path a/b/c from the root) and all "
    "that only it reaches from the object graph",
) -> None:
    """``--drop-object``: TF2 objects cut from the object graph."""
    g.add_argument("--drop-object", metavar="NAME_OR_PATH", action="append", help=help)


def add_select_group(p: argparse.ArgumentParser) -> None:
    """The transforms' "select" group: ``--include``, ``--exclude``, ``--drop-object``."""
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
        help="drop matching tensors (repeatable; after --include)",
    )
    add_drop_object(g)


def add_rename_group(p: argparse.ArgumentParser) -> None:
    """The transforms' "rename" group: ``--map`` rules and an exact ``--map-file``."""
    g = p.add_argument_group("rename")
    g.add_argument(
        "--map",
        metavar="OLD=NEW",
        action="append",
        help="rename: regex OLD at the start of names becomes NEW (\\1 allowed); the "
        "first matching rule wins",
    )
    g.add_argument("--map-file", metavar="F.json", help="exact renames as a JSON object")
    g.add_argument(
        "--rules",
        metavar="F.toml",
        help="a rules file: maps, renames, excludes, value transforms and dtype rules "
        "(the flags' rules are tried first)",
    )
    g.add_argument(
        "--allow-unmapped",
        action="store_true",
        help="with [[map]] rules: leave out the tensors no rule names (default: error)",
    )
    add_allow_unmatched(g)


def add_allow_unmatched(g: Container) -> None:
    """``--allow-unmatched``: patterns that match no tensor, and empty outputs, allowed."""
    g.add_argument(
        "--allow-unmatched",
        action="store_true",
        help="allow a pattern (--include, --exclude, --map, --map-file, --keep-dtype, "
        "--dtype-rule, or a rules file's) that matches no tensor, and an output that keeps "
        "none (default: an error naming the pattern and the nearest names)",
    )


def add_write_options(
    g: Container,
    *,
    shard_help: str = "re-shard the output (default: keep the sources' shards)",
    fsync_help: str = "skip the fsyncs before the commit: faster; a killed run still leaves "
    "no partial checkpoint, but a power cut may",
) -> None:
    """``--max-shard-bytes``, ``--overwrite`` and ``--no-fsync``: how the output is written."""
    g.add_argument("--max-shard-bytes", type=parse_size, metavar="SIZE", help=shard_help)
    g.add_argument("--overwrite", action="store_true", help="replace an existing destination")
    g.add_argument("--no-fsync", dest="durable", action="store_false", help=fsync_help)


def add_plan_output(g: Container) -> None:
    """``--dry-run`` and ``--json``: the plan instead of a run, and either as JSON."""
    g.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    add_json(g, "print the plan or summary as JSON")


def add_chunk_bytes(
    g: Container, help: str = "memory budget for tensor data in flight (default 64M)"
) -> None:
    """``--chunk-bytes``: the memory budget for tensor data in flight."""
    g.add_argument(
        "--chunk-bytes", type=parse_size, default=DEFAULTS.chunk_bytes, metavar="SIZE", help=help
    )


def add_output_group(p: argparse.ArgumentParser) -> Container:
    """The transforms' "output" group: conflicts, shards, durability, dry runs, executors;
    the group."""
    g = p.add_argument_group("output")
    g.add_argument(
        "--prefer",
        choices=PREFER[1:],
        help="which source wins a name present in several (default: error)",
    )
    add_write_options(g)
    add_plan_output(g)
    shared = shared_group(p)
    shared.add_argument(
        "--executor",
        metavar="SPEC",
        help="run the per-shard tasks on: threads:N, processes:N, or a Dask "
        "scheduler dask://HOST:PORT (default: here, one after another)",
    )
    add_chunk_bytes(shared)
    return g


def add_transform_options(p: argparse.ArgumentParser, *, checkpoint_only: bool = False) -> None:
    """Every transform option, in the groups cast, select, rename, values and output
    (with ``--checkpoint-only`` for the commands that take one source), marked
    :func:`shared`."""
    with shared(p):
        add_cast_group(p)
        add_select_group(p)
        add_rename_group(p)
        add_values_group(p)
        g = add_output_group(p)
        if checkpoint_only:
            add_checkpoint_only(g)


def add_checkpoint_only(g: Container) -> None:
    """``--checkpoint-only``: a SavedModel's variables alone, not a SavedModel."""
    g.add_argument(
        "--checkpoint-only",
        action="store_true",
        help="from a SavedModel directory to a directory: write its variables alone, as a "
        "checkpoint (DST/variables), not a SavedModel",
    )


def add_values_group(p: argparse.ArgumentParser) -> None:
    """The transforms' "values" group: ``--split``, ``--concat``, ``--permute``,
    ``--reshape``, ``--squeeze``."""
    g = p.add_argument_group("values")
    g.add_argument(
        "--split",
        metavar="REGEX=AXIS:NEW1,NEW2,...",
        action="append",
        help="cut tensors whose (new) name matches into equal parts along AXIS, named "
        "NEW1, NEW2... (\\1 is the match's group), e.g. "
        "'c_attn\\.(weight|bias)$=-1:q.\\1,k.\\1,v.\\1'; before --permute; first match wins",
    )
    g.add_argument(
        "--concat",
        metavar="NEW=AXIS:REGEX1,REGEX2,...",
        action="append",
        help="join along AXIS each tensor whose (new) name REGEX1 matches whole with "
        "those REGEX2... name once expanded with its match, into NEW, e.g. "
        "'h.\\1.qkv=0:h\\.(\\d+)\\.q,h\\.\\1\\.k,h\\.\\1\\.v'; before --permute",
    )
    g.add_argument(
        "--permute",
        metavar="REGEX=AXES",
        action="append",
        help="reorder the axes of tensors whose (new) name matches, e.g. 'kernel$=1,0' "
        "([in,out] -> [out,in]) or 'conv.*/kernel$=3,2,0,1' (HWIO -> OIHW); first match wins",
    )
    g.add_argument(
        "--reshape",
        metavar="REGEX=SHAPE",
        action="append",
        help="give tensors whose (new) name matches this shape, elements in order, after "
        "--permute (e.g. 'qkv$=768,3,768'; one -1 allowed); first match wins",
    )
    g.add_argument(
        "--squeeze",
        metavar="REGEX",
        action="append",
        help="drop the axes of size 1 of tensors whose (new) name matches (unless a "
        "--reshape matches), e.g. '/c_attn/w$' ([1,768,2304] -> [768,2304])",
    )
