"""The SSTable layer (``tfckpt.format.table``) against hand-built bytes.

Expected bytes are written out from the format facts (FORMAT.md, LevelDB's
table format as TensorFlow's ``tsl/lib/io`` writes it), not produced by the code
under test. The small helpers at the top (varint, mask, block and table
assemblers, a minimal table parser) are independent test-side encoders used to
build corrupt variants and to inspect what TableBuilder wrote.

No TensorFlow here: this is the fast layer.
"""

from __future__ import annotations

import io
import struct

import crc32c as crc32c_lib
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tfckpt
from tfckpt.format import table as T

try:  # test-only dependency: a real snappy compressor
    import cramjam
except ImportError:  # pragma: no cover
    cramjam = None
needs_cramjam = pytest.mark.skipif(cramjam is None, reason="cramjam not installed")

PATH = "/ckpts/run-1/model.ckpt-7.index"
MAGIC_LE = bytes.fromhex("57fb808b247547db")  # 0xdb4775248b80fb57, little-endian
EMPTY_BLOCK = b"\x00\x00\x00\x00\x01\x00\x00\x00"  # no entries, restarts [0], count 1


# --- independent test-side encoders ----------------------------------------


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def mask(c: int) -> int:
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def trailer(contents: bytes, ctype: int = 0) -> bytes:
    crc = crc32c_lib.crc32c(bytes([ctype]), crc32c_lib.crc32c(contents))
    return bytes([ctype]) + struct.pack("<I", mask(crc))


def u32(n: int) -> bytes:
    return struct.pack("<I", n)


def raw_block(entries, restarts=(0,), count=None) -> bytes:
    """Block contents from explicit (shared, non_shared_key_bytes, value) triples."""
    body = b"".join(varint(s) + varint(len(k)) + varint(len(v)) + k + v for s, k, v in entries)
    tail = b"".join(u32(r) for r in restarts) + u32(len(restarts) if count is None else count)
    return body + tail


def prefix_block(kvs, interval: int = 16) -> bytes:
    """A well-formed block for sorted (key, value) pairs, restarting every ``interval``."""
    entries, restarts, offset, last = [], [], 0, b""
    for i, (k, v) in enumerate(kvs):
        if i % interval == 0:
            shared = 0
            restarts.append(offset)
        else:
            shared = 0
            while shared < min(len(k), len(last)) and k[shared] == last[shared]:
                shared += 1
        e = varint(shared) + varint(len(k) - shared) + varint(len(v)) + k[shared:] + v
        entries.append(e)
        offset += len(e)
        last = k
    return (
        b"".join(entries) + b"".join(u32(r) for r in (restarts or [0])) + u32(len(restarts or [0]))
    )


def handle(offset: int, size: int) -> bytes:
    return varint(offset) + varint(size)


def footer(meta_off, meta_size, idx_off, idx_size) -> bytes:
    h = handle(meta_off, meta_size) + handle(idx_off, idx_size)
    return h + b"\x00" * (40 - len(h)) + MAGIC_LE


def assemble(
    blocks, index_keys=None, *, index_contents=None, index_type=0, index_handles=None
) -> bytes:
    """A table from data blocks given as contents or (contents, type[, trailer])."""
    out = bytearray()
    handles = []
    for b in blocks:
        if isinstance(b, bytes):
            b = (b, 0)
        contents, ctype = b[0], b[1]
        handles.append((len(out), len(contents)))
        out += contents + (b[2] if len(b) > 2 else trailer(contents, ctype))
    meta = (len(out), len(EMPTY_BLOCK))
    out += EMPTY_BLOCK + trailer(EMPTY_BLOCK)
    if index_contents is None:
        hs = index_handles if index_handles is not None else [handle(*h) for h in handles]
        index_contents = prefix_block(list(zip(index_keys, hs)), interval=1)
    idx = (len(out), len(index_contents))
    out += index_contents + trailer(index_contents, index_type)
    out += footer(*meta, *idx)
    return bytes(out)


def read_varint(buf, pos):
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return result, pos


def parse_raw_block(contents: bytes):
    """(entries as (shared, key, value, offset), restarts) of a well-formed block."""
    (n,) = struct.unpack_from("<I", contents, len(contents) - 4)
    limit = len(contents) - 4 - 4 * n
    restarts = list(struct.unpack_from(f"<{n}I", contents, limit))
    entries, pos, key = [], 0, b""
    while pos < limit:
        start = pos
        shared, pos = read_varint(contents, pos)
        non_shared, pos = read_varint(contents, pos)
        vlen, pos = read_varint(contents, pos)
        key = key[:shared] + contents[pos : pos + non_shared]
        pos += non_shared
        entries.append((shared, key, contents[pos : pos + vlen], start))
        pos += vlen
    assert pos == limit
    return entries, restarts


