"""Values the message store takes and returns (RocketMQ's store vocabulary, Python style)."""
from __future__ import annotations

import enum
import socket
import struct
from typing import Any, NamedTuple

import attrs

from rmq_core import record_layout as layout
from rmq_core._native.record import ip_bytes
from rmq_core.message import MessageConst, string_to_properties


class PutMessageStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGECACHE_BUSY = "OS_PAGECACHE_BUSY"
    DISK_FULL = "DISK_FULL"
    IN_SYNC_REPLICAS_NOT_ENOUGH = "IN_SYNC_REPLICAS_NOT_ENOUGH"  # controller mode: sync state set < minInSyncReplicas
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


# Statuses under which the message is stored (RocketMQ: PutMessageResult.isOk).
_STORED = {PutMessageStatus.PUT_OK, PutMessageStatus.FLUSH_DISK_TIMEOUT,
           PutMessageStatus.FLUSH_SLAVE_TIMEOUT, PutMessageStatus.SLAVE_NOT_AVAILABLE}


class AppendMessageResult(NamedTuple):
    """Where a put's records went.  A named tuple: immutable, and built by a put without a
    Python frame of its own (`tuple.__new__(AppendMessageResult, values)`)."""

    wrote_offset: int  # physical offset of the first record
    wrote_bytes: int
    msg_id: str  # offsetMsgId; comma-joined for a batch
    store_timestamp: int
    logics_offset: int  # queue offset of the first record
    msg_num: int = 1
    phys_offsets: tuple | None = None
    queue_offsets: tuple | None = None


class BatchAppendMessageResult(AppendMessageResult):
    """AppendMessageResult of a batch whose per-record values are built on first access.

    A put of thousands of records would otherwise create a msg id string and two ints per record
    that most callers never read (the broker's SEND_BATCH reply reads only `msg_id`, and the native
    code builds that comma-joined string in one go).  The values come from the append's 20-byte
    consume-queue entries; equality, hash and repr are those of the eager AppendMessageResult."""

    def __new__(cls, wrote_offset: int, wrote_bytes: int, store_timestamp: int, logics_offset: int, msg_num: int,
                entries, store_host: bytes):
        self = tuple.__new__(cls, (wrote_offset, wrote_bytes, None, store_timestamp, logics_offset, msg_num, None,
                                   None))
        d = self.__dict__
        d["_entries"] = entries
        d["_store_host"] = store_host
        d["_msg_id"] = None
        d["_phys_offsets"] = None
        return self

    def __setattr__(self, name, value):
        raise AttributeError(f"can't set attribute {name!r} of an AppendMessageResult")

    @property
    def msg_id(self) -> str:  # type: ignore[override]
        ids = self._msg_id
        if ids is None:
            from rmq_core._native.commit_log import offset_msg_ids
            ids = self.__dict__["_msg_id"] = offset_msg_ids(self._entries, self.msg_num, self._store_host)
        return ids

    @property
    def phys_offsets(self) -> tuple:  # type: ignore[override]
        offs = self._phys_offsets
        if offs is None:
            from rmq_core._native.commit_log import entries_phys_offsets
            offs = self.__dict__["_phys_offsets"] = entries_phys_offsets(self._entries, self.msg_num)
        return offs

    @property
    def queue_offsets(self) -> tuple:  # type: ignore[override]
        return tuple(range(self.logics_offset, self.logics_offset + self.msg_num))

    def _eager(self) -> tuple:
        return (self.wrote_offset, self.wrote_bytes, self.msg_id, self.store_timestamp, self.logics_offset,
                self.msg_num, self.phys_offsets, self.queue_offsets)

    def __eq__(self, other):
        if not isinstance(other, AppendMessageResult):
            return NotImplemented
        theirs = other._eager() if isinstance(other, BatchAppendMessageResult) else tuple(other)
        return self._eager() == theirs

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self):
        return hash(self._eager())

    def __iter__(self):
        return iter(self._eager())

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={v!r}" for n, v in zip(AppendMessageResult._fields, self._eager()))
        return f"AppendMessageResult({fields})"


class PutMessageResult(NamedTuple):
    """A put's answer (a named tuple, as AppendMessageResult)."""

    status: PutMessageStatus
    append_result: AppendMessageResult | None
    error: str | None = None

    def is_ok(self) -> bool:
        return self.append_result is not None and self.status in _STORED


