"""The parsers of the commands on a directory of checkpoints: ls, prune, cp, mv."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tfckpt.cli import options as opt
from tfckpt.cli.parsers.base import command

if TYPE_CHECKING:
    from tfckpt.cli.parsers.base import Subparsers


def add_ls(sub: Subparsers) -> None:
    """``tfckpt ls DIR``."""
    p = command(
        sub,
        "ls",
        "list a directory's checkpoints and leftovers",
        "Every checkpoint in DIR (V2 and V1; TF1 model.ckpt-N and TF2 ckpt-N): step, time, "
        "size (index and data), shards, whether the state file lists it.\n\nAlso the leftovers "
        "of interrupted saves of its checkpoint prefixes (data without an index, "
        "temporaries, part directories holding only parts) and "
        "state-file entries naming checkpoints that are not there.",
    )
    p.add_argument("directory", metavar="DIR", help="a run's directory (local or a URL)")
    opt.add_json(p)
    p.set_defaults(func="directories.cmd_ls")


def add_prune(sub: Subparsers) -> None:
    """``tfckpt prune DIR --keep-last N``."""
    p = command(
        sub,
        "prune",
        "delete old checkpoints and leftovers; rewrite the state file",
        "Keep the N newest numbered checkpoints of DIR (and the steps --keep-every-steps "
        "and --keep name); delete the others and the leftovers of interrupted saves.\n\n"
        "The leftovers are those of interrupted saves of DIR's own checkpoint prefixes "
        "(TensorFlow's PREFIX_temp/ part directories holding only parts, *.tempstate "
        "files, data without an index, killed tfckpt runs' temporaries; never eval_temp/ "
        "or other programs' files). The state file is rewritten as "
        "tf.train.CheckpointManager (max_to_keep=N) leaves it, the other kept checkpoints "
        "preserved for good. The "
        "state file is written before anything is deleted. Checkpoints whose name ends "
        "in no step are kept. A leftover written less than --min-age seconds ago may "
        "be a save in progress: it stays, and so does the checkpoint it is part of.",
    )
    p.add_argument("directory", metavar="DIR", help="a run's directory (local or a URL)")
    p.add_argument("--keep-last", type=int, required=True, metavar="N", help="N >= 1")
    p.add_argument(
        "--keep-every-steps", type=int, metavar="K", help="also keep steps that are multiples of K"
    )
    p.add_argument(
        "--keep", type=int, nargs="+", default=[], metavar="STEP", help="also keep these steps"
    )
    p.add_argument("--dry-run", action="store_true", help="only say what would be deleted")
    p.add_argument(
        "--min-age",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="leave leftovers younger than this alone (default 30; 0: remove them all)",
    )
    opt.add_json(p)
    p.set_defaults(func="directories.cmd_prune")


def _add_transfer(sub: Subparsers, name: str, help: str, description: str) -> None:
    p = command(sub, name, help, description)
    p.add_argument("src", metavar="SRC", help="a checkpoint prefix, or a run's directory")
    opt.add_output(p, "dst", "DST", "the new prefix, or a directory (for a run: its new directory)")
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
        "data). A failure before that leaves the source as it was; a run whose state "
        "file cannot be read is refused before anything is copied.",
    )
