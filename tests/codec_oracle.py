"""Pure-Python reference twins of the native record code (rmq_core._native.record), written
straight from the layout in docs/protocol.md §5: the oracles the property tests hold the native
routines to, and the encoders tests use to make records and batch bodies by hand.  Test-only: no
runtime code imports this (tests/test_layering.py checks).

`encode_batch_items` is the SEND_BATCH_MESSAGE body of (flag, body, properties) items, for tests
that build one without Message objects (the client's encoder is
rmq_core._native.record_batch.encode_send_batch)."""
from __future__ import annotations

import socket
import struct
import zlib
from typing import Iterable, Mapping

from rmq_core import compression
from rmq_core import record_layout as layout
from rmq_core._native.record import MessageExt, host_bytes
from rmq_core.errors import IllegalArgumentError, MessageDecodeError
from rmq_core.message import BLANK_MAGIC_CODE, MAX_PROPERTIES_LENGTH, MAX_TOPIC_LENGTH, MESSAGE_MAGIC_CODE

BORNHOST_V6_FLAG = layout.BORNHOST_V6
STOREHOST_V6_FLAG = layout.STOREHOST_V6
RECORD_FIXED_V4 = layout.RECORD_FIXED_V4
BATCH_ITEM_FIXED = layout.BATCH_ITEM_FIXED

_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
# TOTALSIZE MAGIC BODYCRC QUEUEID FLAG QUEUEOFFSET PHYSICALOFFSET SYSFLAG BORNTIMESTAMP
_HEAD = struct.Struct(">iIiiiqqiq")
_TS_AND_HOST_TAIL = struct.Struct(">iq")  # port of the born host, store timestamp
_MIDDLE = struct.Struct(">iiqi")  # store port, reconsume times, prepared tx offset, body length
_BATCH_HEAD = struct.Struct(">iiiii")  # totalSize magic bodyCRC flag bodyLen


# --- properties and tag codes -------------------------------------------------------------------
def java_string_hash_py(s: str | None) -> int:
    """Java's String.hashCode over UTF-16 code units, as a signed int32 (the consume queue tag code)."""
    if not s:
        return 0
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


def string_to_properties_py(s: str | bytes | None) -> dict[str, str]:
    """Inverse of properties_to_bytes_py; pairs that do not split into two parts are dropped."""
    if not s:
        return {}
    if isinstance(s, (bytes, bytearray, memoryview)):
        s = bytes(s).decode("utf-8", "replace")
    out: dict[str, str] = {}
    for item in s.split("\x02"):
        k, sep, v = item.partition("\x01")
        if sep and k:
            out[k] = v
    return out


def properties_to_bytes_py(props: Mapping[str, object] | None) -> bytes:
    """Reference twin of `properties_to_bytes`: `name\\x01value\\x02...` in the mapping's order."""
    if props is None:
        return b""
    out = []
    items = props.items() if hasattr(props, "items") else props
    for key, value in items:
        if value is None:
            continue
        if type(key) is not str:
            raise IllegalArgumentError(f"property name {key!r} must be a str")
        value = value if type(value) is str else str(value)
        if not key:
            raise IllegalArgumentError(f"property name {key!r} is empty (value {value!r})")
        for sep, where, text in (("\x01", "the name", key), ("\x02", "the name", key),
                                 ("\x02", "the value", value)):
            if sep in text:
                raise IllegalArgumentError(
                    f"property {key!r}: {where} contains the separator {sep!r}, which would "
                    f"corrupt the properties string"
                )
        out.append(f"{key}\x01{value}\x02")
    return "".join(out).encode("utf-8")


def tags_code_from_properties_py(raw) -> int:
    """Reference twin of `tags_code_from_properties`."""
    return java_string_hash_py(string_to_properties_py(raw).get("TAGS"))


def _properties_blob(properties) -> bytes:
    if properties is None:
        return b""
    if isinstance(properties, str):
        return properties.encode("utf-8")
    if isinstance(properties, (bytes, bytearray, memoryview)):
        return bytes(properties)
    return properties_to_bytes_py(properties)


# --- hosts -----------------------------------------------------------------------------------------
def _host_bytes(host, what: str) -> tuple[bytes, int, bool]:
    """(address bytes, port, is_ipv6): the hosts are parsed by the one native parser."""
    raw = host_bytes(host, what)
    return raw[:-4], int.from_bytes(raw[-4:], "big", signed=True), len(raw) == layout.HOST_V6_LEN


def _format_host(raw: bytes, port: int) -> str:
    family = socket.AF_INET6 if len(raw) == 16 else socket.AF_INET
    return f"{socket.inet_ntop(family, raw)}:{port}"