class GetMessageStatus(enum.Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


@attrs.define
class GetMessageResult:
    """What get_message found.  The records are `message_buffer_list`: byte ranges of the mapped
    commit log (memoryviews: a pull answer sends them as they are, as RocketMQ's
    ManyMessageTransfer does) or bytes; `buffer` is them joined.  A view keeps its segment's
    mapping alive (MappedFile.close leaves an exported mapping to its last view)."""

    status: GetMessageStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    message_buffer_list: list = attrs.field(factory=list)
    message_count: int = 0
    buffer_total_size: int = 0
    suggest_pulling_from_slave: bool = False
    # the records' queue offsets: a list, or a function making it (only pop asks for them)
    offsets: object = attrs.field(default=None, repr=False)
    # where the records are in the commit-log files, when they all came from mapped segments:
    # [(segment path, its first commit-log offset, [start, end, start, end, ...] in the file)]
    # (a reader on this host may read them there itself: a pull's local read)
    file_runs: list | None = attrs.field(default=None, repr=False)

    @property
    def buffer(self) -> bytes:
        """The records concatenated exactly as stored (joined once; the views are let go then)."""
        parts = self.message_buffer_list
        if len(parts) == 1 and type(parts[0]) is bytes:
            return parts[0]
        joined = b"".join(parts)
        self.message_buffer_list = [joined] if joined else []
        return joined

    @property
    def queue_offsets(self) -> list:
        offsets = self.offsets
        if offsets is None:
            return []
        if callable(offsets):
            offsets = self.offsets = offsets()
        return offsets


@attrs.define(slots=True)
class MessageExtBrokerInner:
    """One message to put."""

    topic: str
    queue_id: int
    body: bytes
    flag: int = 0
    properties: dict = attrs.field(factory=dict)  # encoded by the store in insertion order ...
    properties_bytes: bytes | None = None  # ... unless given pre-encoded (wins when not None)
    sys_flag: int = 0
    born_timestamp: int = 0  # 0 -> now
    born_host: tuple = ("127.0.0.1", 0)
    store_host: tuple | None = None  # None -> the store's own
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    tags_code: int | None = None  # None -> Java hash of TAGS (delivery time for SCHEDULE_TOPIC_XXXX)


@attrs.define
class MessageExtBatch:
    """A SEND_BATCH_MESSAGE body (docs/protocol.md §5.5) to put as consecutive records of one queue."""

    topic: str
    queue_id: int
    body: bytes
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: tuple = ("127.0.0.1", 0)
    store_host: tuple | None = None
    reconsume_times: int = 0
    extra_properties: bytes = b""  # appended to every item's properties


@attrs.define
class QueryMessageResult:
    """Records found by key (via the index), concatenated as stored, like GetMessageResult."""

    buffer: bytes = b""
    message_count: int = 0
    phys_offsets: list = attrs.field(factory=list)
    index_last_update_timestamp: int = 0
    index_last_update_phyoffset: int = 0


class DispatchRequest:
    """One stored record as the dispatchers (consume queue, index, bloom, timer) see it.

    The properties are decoded only when a dispatcher asks for them."""

    __slots__ = ("topic", "queue_id", "commit_log_offset", "msg_size", "tags_code", "store_timestamp",
                 "consume_queue_offset", "sys_flag", "prepared_transaction_offset", "properties_bytes",
                 "bit_map", "_properties")

    def __init__(self, topic: str, queue_id: int, commit_log_offset: int, msg_size: int, tags_code: int,
                 store_timestamp: int, consume_queue_offset: int, sys_flag: int = 0,
                 prepared_transaction_offset: int = 0, properties_bytes: bytes = b"", bit_map: bytes | None = None):
        # (fields set in groups of at most three: as fast, CPython builds no tuple for those)
        self.topic, self.queue_id, self.sys_flag = topic, queue_id, sys_flag
        self.commit_log_offset, self.msg_size, self.tags_code = commit_log_offset, msg_size, tags_code
        self.store_timestamp, self.consume_queue_offset = store_timestamp, consume_queue_offset
        self.prepared_transaction_offset, self.properties_bytes = prepared_transaction_offset, properties_bytes
        self.bit_map, self._properties = bit_map, None

    @property
    def properties(self) -> dict[str, str]:
        if self._properties is None:
            self._properties = string_to_properties(self.properties_bytes)
        return self._properties

    @property
    def keys(self) -> str | None:
        return self.properties.get(MessageConst.KEYS)

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX)

    def __repr__(self) -> str:
        return (f"DispatchRequest(topic={self.topic!r}, queue_id={self.queue_id}, "
                f"commit_log_offset={self.commit_log_offset}, msg_size={self.msg_size}, "
                f"consume_queue_offset={self.consume_queue_offset})")


# --- record field access (pure Python; only on slow paths: recovery dispatch, lookups) -------------
def encode_host(host: tuple[str, int]) -> tuple[bytes, bool]:
    """(ip, port) -> (ip bytes + int32 port, is_ipv6)."""
    ip, port = host[0], int(host[1])
    raw = ip_bytes(ip)
    if raw is None:  # a host name: its IPv4 address
        raw = socket.inet_aton(socket.gethostbyname(ip))
    return raw + struct.pack(">i", port), len(raw) == 16


def record_fields(record: bytes | memoryview) -> dict[str, Any]:
    """Decode the fixed fields and the properties of one raw record (docs/protocol.md §5)."""
    r = bytes(record)
    total, magic, crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts = struct.unpack_from(">iIIiiqqiq", r, 0)
    (store_ts,) = struct.unpack_from(">q", r, layout.store_timestamp_at(sys_flag))
    pos = layout.reconsume_times_at(sys_flag)
    reconsume, prepared, body_len = struct.unpack_from(">iqi", r, pos)
    pos += 16
    body = r[pos:pos + body_len]
    pos += body_len
    tl = r[pos]
    topic = r[pos + 1:pos + 1 + tl].decode("utf-8")
    pos += 1 + tl
    (pl,) = struct.unpack_from(">h", r, pos)
    props = r[pos + 2:pos + 2 + pl]
    return {"total_size": total, "magic": magic, "body_crc": crc, "queue_id": queue_id, "flag": flag,
            "queue_offset": queue_offset, "commit_log_offset": phys, "sys_flag": sys_flag,
            "born_timestamp": born_ts, "store_timestamp": store_ts, "reconsume_times": reconsume,
            "prepared_transaction_offset": prepared, "body": body, "topic": topic, "properties_bytes": props}
