"""``tfckpt import`` against hostile files: what the files say never leads elsewhere.

Shard names from an index resolve only beside it; a safetensors header is refused
exactly when the ``safetensors`` package itself refuses the same bytes; npz members
inflate no further than their .npy headers declare; every refusal is one
``CheckpointError`` naming the file (one line from the command line), reached in time
linear in the file; a failed import leaves no directory it made, and it holds no more
memory than ``convert`` of the same tensors with the same chunk budget.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import assert_cli_error, in_process, run_text, user_env

import tfckpt

safetensors = pytest.importorskip("safetensors")
from safetensors import safe_open  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

# -- building files byte by byte


def st_bytes(header: str | bytes, data: bytes = b"", length: int | None = None) -> bytes:
    """A safetensors file: little-endian u64 header length, header, data."""
    text = header.encode() if isinstance(header, str) else header
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def spec(dtype: str, shape, begin: int, end: int, **extra) -> dict:
    return {"dtype": dtype, "shape": list(shape), "data_offsets": [begin, end], **extra}


def header(tensors: dict, metadata=None) -> str:
    h = {} if metadata is None else {"__metadata__": metadata}
    h.update(tensors)
    return json.dumps(h)


def nested(depth: int) -> str:
    """A valid one-tensor header whose ignored extra field nests to ``depth`` levels in all."""
    inner = depth - 2
    return '{{"a":{{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":{}{}}}}}'.format(
        "[" * inner,
        "]" * inner,
    )


def nested_entry(depth: int) -> str:
    """A valid header with a well-formed entry object ignored at nesting ``depth``."""
    inner = depth - 3
    entry = '{"dtype":"U8","shape":[1],"data_offsets":[0,1]}'
    return '{"a":' + entry[:-1] + ',"x":' + "[" * inner + entry + "]" * inner + "}}"


U8 = lambda b, e: spec("U8", [e - b], b, e)  # noqa: E731

# (id, file bytes): valid and invalid variants, each judged by the package below.
SAFETENSORS_CASES = [
    ("valid", st_bytes(header({"a": spec("F32", [2], 0, 8)}), b"\0" * 8)),
    ("leading-space", st_bytes(" " + header({"a": spec("F32", [1], 0, 4)}), b"\0" * 4)),
    ("padding", st_bytes(header({"a": spec("F32", [1], 0, 4)}) + "    ", b"\0" * 4)),
    ("extra-field", st_bytes(header({"a": spec("F32", [1], 0, 4, x=[1, {"y": None}])}), b"\0" * 4)),
    ("metadata", st_bytes(header({"a": U8(0, 2)}, {"k": "v"}), b"\1\2")),
    (
        "metadata-null",
        st_bytes(header({"a": U8(0, 2)}, None).replace("{", '{"__metadata__":null,', 1), b"\1\2"),
    ),
    ("metadata-int", st_bytes(header({"a": U8(0, 2)}, {"k": 1}), b"\1\2")),
    ("metadata-nested", st_bytes(header({"a": U8(0, 2)}, {"k": {"j": "v"}}), b"\1\2")),
    ("metadata-list", st_bytes(header({"a": U8(0, 2)}, ["k"]), b"\1\2")),
    (
        "metadata-twice",
        st_bytes('{"__metadata__":{},"__metadata__":{},"a":' + json.dumps(U8(0, 2)) + "}", b"\1\2"),
    ),
    ("metadata-key-twice", st_bytes('{"__metadata__":{"k":"1","k":"2"}}')),
    ("tensor-twice-same", st_bytes('{"a":%s,"a":%s}' % ((json.dumps(U8(0, 2)),) * 2), b"\1\2")),
    (
        "tensor-twice-moved",
        st_bytes(f'{{"a":{json.dumps(U8(0, 2))},"a":{json.dumps(U8(2, 4))}}}', b"\1\2\3\4"),
    ),
    (
        "field-twice",
        st_bytes('{"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\1"),
    ),
    ("empty-object", st_bytes("{}")),
    ("empty-object-trailing", st_bytes("{}", b"x")),
    ("empty-header", st_bytes("")),
    ("array", st_bytes("[]")),
    ("string", st_bytes('"a"')),
    ("bom", st_bytes(b"\xef\xbb\xbf{}")),
    ("not-utf8", st_bytes(b'{"\xff":1}')),
    ("lone-surrogate-name", st_bytes(f'{{"\\ud800":{json.dumps(U8(0, 1))}}}', b"\1")),
    ("surrogate-pair-name", st_bytes(f'{{"\\ud83d\\ude00":{json.dumps(U8(0, 1))}}}', b"\1")),
    (
        "lone-surrogate-extra",
        st_bytes(
            header({"a": spec("U8", [1], 0, 1, x="\ud800")}).replace("\\ud800", "\\udc00"), b"\1"
        ),
    ),
    ("control-char", st_bytes(f'{{"a\x01":{json.dumps(U8(0, 1))}}}', b"\1")),
    ("nan", st_bytes('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":NaN}}', b"\1")),
    (
        "number-out-of-range",
        st_bytes('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1e400}}', b"\1"),
    ),
    (
        "long-integer-extra",
        st_bytes(
            '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":%s}}' % ("9" * 400), b"\1"
        ),
    ),
    ("trailing-comma", st_bytes(f'{{"a":{json.dumps(U8(0, 1))},}}', b"\1")),
    ("trailing-text", st_bytes(b"{}\0")),
    ("depth-127", st_bytes(nested(127), b"\0" * 4)),
    ("depth-128", st_bytes(nested(128), b"\0" * 4)),
    ("depth-5000", st_bytes("[" * 5000 + "]" * 5000)),
    ("unknown-dtype", st_bytes(header({"a": spec("F33", [1], 0, 4)}), b"\0" * 4)),
    ("lowercase-dtype", st_bytes(header({"a": spec("f32", [1], 0, 4)}), b"\0" * 4)),
    ("bf16", st_bytes(header({"a": spec("BF16", [2], 0, 4)}), b"\0" * 4)),
    (
        "f8",
        st_bytes(
            header({"a": spec("F8_E4M3", [3], 0, 3), "b": spec("F8_E5M2", [1], 3, 4)}), b"\0" * 4
        ),
    ),
    ("c64-unsupported", st_bytes(header({"a": spec("C64", [1], 0, 8)}), b"\0" * 8)),
    ("f4-unsupported", st_bytes(header({"a": spec("F4", [2], 0, 1)}), b"\0")),
    ("f4-odd", st_bytes(header({"a": spec("F4", [3], 0, 1)}), b"\0")),
    ("f6", st_bytes(header({"a": spec("F6_E2M3", [4], 0, 3)}), b"\0" * 3)),
    ("offsets-three", st_bytes('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,1]}}', b"\1")),
    ("shape-float", st_bytes('{"a":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}}', b"\1")),
    ("shape-exponent", st_bytes('{"a":{"dtype":"U8","shape":[1e0],"data_offsets":[0,1]}}', b"\1")),
    ("shape-minus-zero", st_bytes('{"a":{"dtype":"U8","shape":[-0],"data_offsets":[0,0]}}')),
    ("shape-negative", st_bytes('{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}', b"\1")),
    ("shape-bool", st_bytes('{"a":{"dtype":"U8","shape":[true],"data_offsets":[0,1]}}', b"\1")),
    ("shape-string", st_bytes('{"a":{"dtype":"U8","shape":["1"],"data_offsets":[0,1]}}', b"\1")),
    ("shape-null", st_bytes('{"a":{"dtype":"U8","shape":null,"data_offsets":[0,1]}}', b"\1")),
    (
        "shape-2^64",
        st_bytes('{"a":{"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,1]}}', b"\1"),
    ),
    ("shape-overflow", st_bytes(header({"a": spec("F32", [1 << 32, 1 << 32], 0, 4)}), b"\0" * 4)),
    ("bytes-overflow", st_bytes(header({"a": spec("F32", [1 << 62], 0, 4)}), b"\0" * 4)),
    (
        "extra-field-twice",
        st_bytes('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1,"x":[]}}', b"\1"),
    ),
    (
        "extra-field-first",
        st_bytes('{"a":{"x":1,"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\1"),
    ),
    (
        "tensor-null-then-valid",
        st_bytes('{"a":null,"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\1"),
    ),
    ("form-feed", st_bytes('{\f"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\1")),
    ("entry-at-depth-126", st_bytes(nested_entry(126), b"\1")),
    ("entry-at-depth-127", st_bytes(nested_entry(127), b"\1")),
    ("tensor-null", st_bytes('{"a":null}')),
    ("scalar", st_bytes(header({"a": spec("I64", [], 0, 8)}), b"\0" * 8)),
    ("zero-size", st_bytes(header({"a": U8(0, 0), "b": U8(0, 0), "c": U8(0, 1)}), b"\1")),
    ("out-of-order", st_bytes(header({"a": U8(2, 4), "b": U8(0, 2)}), b"\1\2\3\4")),
    ("gap", st_bytes(header({"a": U8(0, 2), "b": U8(3, 4)}), b"\1\2\3\4")),
    ("overlap", st_bytes(header({"a": U8(0, 3), "b": U8(2, 4)}), b"\1\2\3\4")),
    ("not-from-zero", st_bytes(header({"a": U8(1, 4)}), b"\1\2\3\4")),
    ("end-before-begin", st_bytes(header({"a": spec("U8", [0], 4, 0)}), b"\1\2\3\4")),
    ("trailing-bytes", st_bytes(header({"a": U8(0, 4)}), b"\1\2\3\4\5")),
    ("short-data", st_bytes(header({"a": U8(0, 4)}), b"\1\2\3")),
    ("dtype-shape-mismatch", st_bytes(header({"a": spec("F32", [2], 0, 4)}), b"\0" * 4)),
    ("seven-bytes", b"\0" * 7),
    ("length-past-end", st_bytes("{}", length=3)),
    ("length-2^64-1", b"\xff" * 8 + b"{}"),
]


def package_verdict(path: Path) -> str | None:
    """None when the safetensors package opens the file, else its complaint."""
    try:
        with safe_open(str(path), framework="np") as f:
            list(f.keys())
            f.metadata()
    except Exception as e:  # the package's own error type varies between versions
        return f"{type(e).__name__}: {e}"
    return None


@pytest.mark.parametrize(
    "data", [c[1] for c in SAFETENSORS_CASES], ids=[c[0] for c in SAFETENSORS_CASES]
)
def test_safetensors_refused_exactly_when_the_package_refuses(tmp_path, data):
    src = tmp_path / "w.safetensors"
    src.write_bytes(data)
    refused = package_verdict(src)
    try:
        tfckpt.import_(src, tmp_path / "out" / "m")
    except tfckpt.UnsupportedCheckpointError as e:
        # Valid for the package, in a dtype a TensorFlow checkpoint cannot hold.
        assert refused is None, (refused, e)
        assert e.path == str(src) and e.tensor == "a", e
        return
    except tfckpt.CorruptCheckpointError as e:
        assert refused is not None, f"the package opens it; tfckpt said {e}"
        assert e.path == str(src), e
        assert not (tmp_path / "out").exists()
        return
    assert refused is None, f"the package refuses it ({refused}); tfckpt imported it"
    with tfckpt.open(tmp_path / "out" / "m") as ckpt, safe_open(str(src), "np") as f:
        assert sorted(ckpt.keys()) == sorted(f.keys())


def test_header_over_the_package_limit_is_refused_before_reading_it(tmp_path):
    limit = tfckpt.format.tensorfiles.SAFETENSORS_HEADER_LIMIT
    assert limit == 100_000_000
    big = tmp_path / "big.safetensors"
    with open(big, "wb") as f:  # sparse: the whole declared header is "there"
        f.write(struct.pack("<Q", limit + 1))
        f.truncate(8 + limit + 1)
    assert "too large" in package_verdict(big)
    tracemalloc.start()
    try:
        with pytest.raises(tfckpt.CorruptCheckpointError, match="over the limit") as e:
            tfckpt.import_(big, tmp_path / "o" / "m")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert e.value.path == str(big)
    assert peak < 1 << 20, peak  # the header was never read


# -- indexes


def write_shard(path: Path, name: str = "w") -> Path:
    save_file({name: np.arange(6, dtype=np.float32)}, str(path))
    return path


def write_index(path: Path, weight_map, **more) -> Path:
    path.write_text(json.dumps({"metadata": {}, "weight_map": weight_map, **more}))
    return path


@pytest.mark.parametrize(
    "ref",
    [
        "ABS",
        "../outside.safetensors",
        "sub/inside.safetensors",
        "sub\\inside.safetensors",
        "",
        ".",
        "..",
        "C:outside.safetensors",
        "file:outside.safetensors",
        "s3://bucket/outside.safetensors",
        "inside.safetensors\0x",
    ],
)
def test_index_shard_names_resolve_only_beside_the_index(tmp_path, ref):
    d = tmp_path / "hf"
    (d / "sub").mkdir(parents=True)
    outside = write_shard(tmp_path / "outside.safetensors", "secret")
    write_shard(d / "sub" / "inside.safetensors", "secret")
    write_shard(d / "model-1.safetensors")
    if ref == "ABS":
        ref = str(outside)
    index = write_index(
        d / "model.safetensors.index.json", {"w": "model-1.safetensors", "secret": ref}
    )
    line = assert_cli_error(
        in_process("import", index, tmp_path / "out" / "m"), str(index), "'secret'"
    )
    assert "not a file name beside the index" in line
    assert not (tmp_path / "out").exists()


def test_many_distinct_shard_names_take_linear_time(tmp_path):
    """200 000 shard names: a quadratic pass over them would take minutes (the timeout)."""
    n = 200_000
    index = write_index(
        tmp_path / "m.safetensors.index.json",
        {f"t{i}": f"model-{i:06d}-of-{n:06d}.safetensors" for i in range(n)},
    )
    proc = run_text("import", index, tmp_path / "out" / "m", timeout=60)
    assert_cli_error(proc, "model-000000-of-200000.safetensors")


def test_same_tensor_in_two_shards_names_the_file(tmp_path):
    write_shard(tmp_path / "model-1.safetensors")
    write_shard(tmp_path / "model-2.safetensors")
    index = write_index(
        tmp_path / "model.safetensors.index.json",
        {"w": "model-1.safetensors", "v": "model-2.safetensors"},
    )
    line = assert_cli_error(
        in_process("import", index, tmp_path / "out" / "m"), str(tmp_path / "model-2.safetensors")
    )
    assert "would both be named 'w'" in line


# -- hostile files through the command line: one line naming the file


def _zip_bytes(members: dict[str, bytes], method=zipfile.ZIP_STORED) -> bytes:
    import io

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def _npy(array: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def _npy_raw(descr: str, shape, data: bytes) -> bytes:
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": descr, "fortran_order": False, "shape": shape}
    )
    return buf.getvalue() + data


def _flip_crc(data: bytes) -> bytes:
    """The zip with its member's recorded CRC-32 changed: the data no longer fits it."""
    out = bytearray(data)
    for sig, at in ((b"PK\x03\x04", 14), (b"PK\x01\x02", 16)):
        i = out.find(sig)
        out[i + at] ^= 0xFF
    return bytes(out)