def parse_table(data: bytes):
    """Footer handles, metaindex contents, and [(index_key, offset, size, type, contents)]."""
    assert data[-8:] == MAGIC_LE
    f = data[-48:]
    mo, p = read_varint(f, 0)
    ms, p = read_varint(f, p)
    io_, p = read_varint(f, p)
    is_, p = read_varint(f, p)
    assert f[p:40] == b"\x00" * (40 - p)
    index = data[io_ : io_ + is_]
    if data[io_ + is_] == 1:
        index = bytes(cramjam.snappy.decompress_raw(index))
    blocks = []
    idx_entries, idx_restarts = parse_raw_block(index)
    assert idx_restarts == ([e[3] for e in idx_entries] or [0])  # restart interval 1
    for shared, key, value, _ in idx_entries:
        assert shared == 0
        off, q = read_varint(value, 0)
        size, q = read_varint(value, q)
        assert q == len(value)
        contents = data[off : off + size]
        if data[off + size] == 1:
            contents = bytes(cramjam.snappy.decompress_raw(contents))
        blocks.append((key, off, size, data[off + size], contents))
    return (mo, ms, io_, is_), data[mo : mo + ms], blocks


def build(entries, **kw) -> bytes:
    f = io.BytesIO()
    b = T.TableBuilder(f, **kw)
    for k, v in entries:
        b.add(k, v)
    size = b.finish()
    data = f.getvalue()
    assert size == len(data)
    return data


def read(data: bytes, path: str = PATH):
    return T.TableReader(data, path).entries


def expect_corrupt(data: bytes, match: str | None = None, path: str = PATH):
    """TableReader raises CorruptCheckpointError naming ``path`` (and nothing else)."""
    with pytest.raises(tfckpt.CorruptCheckpointError, match=match) as ei:
        T.TableReader(data, path)
    assert ei.value.path == path
    assert path in str(ei.value)
    return ei.value


# --- varints -----------------------------------------------------------------

VARINTS = [
    (0, b"\x00"),
    (1, b"\x01"),
    (127, b"\x7f"),
    (128, b"\x80\x01"),
    (300, b"\xac\x02"),
    (16383, b"\xff\x7f"),
    (16384, b"\x80\x80\x01"),
    (2**32 - 1, b"\xff\xff\xff\xff\x0f"),
    (2**32, b"\x80\x80\x80\x80\x10"),
    (2**63, b"\x80" * 9 + b"\x01"),
    (2**64 - 1, b"\xff" * 9 + b"\x01"),
]


@pytest.mark.parametrize("value,encoded", VARINTS)
def test_varint_encode(value, encoded):
    assert T.encode_varint(value) == encoded


@pytest.mark.parametrize("value,encoded", VARINTS)
def test_varint_decode(value, encoded):
    assert T.decode_varint(encoded, 0, len(encoded)) == (value, len(encoded))
    # At an offset inside a larger buffer, stopping right after the varint.
    buf = b"\xaa\xbb" + encoded + b"\x99\x88"
    assert T.decode_varint(buf, 2, len(buf)) == (value, 2 + len(encoded))


def test_varint_negative_refused():
    with pytest.raises(ValueError):
        T.encode_varint(-1)


@pytest.mark.parametrize(
    "buf,limit",
    [
        (b"", 0),
        (b"\x80", 1),
        (b"\xff\xff\xff", 3),
        (b"\x80\x01", 1),  # the limit cuts the varint short even though bytes follow
        (b"\xac\x02", 1),
    ],
)
def test_varint_truncated(buf, limit):
    with pytest.raises(ValueError):
        T.decode_varint(buf, 0, limit)


def test_varint_overlong():
    # 11 bytes: more than the 10 a varint64 may take, even though it ends with a zero byte.
    buf = b"\x80" * 10 + b"\x00"
    with pytest.raises(ValueError):
        T.decode_varint(buf, 0, len(buf))
    # 10 bytes that continue: no terminator within the 10-byte limit.
    buf = b"\xff" * 10 + b"\x01"
    with pytest.raises(ValueError):
        T.decode_varint(buf, 0, len(buf))
    # 10 bytes whose value exceeds 2**64-1.
    buf = b"\xff" * 9 + b"\x02"
    with pytest.raises(ValueError):
        T.decode_varint(buf, 0, len(buf))


def test_varint32_limit():
    assert T.decode_varint(b"\xff\xff\xff\xff\x0f", 0, 5, 5) == (2**32 - 1, 5)
    with pytest.raises(ValueError):  # 2**32: five bytes but out of range
        T.decode_varint(b"\x80\x80\x80\x80\x10", 0, 5, 5)
    with pytest.raises(ValueError):  # six bytes
        T.decode_varint(b"\x80\x80\x80\x80\x80\x00", 0, 6, 5)
    # The same six bytes are a fine varint64.
    assert T.decode_varint(b"\x80\x80\x80\x80\x80\x00", 0, 6) == (0, 6)