# --- records -------------------------------------------------------------------------------------------
def encode_message_record(
    *,
    topic: str,
    body: bytes,
    queue_id: int = 0,
    flag: int = 0,
    queue_offset: int = 0,
    commit_log_offset: int = 0,
    sys_flag: int = 0,
    born_timestamp: int = 0,
    born_host=("127.0.0.1", 0),
    store_timestamp: int = 0,
    store_host=("127.0.0.1", 10911),
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
    properties: dict | str | bytes = "",
) -> bytes:
    """One v1 record, byte for byte as RocketMQ 4.x writes it (the store's test oracle).

    BODYCRC is CRC32(body) & 0x7FFFFFFF over the body as given (already compressed if sys_flag
    bit 0 says so).  The host-v6 bits of sys_flag are set from the hosts: an IPv6 host is written
    as 16+4 bytes with bit 0x10 (born) / 0x20 (store), an IPv4 host as 4+4 with the bit cleared."""
    if not isinstance(topic, str):
        raise IllegalArgumentError(f"topic must be a str, not {type(topic).__name__}: {topic!r}")
    topic_raw = topic.encode("utf-8")
    if len(topic_raw) > MAX_TOPIC_LENGTH:
        raise IllegalArgumentError(
            f"bad topic name {topic!r}: {len(topic_raw)} bytes, more than {MAX_TOPIC_LENGTH}"
        )
    if isinstance(body, str):
        body = body.encode("utf-8")
    elif not isinstance(body, bytes):
        if not isinstance(body, (bytearray, memoryview)):
            raise IllegalArgumentError(f"message body must be bytes, not {type(body).__name__}")
        body = bytes(body)
    props = _properties_blob(properties)
    if len(props) > MAX_PROPERTIES_LENGTH:
        raise IllegalArgumentError(
            f"message properties are {len(props)} bytes, more than {MAX_PROPERTIES_LENGTH}"
        )
    born_ip, born_port, born_v6 = _host_bytes(born_host, "born host")
    store_ip, store_port, store_v6 = _host_bytes(store_host, "store host")
    sys_flag &= ~(BORNHOST_V6_FLAG | STOREHOST_V6_FLAG)
    if born_v6:
        sys_flag |= BORNHOST_V6_FLAG
    if store_v6:
        sys_flag |= STOREHOST_V6_FLAG
    total = (RECORD_FIXED_V4 + 12 * born_v6 + 12 * store_v6 + len(body) + len(topic_raw)
             + len(props))
    try:
        return b"".join((
            _HEAD.pack(total, MESSAGE_MAGIC_CODE, zlib.crc32(body) & 0x7FFFFFFF, queue_id, flag,
                       queue_offset, commit_log_offset, sys_flag, born_timestamp),
            born_ip, _TS_AND_HOST_TAIL.pack(born_port, store_timestamp),
            store_ip, _MIDDLE.pack(store_port, reconsume_times, prepared_transaction_offset, len(body)),
            body, bytes((len(topic_raw),)), topic_raw, _I16.pack(len(props)), props,
        ))
    except struct.error as exc:
        raise IllegalArgumentError(
            f"a record field is out of range (queue_id={queue_id!r}, flag={flag!r}, "
            f"queue_offset={queue_offset!r}, commit_log_offset={commit_log_offset!r}, "
            f"sys_flag={sys_flag!r}, born_timestamp={born_timestamp!r}, "
            f"store_timestamp={store_timestamp!r}, reconsume_times={reconsume_times!r}, "
            f"prepared_transaction_offset={prepared_transaction_offset!r}): {exc}"
        ) from None


def _decode_record_py(data: bytes, pos: int, decompress: bool, read_body: bool, broker_name):
    """(MessageExt or None for BLANK, size) for the record at `pos` of `data`."""
    avail = len(data) - pos
    if avail < 8:
        raise MessageDecodeError(pos, f"truncated record: {avail} bytes left, a record header needs 8")
    total, magic = struct.unpack_from(">iI", data, pos)
    if magic == BLANK_MAGIC_CODE:
        if not 8 <= total <= avail:
            raise MessageDecodeError(pos, f"BLANK record size {total} is outside 8..{avail}")
        return None, total
    if magic != MESSAGE_MAGIC_CODE:
        raise MessageDecodeError(pos, f"magic code 0x{magic:08X} is not a message or BLANK")
    if not RECORD_FIXED_V4 <= total <= avail:
        raise MessageDecodeError(pos, f"record size {total} is outside {RECORD_FIXED_V4}..{avail}")
    (_, _, body_crc, queue_id, flag, queue_offset, commit_log_offset, sys_flag,
     born_timestamp) = _HEAD.unpack_from(data, pos)
    born_ip_len = 16 if sys_flag & BORNHOST_V6_FLAG else 4
    store_ip_len = 16 if sys_flag & STOREHOST_V6_FLAG else 4
    need = RECORD_FIXED_V4 + (born_ip_len - 4) + (store_ip_len - 4)
    if total < need:
        raise MessageDecodeError(pos, f"record size {total} is below the minimum {need}")
    q = pos + 48
    born_ip = data[q:q + born_ip_len]
    q += born_ip_len
    born_port, store_timestamp = _TS_AND_HOST_TAIL.unpack_from(data, q)
    q += 12
    store_ip = data[q:q + store_ip_len]
    q += store_ip_len
    store_port, reconsume_times, prepared, body_len = _MIDDLE.unpack_from(data, q)
    if not (0 <= born_port <= 65535 and 0 <= store_port <= 65535):
        raise MessageDecodeError(
            pos, f"host port out of 0..65535 (born {born_port}, store {store_port})")
    q += 20
    if not 0 <= body_len <= total - need:
        raise MessageDecodeError(pos, f"body length {body_len} does not fit in record size {total}")
    body = data[q:q + body_len]
    q += body_len
    topic_len = data[q]
    q += 1
    if topic_len > MAX_TOPIC_LENGTH or need + body_len + topic_len > total:
        raise MessageDecodeError(pos, f"topic length {topic_len} is over 127 or does not fit")
    topic = data[q:q + topic_len].decode("utf-8", "replace")
    q += topic_len
    (props_len,) = _I16.unpack_from(data, q)
    q += 2
    if props_len < 0 or need + body_len + topic_len + props_len != total:
        raise MessageDecodeError(pos, f"record size {total} does not match its parts")
    props = data[q:q + props_len]
    if not read_body:
        body = None
    elif decompress and sys_flag & compression.COMPRESSED_FLAG:
        try:
            body = compression.decompress(body, sys_flag)
        except compression.CompressionError as exc:
            raise MessageDecodeError(pos, f"compressed body does not decompress: {exc}") from exc
        sys_flag &= ~(compression.COMPRESSED_FLAG | compression.COMPRESSION_TYPE_MASK)
    msg = MessageExt(
        topic=topic, body=body, flag=flag, queue_id=queue_id, queue_offset=queue_offset,
        commit_log_offset=commit_log_offset, store_size=total, body_crc=body_crc,
        sys_flag=sys_flag, born_timestamp=born_timestamp,
        born_host=_format_host(born_ip, born_port), store_timestamp=store_timestamp,
        store_host=_format_host(store_ip, store_port), reconsume_times=reconsume_times,
        prepared_transaction_offset=prepared, broker_name=broker_name,
        properties=string_to_properties_py(props),
    )
    return msg, total