def _with_flag(data: bytes, flag: int) -> bytes:
    """Set a general-purpose flag bit in every local and central header."""
    out = bytearray(data)
    for sig, at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        i = out.find(sig)
        while i >= 0:
            out[i + at] |= flag
            i = out.find(sig, i + 4)
    return bytes(out)


def _method(data: bytes, method: int) -> bytes:
    out = bytearray(data)
    for sig, at in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):
        i = out.find(sig)
        while i >= 0:
            struct.pack_into("<H", out, i + at, method)
            i = out.find(sig, i + 4)
    return bytes(out)


def _extra_past_end(data: bytes) -> bytes:
    """The stored member's local header claims an extra field reaching past the file's end."""
    out = bytearray(data)
    struct.pack_into("<H", out, 28, 60000)
    return bytes(out)


ONES = np.ones(4, np.float32)
DEFLATED = zipfile.ZIP_DEFLATED
HOSTILE = [
    # (id, file name, bytes, fragments the one line holds besides the file name)
    ("index-not-json", "m.safetensors.index.json", b"{", ["not valid JSON"]),
    ("index-not-utf8", "m.safetensors.index.json", b'{"weight_map":{"\xff":1}}', ["UTF-8"]),
    ("index-empty", "m.safetensors.index.json", b"", ["not valid JSON"]),
    ("index-top-list", "m.safetensors.index.json", b"[]", ["weight_map"]),
    ("index-no-weight-map", "m.safetensors.index.json", b'{"metadata":{}}', ["weight_map"]),
    ("index-weight-map-list", "m.safetensors.index.json", b'{"weight_map":["a"]}', ["weight_map"]),
    ("index-weight-map-null", "m.safetensors.index.json", b'{"weight_map":null}', ["weight_map"]),
    ("index-value-int", "m.safetensors.index.json", b'{"weight_map":{"a":1}}', ["'a'"]),
    ("index-value-list", "m.safetensors.index.json", b'{"weight_map":{"a":["x"]}}', ["'a'"]),
    (
        "index-metadata-list",
        "m.safetensors.index.json",
        b'{"metadata":[],"weight_map":{}}',
        ["metadata"],
    ),
    (
        "index-metadata-string",
        "m.safetensors.index.json",
        b'{"metadata":"x","weight_map":{}}',
        ["metadata"],
    ),
    (
        "index-deep",
        "m.safetensors.index.json",
        b'{"weight_map":{},"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        ["nests too deeply"],
    ),
    ("index-deep-open", "m.safetensors.index.json", b"[" * 1_000_000, ["safetensors index"]),
    (
        "index-names-itself",
        "m.safetensors.index.json",
        b'{"weight_map":{"a":"m.safetensors.index.json"}}',
        ["safetensors header"],
    ),
    ("index-nan", "m.safetensors.index.json", b'{"weight_map":{},"x":NaN}', ["NaN"]),
    ("st-deep", "w.safetensors", st_bytes(b"[" * 1_000_000), ["safetensors header"]),
    ("st-huge-length", "w.safetensors", st_bytes("{}", length=1 << 62), ["over the limit"]),
    ("st-not-utf8", "w.safetensors", st_bytes(b"\xff\xfe"), ["UTF-8"]),
    ("st-list", "w.safetensors", st_bytes("[1]"), ["not a JSON object"]),
    ("st-spec-list", "w.safetensors", st_bytes('{"a":[]}'), ["'a'"]),
    (
        "st-gap",
        "w.safetensors",
        st_bytes(header({"a": U8(0, 1), "b": U8(2, 3)}), b"123"),
        ["'b'", "gap"],
    ),
    ("st-trailing", "w.safetensors", st_bytes(header({"a": U8(0, 1)}), b"12"), ["cover"]),
    ("st-metadata-int", "w.safetensors", st_bytes(header({}, {"k": 1})), ["__metadata__"]),
    (
        "st-bool-2",
        "w.safetensors",
        st_bytes(header({"a": spec("BOOL", [3], 0, 3)}), b"\1\0\2"),
        ["'a'", "0 and 1"],
    ),
    ("npz-not-zip", "w.npz", b"PK not really", ["not an npz file"]),
    ("npz-bad-magic", "w.npz", _zip_bytes({"a.npy": b"\x93NUMPX" + b"\0" * 100}), ["'a'", ".npy"]),
    ("npz-object", "w.npz", _zip_bytes({"a.npy": _npy_raw("|O", (1,), b"\0" * 8)}), ["'a'"]),
    (
        "npz-fortran",
        "w.npz",
        _zip_bytes({"a.npy": _npy(np.asfortranarray(np.ones((2, 2), np.float32)))}),
        ["'a'", "Fortran"],
    ),
    ("npz-short", "w.npz", _zip_bytes({"a.npy": _npy(ONES)[:-2]}), ["'a'", "holds"]),
    (
        "npz-short-deflated",
        "w.npz",
        _zip_bytes({"a.npy": _npy(ONES)[:-2]}, DEFLATED),
        ["'a'", "holds"],
    ),
    (
        "npz-trailing-deflated",
        "w.npz",
        _zip_bytes({"a.npy": _npy(ONES) + b"\0" * (4 << 20)}, DEFLATED),
        ["'a'", "holds"],
    ),
    ("npz-bad-crc", "w.npz", _flip_crc(_zip_bytes({"a.npy": _npy(ONES)}, DEFLATED)), ["'a'"]),
    ("npz-bad-crc-stored", "w.npz", _flip_crc(_zip_bytes({"a.npy": _npy(ONES)})), []),
    ("npz-encrypted", "w.npz", _with_flag(_zip_bytes({"a.npy": _npy(ONES)}, DEFLATED), 1), ["'a'"]),
    ("npz-method-99", "w.npz", _method(_zip_bytes({"a.npy": _npy(ONES)}, DEFLATED), 99), ["'a'"]),
    ("npz-extra-past-end", "w.npz", _extra_past_end(_zip_bytes({"a.npy": _npy(ONES)})), ["'a'"]),
    (
        "npz-bool-2",
        "w.npz",
        _zip_bytes({"a.npy": _npy_raw("|b1", (3,), b"\1\2\0")}),
        ["'a'", "0 and 1"],
    ),
    (
        "npz-bool-2-deflated",
        "w.npz",
        _zip_bytes({"a.npy": _npy_raw("|b1", (3,), b"\1\2\0")}, DEFLATED),
        ["'a'", "0 and 1"],
    ),
]


