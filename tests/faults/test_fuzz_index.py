"""Structured fuzzing of the index layer: block references, key sharing, restarts, shard counts.

Where ``test_fuzz.py`` flips random bytes, these generators build indexes that are
well-formed up to one structural lie (the CRCs are right, so every case reaches the
table and bundle logic): data blocks referenced twice, overlapping or out of order;
keys sharing more than the key before them has, or chains of ever longer keys;
restart arrays pointing inside entries, unsorted or of absurd length; headers
declaring 0, 1, many or 2**20 shards, with or without the files to match. Each case
runs everything a user can do under the fuzz harness's time limit and allocation bound
(a multiple of the files' size) and must end in a correct read or a
``CheckpointError``; the lies must be errors, and the truths must read as before.
"""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import numpy as np
import pytest
from fuzz_helpers import (  # the harness (time limit, allocation bound) and table builders
    block,
    check_case,
    copy_prefix,
    entry_starts,
    raw_block,
    table,
    with_restarts,
    with_trailer,
)

tf = pytest.importorskip("tensorflow")

import tfckpt  # noqa: E402
from tfckpt._proto.tensor_bundle_pb2 import BundleHeaderProto  # noqa: E402
from tfckpt.format.table import BlockHandle, TableReader  # noqa: E402
from tfckpt.rewrite.tasks import shard_tasks  # noqa: E402

CASES_PER_KIND = 12


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A TensorFlow-written checkpoint, its index entries, values, and the index cut into
    several data blocks (small blocks: many references to play with)."""
    prefix = str(tmp_path_factory.mktemp("fuzz-index") / "tf" / "model")
    rng = np.random.default_rng(7)
    names = [f"net/block{i % 5}/{'w' * (i % 7 + 1)}{i:02d}" for i in range(40)] + ["text"]
    tensors = [tf.constant(rng.standard_normal(i % 4 + 1).astype(np.float32)) for i in range(40)]
    tensors.append(tf.constant(np.array([b"a", b"bc", b""], dtype=object)))
    tf.raw_ops.SaveV2(
        prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors
    )
    index = Path(prefix + ".index").read_bytes()
    entries = TableReader(index).entries
    with tfckpt.open(prefix) as ckpt:
        values = {k: ckpt[k].tolist() for k in ckpt.keys()}
    blocks = []
    for i in range(0, len(entries), 9):
        chunk = entries[i : i + 9]
        sep = entries[i + 9][0][:-1] + b"\xff" if i + 9 < len(entries) else b"\xff"
        blocks.append((max(sep, chunk[-1][0]), block(chunk)))
    return {"prefix": prefix, "entries": entries, "values": values, "blocks": blocks}


U32 = struct.Struct("<I")  # a restart point or count, as the table stores it


def _case(base, tmp_path, n: int, index: bytes) -> str:
    prefix = copy_prefix(base["prefix"], tmp_path / f"c{n}")
    Path(prefix + ".index").write_bytes(index)
    return prefix


def _reads_as_before(base, prefix: str) -> None:
    with tfckpt.open(prefix) as ckpt:
        assert {k: ckpt[k].tolist() for k in ckpt.keys()} == base["values"]


def _handles(blocks) -> list[BlockHandle]:
    out, pos = [], 0
    for _, contents in blocks:
        out.append(BlockHandle(pos, len(contents)))
        pos += len(contents) + 5
    return out


# --- block references ---------------------------------------------------------------


def _reference_lies(rng: random.Random, blocks):
    """(description, index bytes) with the index block's handles rearranged."""
    refs = [(sep, i) for i, (sep, _) in enumerate(blocks)]
    handles = _handles(blocks)
    n = len(refs)
    i = rng.randrange(n)
    j = rng.randrange(n)
    kind = rng.choice(
        ["duplicate", "duplicate-later", "swap", "overlap", "empty-twice", "index-itself", "huge"]
    )
    if kind == "duplicate":
        refs.insert(i + 1, refs[i])
    elif kind == "duplicate-later":
        refs.append((b"\xff\xff", i))
    elif kind == "swap":
        if i == j:
            j = (i + 1) % n
        refs[i], refs[j] = refs[j], refs[i]
    elif kind == "overlap":
        h = handles[i]
        shift = rng.randint(1, max(h.size - 1, 1))
        refs.insert(i + 1, (refs[i][0], BlockHandle(h.offset + shift, h.size)))
    elif kind == "empty-twice":
        blocks = blocks + [(b"\xff", block([]))]
        refs = [(sep, k) for k, (sep, _) in enumerate(blocks)]
        refs += [(b"\xff\xff", len(blocks) - 1)] * rng.randint(1, 50)
    elif kind == "index-itself":
        total = sum(len(c) + 5 for _, c in blocks) + len(block([])) + 5
        refs.append((b"\xff\xff", BlockHandle(total, rng.randint(1, 64))))
    else:
        refs.insert(
            i,
            (
                refs[i][0],
                BlockHandle(rng.choice([1 << 40, (1 << 63) - 1]), rng.choice([0, 1 << 30])),
            ),
        )
    return f"{kind} (block {i}, {j})", table(blocks, refs)