@given(st.integers(0, 2**64 - 1))
def test_varint_roundtrip(n):
    enc = T.encode_varint(n)
    assert enc == varint(n)
    assert len(enc) == max(1, -(-n.bit_length() // 7))
    assert T.decode_varint(enc, 0, len(enc)) == (n, len(enc))


@given(st.binary(max_size=12), st.integers(0, 12))
def test_varint_decode_never_crashes(buf, limit):
    limit = min(limit, len(buf))
    try:
        value, pos = T.decode_varint(buf, 0, limit)
    except ValueError:
        return
    assert 0 < pos <= limit and 0 <= value < 2**64


# --- CRC32C and masking --------------------------------------------------------


def test_crc32c_known_vectors():
    assert T.crc32c(b"123456789") == 0xE3069283
    # LevelDB's crc32c_test.cc vectors (from RFC 3720).
    assert T.crc32c(b"\x00" * 32) == 0x8A9136AA
    assert T.crc32c(b"\xff" * 32) == 0x62A8AB43
    assert T.crc32c(bytes(range(32))) == 0x46DD794E
    assert T.crc32c(bytes(range(31, -1, -1))) == 0x113FDB5C
    # Continuation, as the block trailer's CRC extends over the type byte.
    assert T.crc32c(b"56789", T.crc32c(b"1234")) == 0xE3069283
    assert T.crc32c(b"") == 0


def test_mask_by_hand():
    # mask(c) = rotr15(c) + 0xa282ead8 (mod 2**32)
    assert T.mask_crc(0) == 0xA282EAD8
    assert T.mask_crc(1) == 0xA282EAD8 + (1 << 17)  # 1 rotates to bit 17
    assert T.mask_crc(0x8000) == 0xA282EAD9  # bit 15 rotates to bit 0
    assert T.mask_crc(0xFFFFFFFF) == 0xA282EAD7  # 0xffffffff + delta wraps
    # c = 0xE3069283: c >> 15 = 0x1C60D, (c & 0x7fff) << 17 = 0x25060000,
    # rotated 0x2507C60D, plus 0xA282EAD8 = 0xC78AB0E5.
    assert T.mask_crc(0xE3069283) == 0xC78AB0E5
    assert T.unmask_crc(0xC78AB0E5) == 0xE3069283
    assert T.unmask_crc(0xA282EAD8) == 0


@given(st.integers(0, 2**32 - 1))
def test_mask_unmask_roundtrip(x):
    m = T.mask_crc(x)
    assert 0 <= m < 2**32
    assert m == mask(x)
    assert T.unmask_crc(m) == x
    assert T.mask_crc(T.unmask_crc(x)) == x


# --- block handles and footer --------------------------------------------------


def test_block_handle_encode_decode():
    assert T.BlockHandle(0, 0).encode() == b"\x00\x00"
    assert T.BlockHandle(0x33, 8).encode() == b"\x33\x08"
    assert T.BlockHandle(300, 2**40).encode() == b"\xac\x02" + b"\x80\x80\x80\x80\x80\x20"
    buf = b"\x07\xac\x02\x80\x80\x80\x80\x80\x20\x07"
    assert T.BlockHandle.decode(buf, 1, len(buf)) == (T.BlockHandle(300, 2**40), 9)
    with pytest.raises(ValueError):
        T.BlockHandle.decode(b"\xac\x02\x80", 0, 3)


def test_footer_encode_decode():
    fb = b"\x33\x08\x40\x0e" + b"\x00" * 36 + MAGIC_LE
    assert len(fb) == 48
    f = T.Footer(T.BlockHandle(51, 8), T.BlockHandle(64, 14))
    assert f.encode() == fb
    assert T.Footer.decode(fb) == f
    with pytest.raises(ValueError):
        T.Footer.decode(fb[1:])
    with pytest.raises(ValueError, match="magic"):
        T.Footer.decode(fb[:-1] + b"\x00")


# --- a table built by hand -------------------------------------------------------

HAND_ENTRIES = [
    (b"", b"HDR"),
    (b"dense/bias", b"B1"),
    (b"dense/kernel", b"K22"),
    (b"dense/kernel/m", b""),
]

HAND_DATA_BLOCK = (
    b"\x00\x00\x03"
    + b"HDR"  # shared 0, key "", value "HDR"
    + b"\x00\x0a\x02"
    + b"dense/bias"
    + b"B1"  # shared 0 with ""
    + b"\x06\x06\x03"
    + b"kernel"
    + b"K22"  # shares "dense/"
    + b"\x0c\x02\x00"
    + b"/m"  # shares "dense/kernel", empty value
    + b"\x00\x00\x00\x00"
    + b"\x01\x00\x00\x00"  # restarts [0], count 1
)
# Index: one entry, key = short successor of "dense/kernel/m" = "e", value = handle(0, 46).
HAND_INDEX_BLOCK = b"\x00\x01\x02" + b"e" + b"\x00\x2e" + b"\x00\x00\x00\x00\x01\x00\x00\x00"


def hand_table() -> bytes:
    assert len(HAND_DATA_BLOCK) == 46 and len(HAND_INDEX_BLOCK) == 14
    data = HAND_DATA_BLOCK + trailer(HAND_DATA_BLOCK)  # [0, 51)
    data += EMPTY_BLOCK + trailer(EMPTY_BLOCK)  # [51, 64)
    data += HAND_INDEX_BLOCK + trailer(HAND_INDEX_BLOCK)  # [64, 83)
    data += b"\x33\x08" + b"\x40\x0e" + b"\x00" * 36 + MAGIC_LE
    assert len(data) == 131
    return data


def test_hand_table_trailer_bytes():
    # The type byte is covered by the checksum: crc32c(contents + b"\x00"), masked.
    t = trailer(HAND_DATA_BLOCK)
    assert t[0] == 0
    assert struct.unpack("<I", t[1:])[0] == mask(crc32c_lib.crc32c(HAND_DATA_BLOCK + b"\x00"))
    # The empty metaindex block's trailer, fixed for every table.
    assert trailer(EMPTY_BLOCK) == b"\x00" + u32(mask(crc32c_lib.crc32c(EMPTY_BLOCK + b"\x00")))


def test_reader_parses_hand_table():
    assert read(hand_table()) == HAND_ENTRIES


def test_builder_writes_hand_table():
    assert build(HAND_ENTRIES) == hand_table()


def test_empty_table():
    # No entries: empty metaindex at 0, empty index at 13, footer.
    data = EMPTY_BLOCK + trailer(EMPTY_BLOCK) + EMPTY_BLOCK + trailer(EMPTY_BLOCK)
    data += b"\x00\x08\x0d\x08" + b"\x00" * 36 + MAGIC_LE
    assert build([]) == data
    assert read(data) == []


def test_single_entry_header_only():
    # Only the empty key: its short successor is itself ("" has nothing to increment).
    block = b"\x00\x00\x02" + b"\x08\x01" + EMPTY_BLOCK
    index = b"\x00\x00\x02" + b"\x00\x0d" + EMPTY_BLOCK
    data = block + trailer(block) + EMPTY_BLOCK + trailer(EMPTY_BLOCK)
    data += index + trailer(index)
    data += b"\x12\x08\x1f\x0d" + b"\x00" * 36 + MAGIC_LE
    assert build([(b"", b"\x08\x01")]) == data
    assert read(data) == [(b"", b"\x08\x01")]


def test_two_block_table_exact_bytes():
    # block_size=1 cuts a block after every entry. Index keys: separator("abc", "abz")
    # = "abd", then short successor("abz") = "b". The index restarts at every entry.
    b1 = b"\x00\x03\x01abc1" + EMPTY_BLOCK  # [0, 20)
    b2 = b"\x00\x03\x01abz2" + EMPTY_BLOCK  # [20, 40)
    index = (
        b"\x00\x03\x02abd"
        + b"\x00\x0f"  # handle(0, 15)
        + b"\x00\x01\x02b"
        + b"\x14\x0f"  # handle(20, 15)
        + u32(0)
        + u32(8)
        + u32(2)
    )
    data = b1 + trailer(b1) + b2 + trailer(b2)
    data += EMPTY_BLOCK + trailer(EMPTY_BLOCK)  # [40, 53)
    data += index + trailer(index)  # [53, 84)
    data += b"\x28\x08\x35\x1a" + b"\x00" * 36 + MAGIC_LE
    entries = [(b"abc", b"1"), (b"abz", b"2")]
    assert build(entries, block_size=1) == data
    assert read(data) == entries


# --- TableBuilder structure -------------------------------------------------------


def index_keys(data):
    return [b[0] for b in parse_table(data)[2]]


@pytest.mark.parametrize(
    "a,b,sep",
    [
        (b"abc", b"abz", b"abd"),
        (b"the quick brown fox", b"the who", b"the r"),
        (b"abc", b"abd", b"abc"),  # 'c' + 1 is not < 'd': unchanged
        (b"abc", b"abcd", b"abc"),  # a prefix of the next key: unchanged
        (b"a\xff\xff", b"b", b"a\xff\xff"),  # 'a' + 1 is not < 'b'
        (b"a\xffz", b"c", b"b"),
        (b"\xff\x01", b"\xff\x05", b"\xff\x02"),
        (b"", b"a", b""),
    ],
)
def test_index_separator(a, b, sep):
    data = build([(a, b"1"), (b, b"2")], block_size=1)
    assert len(parse_table(data)[2]) == 2
    assert index_keys(data)[0] == sep
    assert read(data) == [(a, b"1"), (b, b"2")]


@pytest.mark.parametrize(
    "last,succ",
    [
        (b"abz", b"b"),
        (b"\xff\xff", b"\xff\xff"),  # nothing to increment: stays
        (b"\xff\x05zz", b"\xff\x06"),
        (b"dense/kernel", b"e"),
    ],
)
def test_index_last_key_short_successor(last, succ):
    data = build([(b"", b"h"), (last, b"v")])
    assert index_keys(data) == [succ]
    assert read(data) == [(b"", b"h"), (last, b"v")]


def test_restart_points_every_16_entries():
    kvs = [(b"key%03d" % i, b"v%d" % i) for i in range(40)]
    data = build(kvs)
    (_, meta, blocks) = parse_table(data)
    assert meta == EMPTY_BLOCK
    assert len(blocks) == 1
    entries, restarts = parse_raw_block(blocks[0][4])
    assert [e[1] for e in entries] == [k for k, _ in kvs]
    assert restarts == [entries[0][3], entries[16][3], entries[32][3]]
    assert [e[0] for e in entries[:3]] == [0, 5, 5]
    assert entries[16][0] == 0 and entries[32][0] == 0
    assert entries[17][0] == 5


def test_large_entry_flushes_current_block_first():
    # key + value >= 2 * block_size: the pending block is cut before adding it.
    data = build([(b"a", b"x"), (b"b", b"y" * 199)], block_size=100)
    blocks = parse_table(data)[2]
    assert [b[0] for b in blocks] == [b"a", b"c"]
    assert [e[1] for e in parse_raw_block(blocks[0][4])[0]] == [b"a"]
    # One byte less and both share a block.
    data = build([(b"a", b"x"), (b"b", b"y" * 198)], block_size=100)
    blocks = parse_table(data)[2]
    assert [b[0] for b in blocks] == [b"c"]


def test_block_cut_at_size_estimate():
    # Estimate = entries + 4 * restarts + 4. Keys "a".."f" share nothing, so an entry
    # with an 8-byte value is 3 + 1 + 8 = 12 bytes; after n entries the estimate is 12n + 8.
    kvs = [(bytes([0x61 + i]), b"v" * 8) for i in range(6)]
    data = build(kvs, block_size=12 * 3 + 8)  # reached after the 3rd entry
    blocks = parse_table(data)[2]
    assert [len(parse_raw_block(b[4])[0]) for b in blocks] == [3, 3]
    data = build(kvs, block_size=12 * 3 + 9)  # needs a 4th
    blocks = parse_table(data)[2]
    assert [len(parse_raw_block(b[4])[0]) for b in blocks] == [4, 2]


def test_builder_refuses_misuse():
    b = T.TableBuilder(io.BytesIO())
    b.add(b"b", b"")
    with pytest.raises(ValueError):
        b.add(b"a", b"")
    with pytest.raises(ValueError):
        b.add(b"b", b"")  # duplicate
    b.finish()
    with pytest.raises(ValueError):
        b.finish()
    with pytest.raises(ValueError):
        T.TableBuilder(io.BytesIO(), compression=T.SNAPPY_COMPRESSION)


small_keys = st.lists(st.sampled_from([0x00, 0x01, 0x61, 0x62, 0xFE, 0xFF]), max_size=6).map(bytes)
any_keys = st.one_of(small_keys, st.binary(max_size=20))
values = st.one_of(st.binary(max_size=40), st.binary(min_size=150, max_size=700))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(any_keys, values), unique_by=lambda kv: kv[0], max_size=80),
    st.sampled_from([1, 16, 64, 256, 4096, T.BLOCK_SIZE]),
)
def test_roundtrip_and_structure(kvs, block_size):
    kvs = sorted(kvs)
    data = build(kvs, block_size=block_size)
    assert read(data) == kvs
    # Structure, checked with the test-side parser.
    _, meta, blocks = parse_table(data)
    assert meta == EMPTY_BLOCK
    got, prev_last = [], None
    for i, (sep, _, _, ctype, contents) in enumerate(blocks):
        assert ctype == 0
        entries, restarts = parse_raw_block(contents)
        assert entries, "empty data block"
        assert restarts == [e[3] for e in entries[::16]]
        assert all(e[0] == 0 for e in entries[::16])
        keys = [e[1] for e in entries]
        assert keys[-1] <= sep
        assert len(sep) <= len(keys[-1])
        if prev_last is not None:
            prev_sep, prev_key = prev_last
            assert prev_key <= prev_sep < keys[0]
        prev_last = (sep, keys[-1])
        got += [(e[1], e[2]) for e in entries]
        if i + 1 < len(blocks):
            # A block was cut because it was full or because the next entry was large.
            nk = blocks[i + 1]
            first_next = parse_raw_block(nk[4])[0][0]
            assert (
                len(contents) >= block_size
                or len(first_next[1]) + len(first_next[2]) >= 2 * block_size
            )
    assert got == kvs