@pytest.mark.parametrize(
    "name,data,fragments", [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE]
)
def test_hostile_files_are_one_line_naming_the_file(tmp_path, name, data, fragments):
    src = tmp_path / name
    src.write_bytes(data)
    out = tmp_path / "new" / "dirs" / "m"
    assert_cli_error(in_process("import", src, out), str(src), *fragments)
    assert not (tmp_path / "new").exists()  # the directories this run made are gone


# What numpy (through zipfile) refuses of the npz cases above, which tfckpt refuses too.
# It loads the others as they are: Fortran order, a member inflating past its array,
# bool bytes of 2, a member that is not .npy; tfckpt's own, stricter rules refuse them.
NUMPY_REFUSES = [
    "npz-not-zip",
    "npz-object",
    "npz-short",
    "npz-short-deflated",
    "npz-bad-crc",
    "npz-bad-crc-stored",
    "npz-encrypted",
    "npz-method-99",
    "npz-extra-past-end",
]


@pytest.mark.parametrize("case", NUMPY_REFUSES)
def test_numpy_refuses_the_npz_tfckpt_refuses(tmp_path, case):
    src = tmp_path / "w.npz"
    src.write_bytes(next(c[2] for c in HOSTILE if c[0] == case))
    with pytest.raises(Exception):  # noqa: B017 -- any refusal, each library its own kind
        with np.load(src, allow_pickle=False) as z:
            for k in z.files:
                np.asarray(z[k])
    with pytest.raises(tfckpt.CorruptCheckpointError):
        tfckpt.import_(src, tmp_path / "o" / "m")


