"""Message body compression, as a record's sysFlag describes it (docs/protocol.md §4.4, §5.2).

sysFlag bit 0 (0x1) says "the body is compressed"; RocketMQ 4.9.4+ adds the algorithm in bits
8-10: 0x100 LZ4, 0x200 ZSTD, 0x300 ZLIB, and 0 with bit 0 set still means zlib.  4.x clients
(the C++ client included) only know bit 0 and always inflate with zlib, so an LZ4 or ZSTD body must
never reach them with bit 0 set: `to_4x_compatible` / `recompress_records_for_4x` rewrite such
bodies to zlib (or plain) before they are served.

Formats: zlib is the zlib stream (2-byte header, deflate, Adler-32), as the C++/Java producers
write it, deflated by ISA-L (`isal`: several times faster than zlib's deflate at a like ratio, the
same stream every inflater reads; zlib's levels 0-9 map onto ISA-L's 0-3) and inflated by zlib;
LZ4 is an LZ4 *frame* (what RocketMQ 5's Lz4Compressor writes through LZ4FrameOutputStream);
ZSTD is a zstd frame, read and written with the `zstandard` package when it is installed.
"""
from __future__ import annotations

import struct
import zlib

import lz4.frame
from isal import isal_zlib

from rmq_core import record_layout
from rmq_core.errors import RMQError

# sysFlag's compression bits (record_layout.pxd)
COMPRESSED_FLAG = record_layout.COMPRESSED
COMPRESSION_TYPE_MASK = record_layout.COMPRESSION_TYPE_MASK
COMPRESSION_LZ4 = record_layout.COMPRESSION_LZ4
COMPRESSION_ZSTD = record_layout.COMPRESSION_ZSTD
COMPRESSION_ZLIB = record_layout.COMPRESSION_ZLIB
# The C++ producer's compressMsgBodyOverHowmuch: bodies this large are worth deflating.
COMPRESS_OVER_DEFAULT = 4096
KINDS = ("zlib", "lz4", "zstd")

# zlib's compression levels on ISA-L's: -1 is zlib's default (6)
_ISAL_LEVEL = {-1: 2, 0: 0, 1: 0, 2: 0, 3: 1, 4: 1, 5: 1, 6: 2, 7: 2, 8: 3, 9: 3}
_KIND_BITS = {"zlib": COMPRESSED_FLAG, "lz4": COMPRESSED_FLAG | COMPRESSION_LZ4,
              "zstd": COMPRESSED_FLAG | COMPRESSION_ZSTD}


class CompressionError(RMQError, ValueError):
    """A body does not (de)compress, or the sysFlag names an unknown or unavailable algorithm."""


def _zstandard():
    try:
        import zstandard
    except ImportError:
        raise CompressionError(
            "ZSTD-compressed body (sysFlag compression type 0x200) but the 'zstandard' package is "
            "not installed: pip install zstandard"
        ) from None
    return zstandard


def compression_kind(sys_flag: int) -> str | None:
    """"zlib", "lz4" or "zstd" for a compressed body, None when sysFlag bit 0 is clear."""
    if not sys_flag & COMPRESSED_FLAG:
        return None
    bits = sys_flag & COMPRESSION_TYPE_MASK
    if bits == 0 or bits == COMPRESSION_ZLIB:
        return "zlib"
    if bits == COMPRESSION_LZ4:
        return "lz4"
    if bits == COMPRESSION_ZSTD:
        return "zstd"
    raise CompressionError(f"sysFlag 0x{sys_flag:X} names unknown compression type 0x{bits:X}")


def compress(body, kind: str = "zlib", level: int = 5) -> tuple[bytes, int]:
    """Compress `body`; returns (compressed bytes, bits to OR into sysFlag).

    zlib gives bit 0 only (0x1), the 4.x flag every client understands; lz4 gives 0x101 and zstd
    0x201 (RocketMQ 4.9.4+/5 readers only).  `level` applies to zlib (0-9) and zstd; LZ4 frames use
    lz4's default fast setting, as RocketMQ 5's Lz4Compressor does."""
    data = bytes(body) if not isinstance(body, bytes) else body
    if kind == "zlib":
        if level not in _ISAL_LEVEL:
            raise CompressionError(f"zlib compression level {level!r} is outside -1..9")
        return isal_zlib.compress(data, _ISAL_LEVEL[level]), _KIND_BITS["zlib"]
    if kind == "lz4":
        return lz4.frame.compress(data), _KIND_BITS["lz4"]
    if kind == "zstd":
        return _zstandard().ZstdCompressor(level=level).compress(data), _KIND_BITS["zstd"]
    raise CompressionError(f"unknown compression kind {kind!r}; expected one of {', '.join(KINDS)}")


