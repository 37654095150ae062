"""The commands on a directory of checkpoints: ls, prune, cp and mv. Each calls
:mod:`tfckpt.inspection.directories` and prints what it returns (or as JSON)."""

from __future__ import annotations

import argparse
import time

from tfckpt.cli.display import emit, human_bytes, print_json, table
from tfckpt.inspection import directories


def cmd_ls(args: argparse.Namespace) -> int:
    data = directories.ls(args.directory, storage_options=args.storage_options)
    if args.json:
        print_json(data)
        return 0
    if data["state_error"]:
        emit(f"state file: {data['state_error']}")
    elif not data["state_file"]:
        emit("no state file")
    rows = [["STEP", "NAME", "MODIFIED", "SIZE", "SHARDS", "FORMAT", "STATE FILE"]]
    for c in data["checkpoints"]:
        listed = "latest" if c["latest"] else "listed" if c["in_state_file"] else "-"
        rows.append(
            [
                "-" if c["step"] is None else str(c["step"]),
                c["name"],
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c["mtime"])),
                human_bytes(c["bytes"]),
                str(c["shards"]),
                c["format"],
                listed,
            ]
        )
    if data["checkpoints"]:
        table(rows, right={0, 3, 4})
    else:
        emit("no checkpoints")
    for o in data["orphans"]:
        emit(f"orphan: {o['path']} ({o['kind']})")
    for entry in data["missing"]:
        emit(f"missing: the state file names {entry}, which is not there")
    for entry in data["elsewhere"]:
        emit(f"elsewhere: the state file names {entry}, outside this directory")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    data = directories.prune(
        args.directory,
        keep_last=args.keep_last,
        keep_every_steps=args.keep_every_steps,
        keep=args.keep,
        dry_run=args.dry_run,
        min_age=args.min_age,
        storage_options=args.storage_options,
    )
    if args.json:
        print_json(data)
        return 0
    verb = "would remove" if data["dry_run"] else "removed"
    for c in data["removed"]:
        emit(f"{verb} {c['name']} ({len(c['files'])} files)")
    for o in data["orphans"]:
        emit(f"{verb} {o['path']} ({o['kind']})")
    for o in data["in_progress"]:
        emit(f"left {o['path']} ({o['kind']}, written under --min-age ago: a save in progress?)")
    kept = ", ".join(data["kept"]) or "nothing"
    emit(f"{'would keep' if data['dry_run'] else 'kept'} {kept}")
    return 0


def cmd_cp(args: argparse.Namespace) -> int:
    return _transfer(args, directories.copy, "copied")


def cmd_mv(args: argparse.Namespace) -> int:
    return _transfer(args, directories.move, "moved")


def _transfer(args: argparse.Namespace, fn, verb: str) -> int:
    data = fn(args.src, args.dst, overwrite=args.overwrite, storage_options=args.storage_options)
    if args.json:
        print_json(data)
        return 0
    for c in data["checkpoints"]:
        emit(f"{verb} {c['src']} -> {c['dst']} ({human_bytes(c['bytes'])})")
    if data["state_file"]:
        emit(f"state file: latest {data['state_file']['latest']}")
    for entry in data["dropped"]:
        emit(f"note: the state file's entry {entry} names no checkpoint copied; left out")
    return 0