def test_unexpected_end_of_file_names_file_and_tensor(tmp_path):
    """A stored member cut short, its central directory kept: the read by offset ends early."""
    src = tmp_path / "w.npz"
    np.savez(src, a=np.arange(1000, dtype=np.float32))
    data = src.read_bytes()
    central = data.index(b"PK\x01\x02")
    cut = data[: central - 400]
    tail = bytearray(data[central:])
    struct.pack_into("<I", tail, tail.index(b"PK\x05\x06") + 16, len(cut))
    src.write_bytes(cut + bytes(tail))
    with zipfile.ZipFile(src) as z:  # still a zip that lists the whole member
        assert z.getinfo("a.npy").file_size == 128 + 4000
    with pytest.raises(tfckpt.CorruptCheckpointError, match="unexpected end of file") as e:
        tfckpt.import_(src, tmp_path / "o" / "m")
    assert e.value.path == str(src) and e.value.tensor == "a", e.value


# -- clean-up on failure and interrupt


def test_failed_import_removes_only_the_directories_it_made(tmp_path):
    src = tmp_path / "w.safetensors"
    save_file({"a": np.ones(4, np.float32), "b": np.array([True, False])}, str(src))
    data = bytearray(src.read_bytes())
    data[-1] = 7  # b's second element: a bool byte that is neither 0 nor 1
    src.write_bytes(bytes(data))
    kept = tmp_path / "kept"
    (kept / "other").mkdir(parents=True)
    with pytest.raises(tfckpt.CorruptCheckpointError, match="0 and 1") as e:
        tfckpt.import_(src, kept / "new" / "deeper" / "m")
    assert e.value.tensor == "b" and e.value.path == str(src)
    assert sorted(p.name for p in kept.iterdir()) == ["other"]