def _nested(blocks):
    """A block hidden in the value of another, referenced as well: one stretch read twice."""
    inner = with_trailer(block([(b"\xff\xfe", b"inner")]))
    sep, contents = blocks[-1]
    entries = TableReader(table([(sep, contents)])).entries + [(b"\xff\xfd", b"::" + inner)]
    outer = block(entries)
    start = sum(len(c) + 5 for _, c in blocks[:-1]) + len(outer) - 8 - len(inner)
    refs = [(s, k) for k, (s, _) in enumerate(blocks[:-1])]
    refs += [(b"\xff\xfd", len(blocks) - 1), (b"\xff\xfe", BlockHandle(start, len(inner) - 5))]
    return table(blocks[:-1] + [(b"\xff\xfd", outer)], refs)


def test_block_references(base, tmp_path):
    rng = random.Random(11)
    assert TableReader(table(base["blocks"])).entries == base["entries"]
    cases = [("nested", _nested(base["blocks"]))]
    cases += [_reference_lies(rng, base["blocks"]) for _ in range(4 * CASES_PER_KIND)]
    for n, (what, index) in enumerate(cases):
        prefix = _case(base, tmp_path, n % 3, index)
        assert check_case(prefix, f"block references: {what}") == "error", what


# --- key sharing ------------------------------------------------------------------------


def _chain_block(n: int, step: int, restarts=(0,)) -> bytes:
    items = [(0, b"", b"")] + [(i * step, b"k" * step, b"") for i in range(n)]
    return raw_block(items, list(restarts))


def _sharing_lies(rng: random.Random, base):
    entries = base["entries"]
    kind = rng.choice(["chain", "chain-wide", "chain-in-index", "over-share", "restart-shares"])
    if kind in ("chain", "chain-wide"):
        n = rng.randint(2_000, 20_000) if kind == "chain" else rng.randint(300, 3_000)
        step = 1 if kind == "chain" else rng.randint(8, 64)
        return f"{kind} of {n} keys", table([(b"\xff", _chain_block(n, step))])
    if kind == "chain-in-index":
        n = rng.randint(2_000, 12_000)
        blocks = [(b"", block(entries[:1]))] + [(b"", block([]))] * n
        items = [(0, b"", 0)] + [(i, b"k", i + 1) for i in range(n)]
        return f"index chain of {n}", table(blocks, index_items=items)
    contents = block(entries, 1 if kind == "restart-shares" else 16)
    starts = entry_starts(contents)
    pos = starts[rng.randrange(1, len(starts))]
    raw = bytearray(contents)
    # The entry's first varint is its shared count: one byte in these small blocks.
    raw[pos] = rng.randint(1, 3) if kind == "restart-shares" else rng.randint(70, 127)
    return f"{kind} at {pos}", table([(b"\xff", bytes(raw))])


def test_key_sharing(base, tmp_path):
    rng = random.Random(12)
    for n in range(3 * CASES_PER_KIND):
        what, index = _sharing_lies(rng, base)
        prefix = _case(base, tmp_path, n % 3, index)
        assert check_case(prefix, f"key sharing: {what}") == "error", what
    # Any restart interval a writer may choose reads the same.
    for n, interval in enumerate((1, 2, 5, 16, 64, 1 << 20)):
        prefix = _case(base, tmp_path, 10 + n, table([(b"\xff", block(base["entries"], interval))]))
        assert check_case(prefix, f"restart interval {interval}") == "ok"
        _reads_as_before(base, prefix)


