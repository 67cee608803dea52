"""Body compression by sysFlag, and serving LZ4/ZSTD-stored records to 4.x clients as zlib/plain."""
import struct
import sys
import zlib

import lz4.frame
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_core import compression
from rmq_core.codec import MessageDecodeError, decode_messages, record_sizes_and_flags
from tests.codec_oracle import encode_message_record
from rmq_core.compression import (
    CompressionError,
    compress,
    compression_kind,
    decompress,
    recompress_records_for_4x,
    to_4x_compatible,
)

PLAIN = b"The quick brown fox jumps over the lazy dog. " * 200  # 9000 bytes


@pytest.mark.parametrize("kind, bits", [("zlib", 0x1), ("lz4", 0x101), ("zstd", 0x201)])
def test_compress_round_trip_and_flag_bits(kind, bits):
    body, flag_bits = compress(PLAIN, kind)
    assert flag_bits == bits and len(body) < len(PLAIN)
    assert compression_kind(flag_bits) == kind
    assert decompress(body, flag_bits | 0x4) == PLAIN  # other sysFlag bits do not matter


def test_formats_are_the_ones_other_implementations_write():
    # a zlib stream (header 0x78, deflate, Adler-32): what the C++ producer sends and every 4.x
    # reader inflates (docs/protocol.md §4.4), at each level
    for level in range(-1, 10):
        body, _ = compress(PLAIN, "zlib", level)
        assert body[0] == 0x78 and zlib.decompress(body) == PLAIN and len(body) < len(PLAIN) // 10
    # LZ4 frame (magic 04 22 4D 18), as RocketMQ 5's LZ4FrameOutputStream writes
    body, _ = compress(PLAIN, "lz4")
    assert body[:4] == b"\x04\x22\x4d\x18"
    # ZSTD frame; RocketMQ's ZstdOutputStream leaves out the content size, so decode streams
    streamed = zstandard.ZstdCompressor(write_content_size=False).compress(PLAIN)
    assert decompress(streamed, 0x201) == PLAIN


def test_zlib_is_bit0_alone_or_type_0x300():
    body = zlib.compress(PLAIN)
    assert decompress(body, 0x1) == decompress(body, 0x301) == PLAIN
    assert decompress(body, 0x0) == body  # not compressed: returned as is
    assert compression_kind(0x300) is None


def test_bad_bodies_and_unknown_types_name_the_problem():
    with pytest.raises(CompressionError, match="LZ4 body of 21 bytes .sysFlag 0x101. does not decompress"):
        decompress(b"this-is-not-zlib-data", 0x101)
    with pytest.raises(CompressionError, match="ZLIB body"):
        decompress(b"garbage", 0x1)
    with pytest.raises(CompressionError, match="ZSTD body"):
        decompress(b"garbage", 0x201)
    with pytest.raises(CompressionError, match="unknown compression type 0x400"):
        decompress(b"x", 0x401)
    with pytest.raises(CompressionError, match="unknown compression kind 'snappy'"):
        compress(b"x", "snappy")
    with pytest.raises(CompressionError, match="level 12"):
        compress(b"x", "zlib", level=12)


def test_zstd_without_the_package_is_a_clear_error(monkeypatch):
    body, bits = compress(PLAIN, "zstd")
    monkeypatch.setitem(sys.modules, "zstandard", None)  # makes `import zstandard` fail
    with pytest.raises(CompressionError, match="ZSTD.*'zstandard' package is not installed"):
        decompress(body, bits)
    with pytest.raises(CompressionError, match="ZSTD"):
        compress(PLAIN, "zstd")
    assert decompress(*compress(PLAIN, "lz4")) == PLAIN  # the others do not need it


def test_to_4x_compatible():
    lz4_big, bits = compress(PLAIN, "lz4")
    body, flag = to_4x_compatible(lz4_big, bits | 0x8)
    assert flag == 0x9 and zlib.decompress(body) == PLAIN  # zlib, bit 0 only, other bits kept
    small = b"tiny body"
    body, flag = to_4x_compatible(lz4.frame.compress(small), 0x101)
    assert (body, flag) == (small, 0)  # small: plain is cheaper than re-deflating
    zstd_body, zbits = compress(PLAIN, "zstd")
    body, flag = to_4x_compatible(zstd_body, zbits, compress_over=10**9)
    assert (body, flag) == (PLAIN, 0)
    zl = zlib.compress(PLAIN)
    assert to_4x_compatible(zl, 0x1)[0] is zl and to_4x_compatible(zl, 0x301) == (zl, 0x301)
    assert to_4x_compatible(PLAIN, 0x100) == (PLAIN, 0)  # type bits without bit 0 mean nothing