INTERRUPT_IMPORT = """
import os, signal, sys, tfckpt
calls = [0]
def progress(n):
    calls[0] += 1
    if calls[0] == 3:
        os.kill(os.getpid(), signal.SIGINT)
try:
    tfckpt.import_(sys.argv[1], sys.argv[2], chunk_bytes=1 << 16, progress=progress)
except KeyboardInterrupt:
    sys.exit(130)
"""


def test_interrupted_import_removes_the_directories_it_made(tmp_path):
    src = tmp_path / "w.safetensors"
    save_file({"a": np.ones(1 << 18, np.float32)}, str(src))  # 1 MiB: 128 pieces of 8 KiB
    out = tmp_path / "new" / "deeper" / "m"
    proc = subprocess.run(
        [sys.executable, "-c", INTERRUPT_IMPORT, str(src), str(out)],
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 130, proc.stderr
    assert os.listdir(tmp_path) == ["w.safetensors"]


# -- memory


PEAK_RSS = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(child.pid, 0)
print(usage.ru_maxrss, os.waitstatus_to_exitcode(status))
"""


def _peak_mib(*args) -> float:
    """Peak RSS of ``tfckpt ARGS`` in its own process, from wait4() in an intermediate
    process (a direct child would inherit this process's high-water mark)."""
    proc = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, sys.executable, "-m", "tfckpt", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env=user_env(),
    )
    peak_kib, rc = map(int, proc.stdout.split())
    assert rc == 0, proc.stderr
    return peak_kib / 1024


def test_import_stays_within_the_memory_of_convert(tmp_path):
    """The same 96 MiB, cast to float16 with a 16 MiB chunk budget: import holds no more
    than convert (its reads and casts go into rings of reused buffers as the engine's)."""
    tf = pytest.importorskip("tensorflow")
    value = (np.arange(24 << 20, dtype=np.float32) % 1000).reshape(-1, 1024)
    prefix = str(tmp_path / "ckpt" / "big")
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=["k"], shape_and_slices=[""], tensors=[value])
    st = tmp_path / "big.safetensors"
    save_file({"k": value}, str(st))
    del value
    for extra in ([], ["--dtype", "float16"]):
        common = ["--chunk-bytes", "16M", "--overwrite", *extra]
        convert = _peak_mib("convert", prefix, tmp_path / "c" / "m", *common)
        imported = _peak_mib("import", st, tmp_path / "i" / "m", *common)
        assert imported <= convert + 4, (extra, imported, convert)
    with tfckpt.open(tmp_path / "c" / "m") as a, tfckpt.open(tmp_path / "i" / "m") as b:
        assert a["k"].tobytes() == b["k"].tobytes()