# --- corruption -----------------------------------------------------------------


def multi_block_table():
    kvs = [(b"", b"header")] + [(b"var/%02d" % i, bytes([i]) * (i % 7)) for i in range(30)]
    return kvs, build(kvs, block_size=64)


def test_multi_block_fixture_is_multi_block():
    kvs, data = multi_block_table()
    assert len(parse_table(data)[2]) >= 4
    assert read(data) == kvs


def test_wrong_magic():
    data = hand_table()
    expect_corrupt(data[:-1] + b"\xdc", match="magic")
    expect_corrupt(data[:-8] + b"\x00" * 8, match="magic")


@pytest.mark.parametrize("n", [0, 1, 8, 47])
def test_shorter_than_footer(n):
    expect_corrupt(hand_table()[-n:] if n else b"")


def test_truncated_everywhere():
    _, data = multi_block_table()
    (mo, ms, io_, is_), _, blocks = parse_table(data)
    boundaries = {b[1] + b[2] + 5 for b in blocks} | {mo + ms + 5, io_ + is_ + 5, len(data) - 1}
    for n in sorted(boundaries):
        expect_corrupt(data[:n])
    for n in range(len(data)):
        expect_corrupt(data[:n])


def test_flipped_bit_in_any_block_is_a_checksum_error():
    data = hand_table()
    metaindex = range(51, 64)
    for pos in range(len(data) - 48):
        for bit in range(8):
            bad = bytearray(data)
            bad[pos] ^= 1 << bit
            if pos in metaindex:
                # TensorFlow's Table::Open never reads the (always empty) metaindex
                # block, so neither does tfckpt: a flip there goes unnoticed.
                assert read(bytes(bad)) == HAND_ENTRIES
            else:
                expect_corrupt(bytes(bad))