# --- restart arrays ------------------------------------------------------------------


def _restart_lies(rng: random.Random, base):
    contents = block(base["entries"], rng.choice([1, 4, 16]))
    starts = entry_starts(contents)
    (count,) = U32.unpack_from(contents, len(contents) - 4)
    restarts = list(struct.unpack_from(f"<{count}I", contents, len(contents) - 4 - 4 * count))
    limit = len(contents) - 4 - 4 * count
    kind = rng.choice(
        [
            "inside",
            "unsorted",
            "first-not-0",
            "past-entries",
            "huge-count",
            "count-beyond-block",
            "none",
            "duplicate",
        ]
    )
    if kind == "inside":
        inside = [p for p in range(1, limit) if p not in starts]
        restarts[rng.randrange(len(restarts))] = rng.choice(inside)
        restarts.sort()
    elif kind == "unsorted":
        if len(restarts) < 2:
            restarts = starts[:3]
        k = rng.randrange(1, len(restarts))
        restarts[k - 1], restarts[k] = restarts[k], restarts[k - 1]
        if restarts[0] != 0:
            restarts[0], restarts[1] = 0, restarts[0]
            restarts[1:] = sorted(restarts[1:], reverse=True)
    elif kind == "first-not-0":
        restarts = [p for p in starts if p][: rng.randint(1, 3)]
    elif kind == "past-entries":
        restarts.append(limit + rng.choice([0, 1, 1 << 20]))
    elif kind == "duplicate":
        k = rng.randrange(len(restarts))
        restarts.insert(k, restarts[k])
    elif kind == "none":
        restarts = []
    if kind == "huge-count":  # a restart array filling the block, all pointing at entry 0
        body = contents[:limit] + bytes(4 * rng.randint(10_000, 200_000))
        contents = body + U32.pack((len(body) - limit) // 4)
    elif kind == "count-beyond-block":
        contents = contents[:-4] + U32.pack(rng.choice([count + 10_000, (1 << 32) - 1]))
    else:
        contents = with_restarts(contents, restarts)
    return f"{kind} {restarts[:6]}", table([(b"\xff", contents)])


def test_restart_arrays(base, tmp_path):
    rng = random.Random(13)
    for n in range(4 * CASES_PER_KIND):
        what, index = _restart_lies(rng, base)
        prefix = _case(base, tmp_path, n % 3, index)
        assert check_case(prefix, f"restarts: {what}") == "error", what
    # Restarts at any entries that share nothing read the same.
    contents = block(base["entries"], 1)
    starts = entry_starts(contents)
    for n in range(CASES_PER_KIND):
        keep = [0] + sorted(rng.sample(starts[1:], rng.randrange(len(starts) - 1)))
        prefix = _case(
            base, tmp_path, 10 + n % 3, table([(b"\xff", with_restarts(contents, keep))])
        )
        assert check_case(prefix, f"restarts {keep[:6]}...") == "ok"
        _reads_as_before(base, prefix)


# --- shard counts in the header --------------------------------------------------------

SHARD_COUNTS = [0, 1, 2, 7, 1 << 20, (1 << 20) + 1, 10**9, -1]


def test_header_shard_counts(base, tmp_path):
    """Declared counts against the files there are: reads need only the shards entries use,
    and a conversion writes only shards that receive data."""
    n = 0
    for num_shards in SHARD_COUNTS:
        for files in ("matching", "as written"):
            n += 1
            entries = list(base["entries"])
            header = BundleHeaderProto.FromString(entries[0][1])
            header.num_shards = num_shards
            entries[0] = (b"", header.SerializeToString())
            prefix = _case(base, tmp_path, n, table([(b"\xff", block(entries))]))
            valid = 1 <= num_shards <= 1 << 20
            if files == "matching" and valid:
                os.rename(
                    prefix + ".data-00000-of-00001", f"{prefix}.data-00000-of-{num_shards:05d}"
                )
            what = f"num_shards {num_shards}, files {files}"
            outcome = check_case(prefix, what)
            if not valid or (files == "as written" and num_shards != 1):
                assert outcome == "error", what
                continue
            assert outcome == "ok", what
            _reads_as_before(base, prefix)
            tasks = shard_tasks(tfckpt.plan(prefix, tmp_path / f"out{n}" / "model", cast="float16"))
            assert len(tasks) == 1, what