def test_stored_member_read_by_offset_is_checked_against_its_crc(tmp_path):
    """A member too big for zipfile to check on opening, read by offset: its CRC-32 still
    decides, as zipfile's would (numpy refuses the same bytes)."""
    src = tmp_path / "w.npz"
    np.savez(src, a=np.arange(1 << 16, dtype=np.float32))  # 256 KiB, stored
    src.write_bytes(_flip_crc(src.read_bytes()))
    with pytest.raises(zipfile.BadZipFile), np.load(src, allow_pickle=False) as z:
        z["a"]
    with pytest.raises(tfckpt.CorruptCheckpointError, match="CRC") as e:
        tfckpt.import_(src, tmp_path / "new" / "m", chunk_bytes=1 << 16)
    assert e.value.path == str(src) and e.value.tensor == "a"
    assert not (tmp_path / "new").exists()
    np.savez(src, a=np.arange(1 << 16, dtype=np.float32))  # intact: imported
    tfckpt.import_(src, tmp_path / "ok" / "m", chunk_bytes=1 << 16)
    with tfckpt.open(tmp_path / "ok" / "m") as ckpt:
        assert ckpt["a"].tolist() == list(range(1 << 16))


def test_import_destination_named_by_its_index(tmp_path):
    """``import W out/m.index`` writes ``out/m``, as a source's ``.index`` names its prefix."""
    src = tmp_path / "w.safetensors"
    save_file({"a": np.arange(4, dtype=np.float32)}, str(src))
    assert in_process("import", src, tmp_path / "out" / "m.index")[0] == 0
    assert sorted(os.listdir(tmp_path / "out")) == ["m.data-00000-of-00001", "m.index"]
    assert tfckpt.open(str(tmp_path / "out" / "m"))["a"].tolist() == [0, 1, 2, 3]