def test_flipped_bit_in_block_reports_checksum():
    data = bytearray(hand_table())
    data[10] ^= 0x04
    expect_corrupt(bytes(data), match="checksum")


def test_flipped_bit_in_footer():
    data = hand_table()
    for pos in list(range(4)) + list(range(40, 48)):
        for bit in range(8):
            bad = bytearray(data)
            bad[len(data) - 48 + pos] ^= 1 << bit
            bad = bytes(bad)
            try:
                entries = T.TableReader(bad, PATH).entries
            except tfckpt.CorruptCheckpointError as e:
                assert PATH in str(e)
            else:
                # Only a flip that leaves the handles' values intact may pass (e.g. a
                # continuation bit absorbing a zero padding byte).
                assert entries == HAND_ENTRIES
                assert pos < 4


def test_index_handle_past_eof():
    data = hand_table()
    body = data[:-48]
    expect_corrupt(body + footer(51, 8, 64, 14000), match="past the end")
    expect_corrupt(body + footer(51, 8, 2**63, 14), match="past the end")
    # Reaching into the footer is not allowed either.
    expect_corrupt(body + footer(51, 8, 64, 14 + 1))


def test_data_handle_past_eof():
    block = prefix_block([(b"a", b"1")])
    expect_corrupt(
        assemble([block], [b"b"], index_handles=[handle(0, 10**6)]), match="past the end"
    )
    expect_corrupt(assemble([block], [b"b"], index_handles=[handle(10**9, 5)]))