def _record(i, body, sys_flag=0, **kw):
    return encode_message_record(topic="Mixed", body=body, queue_offset=i, sys_flag=sys_flag,
                                 commit_log_offset=1000 * i,
                                 properties={"UNIQ_KEY": f"ID{i}", "TAGS": "T"}, **kw)


def test_recompress_fast_path_returns_the_same_object():
    buf = b"".join([_record(0, b"plain"), _record(1, zlib.compress(PLAIN), 0x1),
                    _record(2, zlib.compress(PLAIN, 9), 0x1 | 0x8)])
    assert recompress_records_for_4x(buf) is buf
    view = memoryview(bytearray(buf))
    assert recompress_records_for_4x(view) is view
    assert recompress_records_for_4x(b"") == b""


def test_recompress_rewrites_only_lz4_and_zstd_records():
    lz4_body, lz4_bits = compress(PLAIN, "lz4")
    zstd_small, zstd_bits = compress(b"short zstd body", "zstd")
    zlib_body = zlib.compress(PLAIN)
    blank = struct.pack(">iI", 24, 0xCBD43194) + bytes(16)
    parts = [
        _record(0, b"plain"),
        _record(1, lz4_body, lz4_bits | 0x4),
        blank,
        _record(2, zlib_body, 0x301),  # zlib with the 4.9.4 type bits: 4.x clients read it as is
        _record(3, zstd_small, zstd_bits, born_host=("::1", 7), store_host=("fe80::1", 10911)),
    ]
    buf = b"".join(parts)
    out = recompress_records_for_4x(buf)
    sizes = record_sizes_and_flags(out)
    assert [f for _, _, f in sizes] == [0, 0x5, None, 0x301, 0x30]  # no LZ4/ZSTD left
    records = [out[o:o + n] for o, n, _ in sizes]
    assert records[0] == parts[0] and records[2] == blank and records[3] == parts[3]
    for (offset, size, _), rec in zip(sizes, records):
        assert struct.unpack_from(">i", rec)[0] == size
    # every record stays self-consistent: TOTALSIZE, BODYLENGTH and BODYCRC match the new body
    raw = decode_messages(out, decompress=False)
    for m in raw:
        assert m.body_crc == zlib.crc32(m.body) & 0x7FFFFFFF
    assert zlib.decompress(raw[1].body) == PLAIN and raw[3].body == b"short zstd body"
    # what a 4.x client would read: the same messages, same ids and offsets
    before = decode_messages(buf)
    after = decode_messages(out)
    assert [(m.body, m.msg_id, m.queue_offset, m.commit_log_offset, m.store_host) for m in after] == \
           [(m.body, m.msg_id, m.queue_offset, m.commit_log_offset, m.store_host) for m in before]


def test_recompress_refuses_a_record_that_does_not_decompress_or_does_not_add_up():
    bad = _record(0, b"this-is-not-lz4", 0x101)
    with pytest.raises(CompressionError, match="LZ4"):
        recompress_records_for_4x(bad)
    lying = bytearray(_record(0, lz4.frame.compress(b"abc"), 0x101))
    struct.pack_into(">i", lying, 84, 10_000)  # BODYLENGTH past the record
    with pytest.raises(MessageDecodeError, match="offset 0: body length 10000"):
        recompress_records_for_4x(bytes(lying))
    first = _record(1, b"plain")
    with pytest.raises(MessageDecodeError, match=f"offset {len(first)}: body length 10000"):
        recompress_records_for_4x(first + bytes(lying))
    with pytest.raises(MessageDecodeError, match="magic code"):
        recompress_records_for_4x(bytes(lying) + b"\x00" * 12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["plain", "zlib", "lz4", "zstd"]),
                          st.binary(max_size=6000)), max_size=5))
def test_recompress_preserves_every_message(specs):
    parts = []
    for i, (kind, plain) in enumerate(specs):
        if kind == "plain":
            parts.append(_record(i, plain))
        else:
            parts.append(_record(i, *compress(plain, kind)))
    buf = b"".join(parts)
    out = recompress_records_for_4x(buf)
    assert [m.body for m in decode_messages(out)] == [p for _, p in specs]
    assert all((f or 0) & 0x700 in (0, 0x300) for _, _, f in record_sizes_and_flags(out))
    if not any(k in ("lz4", "zstd") for k, _ in specs):
        assert out is buf


def test_compression_constants_match_message_sysflag():
    from rmq_core.message import SysFlag

    assert compression.COMPRESSED_FLAG == SysFlag.COMPRESSED
    assert compression.COMPRESSION_LZ4 == SysFlag.COMPRESSION_LZ4
    assert compression.COMPRESSION_ZSTD == SysFlag.COMPRESSION_ZSTD
    assert compression.COMPRESSION_ZLIB == SysFlag.COMPRESSION_ZLIB
    assert compression.COMPRESSION_TYPE_MASK == SysFlag.COMPRESSION_TYPE_MASK