# -- names and shapes a TensorFlow checkpoint cannot hold (issue 37, item 14)


def _names_and_shapes(tmp_path) -> dict[str, tuple[Path, str, list[str]]]:
    """(file, its tensor, fragments of the one error line) of each case; the files are
    written by the safetensors package and numpy where they write them, by hand where
    they refuse."""
    cases = {}
    st = tmp_path / "empty-name.safetensors"
    save_file({"": np.ones(2, np.float32)}, str(st))  # the package writes an empty name
    cases["safetensors empty name"] = (st, "", ["empty name", "--map '^$=NAME'"])
    npz = tmp_path / "empty-name.npz"
    np.savez(npz, **{"": np.ones(2, np.float32)})  # the member ".npy"
    with zipfile.ZipFile(npz) as z:
        assert z.namelist() == [".npy"]
    cases["npz empty member name"] = (npz, "", ["empty name"])
    for label, shape, data in (
        ("npz negative dimensions", (-2, -3), b"\0" * 24),  # their product fits the bytes
        ("npz negative and zero", (-1, 0), b""),
    ):
        path = tmp_path / f"{label.replace(' ', '-')}.npz"
        path.write_bytes(_zip_bytes({"x.npy": _npy_raw("<f4", shape, data)}))
        with pytest.raises(ValueError), np.load(path, allow_pickle=False) as z:
            z["x"]  # numpy refuses it too
        cases[label] = (path, "x", ["negative dimension"])
    deep = tmp_path / "rank-300.safetensors"
    deep.write_bytes(st_bytes(header({"a": spec("F32", [1] * 300, 0, 4)}), b"\0" * 4))
    assert package_verdict(deep) is None  # the package opens it
    cases["safetensors rank 300"] = (deep, "a", ["rank 300", "254"])
    return cases


