"""The commands behind the command line: each reads its parsed arguments, calls the library
and prints what it returns, through :mod:`tfckpt.cli.display` (or as JSON).

- :mod:`~tfckpt.cli.commands.inspect`: dump, diff, stats, verify
- :mod:`~tfckpt.cli.commands.transform`: convert, rename, select, merge, graft, flatten,
  average, export, import, edit
- :mod:`~tfckpt.cli.commands.matching`: match
- :mod:`~tfckpt.cli.commands.checking`: check, and dump of a ``.meta`` graph
- :mod:`~tfckpt.cli.commands.directories`: ls, prune, cp, mv
- :mod:`~tfckpt.cli.commands.completion`: completion

Each command's parser (:mod:`tfckpt.cli.parsers`) names its function as
``args.func = "MODULE.FUNCTION"``.
"""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    """Run the command ``args.func`` names; its exit status.

    Only that command's module is loaded, and only now: ``--help`` and ``--version`` need
    none, and ``dump`` none of the engine.
    """
    module, _, function = args.func.partition(".")
    # Imported here, by name, so that the import graph (and its contracts) sees them.
    if module == "inspect":
        from tfckpt.cli.commands import inspect as commands
    elif module == "transform":
        from tfckpt.cli.commands import transform as commands  # type: ignore[no-redef]
    elif module == "matching":
        from tfckpt.cli.commands import matching as commands  # type: ignore[no-redef]
    elif module == "checking":
        from tfckpt.cli.commands import checking as commands  # type: ignore[no-redef]
    elif module == "directories":
        from tfckpt.cli.commands import directories as commands  # type: ignore[no-redef]
    elif module == "completion":
        from tfckpt.cli.commands import completion as commands  # type: ignore[no-redef]
    else:
        raise AssertionError(args.func)
    return getattr(commands, function)(args)