def test_bad_handle_varint_in_index():
    block = prefix_block([(b"a", b"1")])
    expect_corrupt(assemble([block], [b"b"], index_handles=[b"\x80"]))
    expect_corrupt(assemble([block], [b"b"], index_handles=[b""]))


def test_bad_footer_handle_varint():
    data = hand_table()
    expect_corrupt(data[:-48] + b"\xff" * 40 + MAGIC_LE)


def test_restart_count_larger_than_block():
    good = prefix_block([(b"a", b"1"), (b"b", b"2")])
    bad = good[:-4] + u32(1000)
    expect_corrupt(assemble([bad], [b"c"]), match="restart count")
    expect_corrupt(assemble([good[:-4] + u32(0xFFFFFFFF)], [b"c"]))
    # Also in the index block.
    data = assemble(
        [good], index_contents=b"\x00\x01\x02c\x00" + bytes([len(good)]) + u32(0) + u32(7)
    )
    expect_corrupt(data)


def test_block_shorter_than_restart_count():
    expect_corrupt(assemble([b"\x01\x00"], [b"c"]))
    expect_corrupt(assemble([b""], [b"c"]))


def test_restart_offset_out_of_range():
    bad = raw_block([(0, b"a", b"1"), (0, b"b", b"2")], restarts=(0, 200))
    expect_corrupt(assemble([bad], [b"c"]), match="restart offset")


def test_shared_longer_than_previous_key():
    bad = raw_block([(0, b"ab", b"1"), (3, b"c", b"2")])
    expect_corrupt(assemble([bad], [b"b"]), match="shares 3 bytes")
    # The first entry of a block has no previous key.
    bad = raw_block([(1, b"a", b"1")])
    expect_corrupt(assemble([bad], [b"b"]))


def test_entry_runs_past_block():
    bad = b"\x00\x01\x09a12" + u32(0) + u32(1)
    expect_corrupt(assemble([bad], [b"b"]))
    # A varint running into the restart array.
    bad = b"\x00\x81" + u32(0) + u32(1)
    expect_corrupt(assemble([bad], [b"b"]))


def test_unsorted_keys_within_block():
    bad = raw_block([(0, b"b", b"1"), (0, b"a", b"2")])
    expect_corrupt(assemble([bad], [b"c"]), match="unsorted")


def test_duplicate_keys_within_block():
    bad = raw_block([(0, b"a", b"1"), (1, b"", b"2")])
    expect_corrupt(assemble([bad], [b"b"]), match="unsorted or duplicated")