def test_unstorable_names_and_shapes_are_one_line_errors(tmp_path):
    for what, (src, tensor, fragments) in _names_and_shapes(tmp_path).items():
        out = tmp_path / "new" / what.replace(" ", "-") / "m"
        assert_cli_error(in_process("import", src, out), str(src), f"tensor {tensor!r}", *fragments)
        assert_cli_error(run_text("import", src, out, "--dry-run"), str(src), *fragments)
        with pytest.raises(tfckpt.CheckpointError) as e:
            tfckpt.import_(src, out)
        assert e.value.path == str(src) and e.value.tensor == tensor, (what, e.value)
        assert not (tmp_path / "new").exists()
    # The rename the message gives imports the empty name.
    src = tmp_path / "empty-name.safetensors"
    rc, _, err = in_process("import", src, tmp_path / "named" / "m", "--map", "^$=w")
    assert rc == 0, err
    with tfckpt.open(tmp_path / "named" / "m") as ckpt:
        assert ckpt.keys() == ["w"] and ckpt["w"].tolist() == [1.0, 1.0]


# What the headers of the fuzz below draw from: names, dtypes and shapes of every kind.
_NAMES = ["", "a", "a/b", "/", ".", "..", "x" * 300, "é", "\0", "a:0", "../x", " "]
_ST_DTYPES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I8": 1, "I64": 8, "U8": 1, "U64": 8}
_ST_DTYPES.update({"BOOL": 1, "F8_E4M3": 1, "C64": 8, "X": 1})
_NPY_DESCRS = ["<f4", "<f2", "<i8", "|b1", "|u1", "<c8", "|V4", "<M8[s]", "<U3", "|S3", ">f4"]


def _fuzz_safetensors(draw) -> bytes:
    from hypothesis import strategies as st

    tensors, end = [], 0
    for name in draw(st.lists(st.sampled_from(_NAMES), min_size=1, max_size=3)):
        dtype = draw(st.sampled_from(sorted(_ST_DTYPES)))
        shape = draw(st.lists(st.integers(0, 3), max_size=draw(st.sampled_from([3, 300]))))
        n = _ST_DTYPES[dtype] * int(np.prod(shape, dtype=object))
        tensors.append((name, spec(dtype, shape, end, end + n)))
        end += n
    text = "{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in tensors) + "}"
    return st_bytes(text, b"\1" * end)


def _fuzz_npz(draw) -> bytes:
    from hypothesis import strategies as st

    members = {}
    names = [n for n in _NAMES if "\0" not in n]  # zipfile cuts a name at NUL
    for name in draw(st.lists(st.sampled_from(names), min_size=1, max_size=3)):
        descr = draw(st.sampled_from(_NPY_DESCRS))
        shape = tuple(draw(st.lists(st.integers(-3, 3), max_size=draw(st.sampled_from([3, 70])))))
        n = np.dtype(descr).itemsize * int(np.prod(shape, dtype=object))
        extra = draw(st.sampled_from([0, 0, 1]))
        members[f"{name}.npy"] = _npy_raw(descr, shape, b"\1" * max(0, n + extra))
    return _zip_bytes(members)


def test_fuzzed_names_shapes_and_dtypes_import_or_are_checkpoint_errors(tmp_path):
    """Safetensors headers and npz members drawn from hostile names, shapes (negative,
    empty, of rank 300) and dtypes: each imports, and opens, or is a CheckpointError."""
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    files = st.one_of(
        st.composite(lambda draw: ("w.safetensors", _fuzz_safetensors(draw)))(),
        st.composite(lambda draw: ("w.npz", _fuzz_npz(draw)))(),
    )
    runs = iter(range(1 << 30))

    @settings(
        max_examples=150,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(files)
    def case(drawn):
        name, data = drawn
        k = next(runs)
        src = tmp_path / f"{k}-{name}"
        src.write_bytes(data)
        out = tmp_path / f"out{k}" / "m"
        try:
            tfckpt.import_(src, out)
        except tfckpt.CheckpointError as e:
            assert e.path == str(src), e
            assert not out.parent.exists()
            return
        with tfckpt.open(out) as ckpt:
            for key in ckpt.keys():
                ckpt[key]

    del hypothesis
    case()