def decode_messages_py(buf, *, decompress: bool = True, read_body: bool = True,
                       broker_name: str | None = None) -> list:
    """Reference twin of `decode_messages` (struct-based, builds the properties dict eagerly)."""
    data = bytes(buf)
    out = []
    pos = 0
    while pos < len(data):
        msg, size = _decode_record_py(data, pos, decompress, read_body, broker_name)
        if msg is not None:
            out.append(msg)
        pos += size
    return out


# --- batch bodies ------------------------------------------------------------------------------------
def encode_batch_items(items: Iterable[tuple]) -> bytes:
    """The SEND_BATCH_MESSAGE body for `(flag, body, properties)` items (properties a dict, a str
    or raw bytes); magic and bodyCRC are written as 0, as the Java and C++ clients do."""
    out = []
    for index, item in enumerate(items):
        try:
            flag, body, properties = item
        except (TypeError, ValueError):
            raise IllegalArgumentError(
                f"batch item {index} must be (flag, body, properties), not {item!r}"
            ) from None
        if isinstance(body, str):
            body = body.encode("utf-8")
        elif not isinstance(body, bytes):
            if not isinstance(body, (bytearray, memoryview)):
                raise IllegalArgumentError(
                    f"batch item {index}: body must be bytes, not {type(body).__name__}"
                )
            body = bytes(body)
        props = _properties_blob(properties)
        if len(props) > MAX_PROPERTIES_LENGTH:
            raise IllegalArgumentError(
                f"batch item {index}: properties are {len(props)} bytes, more than {MAX_PROPERTIES_LENGTH}"
            )
        try:
            head = _BATCH_HEAD.pack(BATCH_ITEM_FIXED + len(body) + len(props), 0, 0, flag, len(body))
        except struct.error as exc:
            raise IllegalArgumentError(f"batch item {index}: flag {flag!r} is out of range: {exc}") from None
        out += (head, body, _I16.pack(len(props)), props)
    return b"".join(out)


def decode_batch_body_py(buf) -> list[tuple[int, bytes, bytes]]:
    """Reference twin of `decode_batch_body`."""
    data = bytes(buf)
    out = []
    pos = 0
    while pos < len(data):
        avail = len(data) - pos
        if avail < BATCH_ITEM_FIXED:
            raise MessageDecodeError(pos, f"truncated batch item: {avail} bytes left")
        total, _magic, _crc, flag, body_len = _BATCH_HEAD.unpack_from(data, pos)
        if not BATCH_ITEM_FIXED <= total <= avail:
            raise MessageDecodeError(pos, f"batch item size {total} is outside {BATCH_ITEM_FIXED}..{avail}")
        if not 0 <= body_len <= total - BATCH_ITEM_FIXED:
            raise MessageDecodeError(pos, f"batch item body length {body_len} does not fit")
        (props_len,) = _I16.unpack_from(data, pos + 20 + body_len)
        if props_len < 0 or BATCH_ITEM_FIXED + body_len + props_len != total:
            raise MessageDecodeError(pos, f"batch item size {total} does not match its parts")
        body = data[pos + 20:pos + 20 + body_len]
        props = data[pos + 22 + body_len:pos + total]
        out.append((flag, body, props))
        pos += total
    return out