def test_unsorted_keys_across_blocks():
    b1 = prefix_block([(b"m", b"1")])
    b2 = prefix_block([(b"a", b"2")])
    expect_corrupt(assemble([b1, b2], [b"n", b"o"]))
    b2 = prefix_block([(b"m", b"2")])
    expect_corrupt(assemble([b1, b2], [b"m", b"n"]))


def test_key_beyond_its_index_entry():
    b1 = prefix_block([(b"a", b"1"), (b"q", b"2")])
    expect_corrupt(assemble([b1], [b"p"]), match="beyond its index")


def test_unknown_compression_type():
    block = prefix_block([(b"a", b"1")])
    data = assemble([(block, 2)], [b"b"])
    with pytest.raises(tfckpt.UnsupportedCheckpointError, match="compression type 2") as ei:
        T.TableReader(data, PATH)
    assert ei.value.path == PATH and PATH in str(ei.value)
    # Index block too.
    data = assemble([block], [b"b"], index_type=7)
    with pytest.raises(tfckpt.UnsupportedCheckpointError, match="compression type 7"):
        T.TableReader(data, PATH)


def test_wrong_stored_crc_and_type_byte():
    block = prefix_block([(b"a", b"1")])
    good_t = trailer(block)
    # CRC not masked.
    raw = b"\x00" + u32(crc32c_lib.crc32c(block + b"\x00"))
    expect_corrupt(assemble([(block, 0, raw)], [b"b"]), match="checksum")
    # CRC over the contents only, without the type byte.
    no_type = b"\x00" + u32(mask(crc32c_lib.crc32c(block)))
    expect_corrupt(assemble([(block, 0, no_type)], [b"b"]), match="checksum")
    # Type byte changed but CRC kept.
    expect_corrupt(assemble([(block, 0, b"\x01" + good_t[1:])], [b"b"]), match="checksum")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.binary(max_size=8))
def test_fuzz_block_contents_only_checkpoint_errors(contents, sep):
    """Garbage block contents with a valid checksum: a clean error or entries, never a crash."""
    try:
        entries = read(assemble([contents], [sep]))
    except tfckpt.CorruptCheckpointError as e:
        assert PATH in str(e)
    else:
        keys = [k for k, _ in entries]
        assert keys == sorted(set(keys))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_fuzz_index_contents_only_checkpoint_errors(index):
    block = prefix_block([(b"a", b"1"), (b"b", b"2")])
    try:
        read(assemble([block], index_contents=index))
    except tfckpt.CorruptCheckpointError as e:
        assert PATH in str(e)


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=40, max_size=40))
def test_fuzz_footer_only_checkpoint_errors(handles):
    body = hand_table()[:-48]
    try:
        entries = read(body + handles + MAGIC_LE)
    except tfckpt.CorruptCheckpointError as e:
        assert PATH in str(e)
    else:
        assert entries == HAND_ENTRIES


# --- snappy -----------------------------------------------------------------------


def lit(data: bytes) -> bytes:
    """A snappy literal element (test-side)."""
    n = len(data) - 1
    if n < 60:
        return bytes([n << 2]) + data
    nb = (n.bit_length() + 7) // 8
    return bytes([(59 + nb) << 2]) + n.to_bytes(nb, "little") + data


@pytest.mark.parametrize(
    "stream,expected",
    [
        (b"\x00", b""),
        (b"\x05\x10hello", b"hello"),  # literal, length in tag
        (b"\x64\xf0\x63" + b"x" * 100, b"x" * 100),  # literal, 1 length byte
        (
            b"\xac\x02\xf4\x2b\x01" + bytes(range(256)) + bytes(44),
            bytes(range(256)) + bytes(44),
        ),  # literal, 2 length bytes
        (b"\x08\x0cabcd\x01\x04", b"abcdabcd"),  # copy-1: len 4, offset 4
        (b"\x0c\x00a\x1d\x01", b"a" * 12),  # copy-1 overlapping run
        (b"\x0c\x04ab\x19\x02", b"ab" * 6),  # len 10 offset 2
        (b"\x44\x0cabcd\xfe\x04\x00", b"abcd" * 17),  # copy-2: len 64, offset 4
        (
            b"\x10\x28hello world\x13\x0b\x00\x00\x00",
            b"hello worldhello",
        ),  # copy-4: len 5, offset 11
        (b"\x09\x08xyz\x0e\x02\x00\x04xy", b"xyzyzyzxy"),  # copy-2 overlap, then literal
    ],
)
def test_snappy_hand_streams(stream, expected):
    assert T.snappy_decompress(stream) == expected


def test_snappy_copy1_long_offset():
    # 300 literal bytes, then copy-1 of length 11 at offset 300: the offset's high
    # 3 bits go in the tag (300 = 0x12c -> 1 << 5 | (11 - 4) << 2 | 1 = 0x3d, then 0x2c).
    src = bytes((i * 7) % 251 for i in range(300))
    stream = varint(311) + lit(src) + b"\x3d\x2c"
    assert T.snappy_decompress(stream) == src + src[:11]