def decompress(body, sys_flag: int) -> bytes:
    """The plain body: `body` itself when sysFlag bit 0 is clear, else inflated by the algorithm
    that sysFlag names.  Raises CompressionError naming the algorithm when the bytes are bad."""
    kind = compression_kind(sys_flag)
    data = bytes(body) if not isinstance(body, bytes) else body
    if kind is None:
        return data
    try:
        if kind == "zlib":
            return zlib.decompress(data)
        if kind == "lz4":
            return lz4.frame.decompress(data)
        # Streaming decoder: RocketMQ's ZstdOutputStream writes frames without a content size.
        zstd = _zstandard()
        try:
            return zstd.ZstdDecompressor().decompressobj().decompress(data)
        except zstd.ZstdError as exc:
            raise ValueError(str(exc)) from None
    except (zlib.error, RuntimeError, ValueError) as exc:
        raise CompressionError(
            f"{kind.upper()} body of {len(data)} bytes (sysFlag 0x{sys_flag:X}) does not decompress: {exc}"
        ) from None


def to_4x_compatible(body, sys_flag: int, *, compress_over: int = COMPRESS_OVER_DEFAULT,
                     level: int = 5) -> tuple[bytes, int]:
    """(body, sysFlag) a 4.x client reads correctly.

    zlib bodies and plain bodies pass through unchanged.  An LZ4/ZSTD body is inflated and, when
    the plain body is at least `compress_over` bytes, deflated again with zlib (flag 0x1);
    smaller ones go out plain (bit 0 cleared).  The compression-type bits are always cleared."""
    if not sys_flag & COMPRESSED_FLAG:
        return body, sys_flag & ~COMPRESSION_TYPE_MASK
    if compression_kind(sys_flag) == "zlib":
        return body, sys_flag
    plain = decompress(body, sys_flag)
    base = sys_flag & ~(COMPRESSED_FLAG | COMPRESSION_TYPE_MASK)
    if len(plain) >= compress_over:
        return compress(plain, "zlib", level)[0], base | COMPRESSED_FLAG
    return plain, base


def recompress_records_for_4x(buf, *, compress_over: int = COMPRESS_OVER_DEFAULT, level: int = 5):
    """Rewrite concatenated records so none carries an LZ4/ZSTD body (docs/protocol.md §4.4: a 4.x
    client inflates every bit-0 body with zlib).  zlib records pass through as they are, 0x301
    included: 4.x clients read bit 0 and ignore the type bits.

    Fast path: when no record has type bits, `buf` itself is returned (no copy).  Otherwise each
    affected record gets its new body, BODYLENGTH, TOTALSIZE and sysFlag.  BODYCRC is recomputed
    over the new body: RocketMQ defines it as the CRC of the body stored in that record, and the
    rewritten record must stay self-consistent for anyone who verifies it (the 4.x clients do not).
    Every other field, BLANK records included, is copied byte for byte."""
    from rmq_core._native.record import decode_message, has_compression_type_bits, record_sizes_and_flags

    if not has_compression_type_bits(buf):
        return buf
    view = memoryview(buf).cast("B") if not isinstance(buf, bytes) else buf
    out = []
    for offset, size, sys_flag in record_sizes_and_flags(buf):
        record = bytes(view[offset:offset + size])
        if sys_flag is None or not sys_flag & COMPRESSION_TYPE_MASK:
            out.append(record)
            continue
        # Full framing check of the record before its parts are cut apart.
        body = decode_message(buf, offset, decompress=False).body
        body_len = len(body)
        blp = record_layout.body_length_at(sys_flag)
        new_body, new_flag = to_4x_compatible(body, sys_flag, compress_over=compress_over, level=level)
        tail = record[blp + 4 + body_len:]
        total = size - body_len + len(new_body)
        out.append(b"".join((
            struct.pack(">i", total), record[4:8],
            struct.pack(">i", zlib.crc32(new_body) & 0x7FFFFFFF), record[record_layout.QUEUE_ID_AT:record_layout.SYS_FLAG_AT],
            struct.pack(">i", new_flag), record[record_layout.BORN_TIMESTAMP_AT:blp],
            struct.pack(">i", len(new_body)), new_body, tail,
        )))
    return b"".join(out)