@pytest.mark.parametrize(
    "stream",
    [
        b"",  # no length
        b"\x80",  # truncated length varint
        b"\x08\x0cabcd\x01\x00",  # copy offset 0
        b"\x08\x0cabcd\x01\x05",  # copy offset beyond output
        b"\x04\x01\x01",  # copy before any output
        b"\x09\x0cabcd\x01\x04",  # declared longer than produced
        b"\x07\x0cabcd\x01\x04",  # declared shorter: copy overflows
        b"\x03\x0cabcd",  # declared shorter: literal overflows
        b"\x05\x10hel",  # truncated literal
        b"\x64\xf0",  # truncated literal length
        b"\x08\x0cabcd\x01",  # truncated copy-1
        b"\x08\x0cabcd\x0e\x04",  # truncated copy-2
        b"\x08\x0cabcd\x0f\x04\x00\x00",  # truncated copy-4
        b"\xff\xff\xff\xff\x0f\x00a",  # absurd declared length
        b"\xff\xff\xff\xff\x1f",  # length beyond varint32
    ],
)
def test_snappy_bad_streams(stream):
    with pytest.raises(ValueError):
        T.snappy_decompress(stream)


@needs_cramjam
@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=3000),
        st.lists(
            st.sampled_from([b"a", b"ab", b"tensor/", b"\x00\x00\x00\x00", b"xyz" * 30]),
            max_size=400,
        ).map(b"".join),
    )
)
def test_snappy_matches_real_compressor(data):
    compressed = bytes(cramjam.snappy.compress_raw(data))
    assert T.snappy_decompress(compressed) == data


@needs_cramjam
def test_snappy_real_compressor_large_and_compressible():
    import random

    rnd = random.Random(1234)
    for data in [
        bytes(rnd.getrandbits(8) for _ in range(200_000)),
        b"a" * 100_000,
        b"".join(b"var/%06d" % rnd.randrange(1000) for _ in range(20_000)),
    ]:
        compressed = bytes(cramjam.snappy.compress_raw(data))
        assert T.snappy_decompress(compressed) == data


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_snappy_fuzz_only_value_error(data):
    try:
        out = T.snappy_decompress(data)
    except ValueError:
        return
    assert isinstance(out, bytes)


def snappy_table(data: bytes, compress_meta: bool = False) -> bytes:
    """Rewrite an uncompressed table so its data and index blocks are snappy (type 1)."""
    _, meta, blocks = parse_table(data)
    out = bytearray()
    handles = []
    for _, _, _, _, contents in blocks:
        c = bytes(cramjam.snappy.compress_raw(contents))
        handles.append(handle(len(out), len(c)))
        out += c + trailer(c, 1)
    mc = bytes(cramjam.snappy.compress_raw(meta)) if compress_meta else meta
    meta_h = (len(out), len(mc))
    out += mc + trailer(mc, 1 if compress_meta else 0)
    index = prefix_block([(b[0], h) for b, h in zip(blocks, handles)], interval=1)
    ic = bytes(cramjam.snappy.compress_raw(index))
    idx_h = (len(out), len(ic))
    out += ic + trailer(ic, 1)
    out += footer(*meta_h, *idx_h)
    return bytes(out)


@needs_cramjam
def test_snappy_table_reads_back():
    kvs = [(b"", b"header")] + [
        (b"layer_%03d/kernel" % i, b"\x00" * (i * 13 % 97)) for i in range(200)
    ]
    plain = build(kvs, block_size=512)
    assert len(parse_table(plain)[2]) > 3
    data = snappy_table(plain)
    _, _, blocks = parse_table(data)
    assert all(b[3] == 1 for b in blocks)
    assert read(data) == kvs
    assert read(snappy_table(plain, compress_meta=True)) == kvs


@needs_cramjam
@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.tuples(any_keys, values), unique_by=lambda kv: kv[0], max_size=60),
    st.sampled_from([1, 64, 256, 4096]),
)
def test_snappy_table_roundtrip(kvs, block_size):
    kvs = sorted(kvs)
    assert read(snappy_table(build(kvs, block_size=block_size))) == kvs


@pytest.mark.parametrize(
    "stream",
    [
        b"\x08\x0cabcd\x01\x00",  # offset 0
        b"\x08\x0cabcd\x01\x05",  # offset beyond output
        b"\x09\x0cabcd\x01\x04",  # length mismatch
        b"\x05\x10hel",  # truncated literal
        b"",  # empty
    ],
)
def test_bad_snappy_block_is_corrupt(stream):
    # Valid checksum over the bad stream, so only the decompressor can object.
    expect_corrupt(assemble([(stream, 1)], [b"b"]))
    # The same in the index block.
    block = prefix_block([(b"a", b"1")])
    expect_corrupt(assemble([block], index_contents=stream, index_type=1))


@needs_cramjam
def test_snappy_block_decompressing_to_garbage_is_corrupt():
    garbage = b"\x01\x02\x03\xff\xff\xff\xff"
    stream = bytes(cramjam.snappy.compress_raw(garbage))
    expect_corrupt(assemble([(stream, 1)], [b"b"]))
