"""Message model: the values every part of rmq shares (RocketMQ 4.x vocabulary, Python style).

`MessageExt` (a received message) is a native class from `rmq_core._native.record` because it is
created on the client's hot path; it is re-exported here.
"""
from __future__ import annotations

import enum
import ipaddress
import itertools
import os
import re
import socket
import struct
import time
from typing import Callable, Mapping

import attrs

from rmq_core import record_layout as _layout
from rmq_core.errors import IllegalArgumentError

# --- record layout facts (docs/protocol.md §5; defined in rmq_core/_native/record_layout.pxd) -----
MESSAGE_MAGIC_CODE = _layout.MESSAGE_MAGIC_CODE  # -626843481 as a signed int32
BLANK_MAGIC_CODE = _layout.BLANK_MAGIC_CODE  # end-of-file filler in a commit-log segment
MAX_TOPIC_LENGTH = _layout.MAX_TOPIC  # 1-byte topic length in the v1 record
MAX_PROPERTIES_LENGTH = _layout.MAX_PROPS  # int16 properties length
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"


class MessageConst:
    """Property keys (exact strings, RocketMQ MessageConst)."""

    KEY_SEPARATOR = " "  # between the keys of one message in its KEYS property
    KEYS = "KEYS"
    TAGS = "TAGS"
    WAIT_STORE_MSG_OK = "WAIT"
    DELAY_TIME_LEVEL = "DELAY"
    RETRY_TOPIC = "RETRY_TOPIC"
    REAL_TOPIC = "REAL_TOPIC"
    REAL_QUEUE_ID = "REAL_QID"
    TRANSACTION_PREPARED = "TRAN_MSG"
    PRODUCER_GROUP = "PGROUP"
    MIN_OFFSET = "MIN_OFFSET"
    MAX_OFFSET = "MAX_OFFSET"
    BUYER_ID = "BUYER_ID"
    ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
    TRANSFER_FLAG = "TRANSFER_FLAG"
    CORRECTION_FLAG = "CORRECTION_FLAG"
    MQ2_FLAG = "MQ2_FLAG"
    RECONSUME_TIME = "RECONSUME_TIME"
    MSG_REGION = "MSG_REGION"
    TRACE_SWITCH = "TRACE_ON"
    UNIQ_CLIENT_MESSAGE_ID_KEYIDX = "UNIQ_KEY"
    MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
    CONSUME_START_TIMESTAMP = "CONSUME_START_TIME"
    TRANSACTION_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
    TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
    CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
    INSTANCE_ID = "INSTANCE_ID"
    CORRELATION_ID = "CORRELATION_ID"
    MESSAGE_REPLY_TO_CLIENT = "REPLY_TO_CLIENT"
    MESSAGE_TTL = "TTL"
    REPLY_MESSAGE_ARRIVE_TIME = "ARRIVE_TIME"
    PUSH_REPLY_TIME = "PUSH_REPLY_TIME"
    CLUSTER = "CLUSTER"
    MESSAGE_TYPE = "MSG_TYPE"
    # RocketMQ 5 timer messages (arbitrary delivery time)
    TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
    TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
    DELIVER_TIME_MS = "DELIVER_TIME_MS"
    # RocketMQ 5 pop consumption: a popped message's check point (its receipt handle, see
    # rmq_core.common.pop_extra_info) and when it was first popped (epoch ms)
    POP_CK = "POP_CK"
    FIRST_POP_TIME = "1ST_POP_TIME"

    # Keys a user may not set through `properties=` (the client and broker own them).
    SYSTEM_KEYS = frozenset(
        {
            KEYS, TAGS, WAIT_STORE_MSG_OK, DELAY_TIME_LEVEL, RETRY_TOPIC, REAL_TOPIC, REAL_QUEUE_ID,
            TRANSACTION_PREPARED, PRODUCER_GROUP, MIN_OFFSET, MAX_OFFSET, BUYER_ID,
            ORIGIN_MESSAGE_ID, TRANSFER_FLAG, CORRECTION_FLAG, MQ2_FLAG, RECONSUME_TIME,
            MSG_REGION, TRACE_SWITCH, UNIQ_CLIENT_MESSAGE_ID_KEYIDX, MAX_RECONSUME_TIMES,
            CONSUME_START_TIMESTAMP, TRANSACTION_PREPARED_QUEUE_OFFSET, TRANSACTION_CHECK_TIMES,
            CHECK_IMMUNITY_TIME_IN_SECONDS,
        }
    )


class SysFlag:
    """Bits of a record's sysFlag (docs/protocol.md §5.2; record_layout.pxd defines them)."""

    COMPRESSED = _layout.COMPRESSED
    MULTI_TAGS = _layout.MULTI_TAGS
    TRANSACTION_NOT_TYPE = 0x0
    TRANSACTION_PREPARED_TYPE = _layout.TRANSACTION_PREPARED_TYPE
    TRANSACTION_COMMIT_TYPE = _layout.TRANSACTION_COMMIT_TYPE
    TRANSACTION_ROLLBACK_TYPE = _layout.TRANSACTION_ROLLBACK_TYPE
    TRANSACTION_MASK = _layout.TRANSACTION_MASK
    BORNHOST_V6 = _layout.BORNHOST_V6
    STOREHOST_V6 = _layout.STOREHOST_V6
    NEED_UNWRAP = _layout.NEED_UNWRAP
    INNER_BATCH = _layout.INNER_BATCH
    COMPRESSION_LZ4 = _layout.COMPRESSION_LZ4
    COMPRESSION_ZSTD = _layout.COMPRESSION_ZSTD
    COMPRESSION_ZLIB = _layout.COMPRESSION_ZLIB
    COMPRESSION_TYPE_MASK = _layout.COMPRESSION_TYPE_MASK

    @staticmethod
    def transaction_value(sys_flag: int) -> int:
        return sys_flag & SysFlag.TRANSACTION_MASK

    @staticmethod
    def reset_transaction_value(sys_flag: int, tx_type: int) -> int:
        return (sys_flag & ~SysFlag.TRANSACTION_MASK) | tx_type


# --- topics and groups ------------------------------------------------------------------------------
class TopicValidator:
    AUTO_CREATE_TOPIC_KEY_TOPIC = "TBW102"
    RMQ_SYS_SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
    RMQ_SYS_TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
    RMQ_SYS_TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
    RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
    RMQ_SYS_TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
    RMQ_SYS_SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
    RMQ_SYS_BENCHMARK_TOPIC = "BenchmarkTest"
    RMQ_SYS_OFFSET_MOVED_EVENT = "OFFSET_MOVED_EVENT"
    RMQ_SYS_WHEEL_TIMER = "rmq_sys_wheel_timer"  # RocketMQ 5 timer messages wait here
    SYSTEM_TOPIC_PREFIX = "rmq_sys_"
    SYSTEM_TOPICS = frozenset(
        {
            AUTO_CREATE_TOPIC_KEY_TOPIC, RMQ_SYS_SCHEDULE_TOPIC, RMQ_SYS_TRANS_HALF_TOPIC,
            RMQ_SYS_TRANS_OP_HALF_TOPIC, RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC, RMQ_SYS_TRACE_TOPIC,
            RMQ_SYS_SELF_TEST_TOPIC, RMQ_SYS_BENCHMARK_TOPIC, RMQ_SYS_OFFSET_MOVED_EVENT, RMQ_SYS_WHEEL_TIMER,
        }
    )
    _VALID = re.compile(r"^[%|a-zA-Z0-9_-]+$")

    @classmethod
    def check_topic(cls, topic: str) -> str:
        """Return `topic` or raise IllegalArgumentError naming what is wrong with it."""
        if not isinstance(topic, str) or not topic:
            raise IllegalArgumentError(f"bad topic name {topic!r}: the topic name is empty")
        if len(topic.encode("utf-8")) > MAX_TOPIC_LENGTH:
            raise IllegalArgumentError(
                f"bad topic name {topic!r}: longer than {MAX_TOPIC_LENGTH} bytes"
            )
        if not cls._VALID.match(topic):
            raise IllegalArgumentError(
                f"bad topic name {topic!r}: only ASCII letters (a-z, A-Z), digits, '%', '|', '_' and '-' are allowed"
            )
        return topic

    @classmethod
    def is_system_topic(cls, topic: str) -> bool:
        return topic in cls.SYSTEM_TOPICS or topic.startswith(cls.SYSTEM_TOPIC_PREFIX)

    @classmethod
    def check_not_system_topic_for_send(cls, topic: str) -> None:
        if topic in cls.SYSTEM_TOPICS and topic != cls.RMQ_SYS_TRACE_TOPIC:
            raise IllegalArgumentError(f"bad topic name {topic!r}: it is a system topic")


_GROUP_CHARS = frozenset("%|-_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
MAX_GROUP_LENGTH = 255


def check_group(group: str) -> str:
    """Return `group` (a producer or consumer group name) or raise IllegalArgumentError naming
    what is wrong with it (Validators.checkGroup; the broker checks its group table the same way)."""
    if not isinstance(group, str) or not group.strip():
        raise IllegalArgumentError(f"bad group name {group!r}: the group name is empty")
    if len(group) > MAX_GROUP_LENGTH:
        raise IllegalArgumentError(f"bad group name {group!r}: longer than {MAX_GROUP_LENGTH} characters")
    bad = sorted(set(group) - _GROUP_CHARS)
    if bad:
        raise IllegalArgumentError(
            f"bad group name {group!r}: character {bad[0]!r} is not allowed "
            "(ASCII letters, digits, '%', '|', '_' and '-' only)"
        )
    return group


class MixAll:
    RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
    DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
    DEFAULT_PRODUCER_GROUP = "DEFAULT_PRODUCER"
    DEFAULT_CONSUMER_GROUP = "DEFAULT_CONSUMER"
    CLIENT_INNER_PRODUCER_GROUP = "CLIENT_INNER_PRODUCER"
    MASTER_ID = 0

    @staticmethod
    def get_retry_topic(group: str) -> str:
        return MixAll.RETRY_GROUP_TOPIC_PREFIX + group

    @staticmethod
    def get_dlq_topic(group: str) -> str:
        return MixAll.DLQ_GROUP_TOPIC_PREFIX + group

    @staticmethod
    def is_retry_topic(topic: str) -> bool:
        return topic.startswith(MixAll.RETRY_GROUP_TOPIC_PREFIX)

    @staticmethod
    def is_dlq_topic(topic: str) -> bool:
        return topic.startswith(MixAll.DLQ_GROUP_TOPIC_PREFIX)


class PermName:
    PERM_PRIORITY, PERM_READ, PERM_WRITE, PERM_INHERIT = 8, 4, 2, 1

    @staticmethod
    def is_readable(perm: int) -> bool:
        return bool(perm & PermName.PERM_READ)

    @staticmethod
    def is_writeable(perm: int) -> bool:
        return bool(perm & PermName.PERM_WRITE)


def parse_address(addr: str) -> tuple[str, int]:
    """'host:port' -> (host, port); raises IllegalArgumentError naming the bad address."""
    host, sep, port = str(addr).rpartition(":")
    try:
        if not sep or not host:
            raise ValueError
        p = int(port)
        if not 0 <= p <= 65535:
            raise ValueError
    except ValueError:
        raise IllegalArgumentError(f"bad address {addr!r}: expected host:port") from None
    return host, p


def is_loopback(host: str) -> bool:
    """True for an address only this machine reaches (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def open_listen_addresses(addresses) -> list[str]:
    """Of a server's listen addresses ('host:port', or 'scheme://...' for other transports), the
    TCP ones other hosts may reach (0.0.0.0, a LAN address): what a boot warns about when nothing
    checks who connects."""
    return [a for a in addresses if "://" not in a and not is_loopback(a.rpartition(":")[0])]


def host_port(addr: str | None) -> tuple[str, int]:
    """'ip:port' -> (ip, port) leniently, for hosts read back from stored records; anything
    unparsable counts as loopback port 0 (a record's born host is informational)."""
    host, _, port = (addr or "").rpartition(":")
    try:
        return (host, int(port)) if host else ("127.0.0.1", 0)
    except ValueError:
        return "127.0.0.1", 0


def create_offset_msg_id(host: str, port: int, commit_log_offset: int) -> str:
    """The broker-side id (docs/protocol.md §5.4): the store host's address (IPv4, 32 hex digits in
    all, or IPv6, 56) and port, then the physical offset, as the native record code writes it; a
    host name stands for its IPv4 address."""
    from rmq_core._native.record import ip_bytes, offset_msg_id

    ip = ip_bytes(host)
    if ip is None:
        ip = socket.inet_aton(socket.gethostbyname(host))
    return offset_msg_id(ip + struct.pack(">i", port), commit_log_offset)


def decode_offset_msg_id(msg_id: str) -> tuple[str, int, int]:
    """Inverse of create_offset_msg_id: (host, port, commit_log_offset); IPv4 (32 hex) or IPv6 (56)."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise IllegalArgumentError(f"bad message id {msg_id!r}: not hex") from None
    if len(raw) == 16:
        return socket.inet_ntoa(raw[:4]), *struct.unpack(">iq", raw[4:])
    if len(raw) == 28:
        return socket.inet_ntop(socket.AF_INET6, raw[:16]), *struct.unpack(">iq", raw[16:])
    raise IllegalArgumentError(f"bad message id {msg_id!r}: expected 32 or 56 hex characters")


class MessageClientIDSetter:
    """Client-side unique ids (UNIQ_KEY): IP(4) + pid(2) + per-process random(4) + ms since the
    start of this month(4) + counter(2) -> 32 upper-case hex.  Treat the value as opaque.
    create_uniq_id is the native maker (rmq_core._native.record_batch.UniqIds), made from these parts."""

    _fix = None
    _sequence = itertools.count(1)  # (atomic under the GIL, as Java's AtomicInteger)

    @classmethod
    def _prefix(cls) -> bytes:
        if cls._fix is None:
            try:
                ip = socket.inet_aton(socket.gethostbyname(socket.gethostname()))
            except OSError:
                ip = b"\x7f\x00\x00\x01"
            cls._fix = ip + struct.pack(">H", os.getpid() & 0xFFFF) + os.urandom(4)
        return cls._fix

    @classmethod
    def hex_prefix(cls) -> str:
        """The fixed part of every id: 20 upper-case hex digits."""
        return cls._prefix().hex().upper()

    @staticmethod
    def month_bounds(now_ms: int) -> tuple[int, int]:
        """(the start of now_ms's month, the start of the next one), in ms since the epoch (UTC)."""
        t = time.gmtime(now_ms / 1000)
        start = int(time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, 0)) - time.timezone)
        nm = (t.tm_year + (t.tm_mon == 12), t.tm_mon % 12 + 1, 1, 0, 0, 0, 0, 0, 0)
        return start * 1000, int(time.mktime(nm) - time.timezone) * 1000

    create_uniq_id: Callable[[], str]  # set below the class (the native maker)


# --- values -----------------------------------------------------------------------------------------
def _to_bytes(body) -> bytes:
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    raise IllegalArgumentError(f"message body must be bytes or str, not {type(body).__name__}")


def _keys_to_str(keys) -> str | None:
    if keys is None or isinstance(keys, str):
        return keys or None
    return MessageConst.KEY_SEPARATOR.join(str(k) for k in keys) or None


@attrs.define(slots=True, eq=False)
class Message:
    """A message to send.  `properties` holds user properties; tags/keys/delay have their own fields
    and are folded into the wire properties by `wire_properties()`."""

    topic: str
    body: bytes = attrs.field(converter=_to_bytes)
    tags: str | None = None
    keys: str | None = attrs.field(default=None, converter=_keys_to_str)
    properties: dict = attrs.field(factory=dict, converter=dict)
    flag: int = 0
    delay_time_level: int = 0
    wait_store_msg_ok: bool = True

    def put_user_property(self, name: str, value: str) -> None:
        if name in MessageConst.SYSTEM_KEYS:
            raise IllegalArgumentError(f"property name {name!r} is reserved by RocketMQ")
        self.properties[name] = str(value)

    def get_property(self, name: str) -> str | None:
        return self.wire_properties().get(name)

    @property
    def keys_list(self) -> list[str]:
        return self.keys.split(" ") if self.keys else []

    def wire_properties(self) -> dict[str, str]:
        """The properties as they travel: user properties plus TAGS/KEYS/DELAY/WAIT."""
        props = {k: str(v) for k, v in self.properties.items()}
        if self.tags:
            props[MessageConst.TAGS] = self.tags
        if self.keys:
            props[MessageConst.KEYS] = self.keys
        if self.delay_time_level > 0:
            props[MessageConst.DELAY_TIME_LEVEL] = str(self.delay_time_level)
        props[MessageConst.WAIT_STORE_MSG_OK] = "true" if self.wait_store_msg_ok else "false"
        return props


@attrs.frozen(order=True)
class MessageQueue:
    """One queue of a topic on one broker (ordered by topic, broker, queue id as RocketMQ sorts)."""

    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        return f"MessageQueue[topic={self.topic}, brokerName={self.broker_name}, queueId={self.queue_id}]"


def _named_enum(name: str, members: str) -> type[enum.Enum]:
    """An enum whose members' values are their names (Java's enum names, as the wire, JSON and
    the C++ client spell them)."""
    return enum.Enum(name, [(m, m) for m in members.split()], module=__name__, qualname=name)


SendStatus = _named_enum("SendStatus", "SEND_OK FLUSH_DISK_TIMEOUT FLUSH_SLAVE_TIMEOUT SLAVE_NOT_AVAILABLE")


@attrs.frozen
class SendResult:
    status: SendStatus
    msg_id: str
    offset_msg_id: str
    queue: MessageQueue
    queue_offset: int
    transaction_id: str | None = None
    region_id: str = "DefaultRegion"


LocalTransactionState = _named_enum("LocalTransactionState", "COMMIT_MESSAGE ROLLBACK_MESSAGE UNKNOW")
PullStatus = _named_enum("PullStatus", "FOUND NO_NEW_MSG NO_MATCHED_MSG OFFSET_ILLEGAL")


@attrs.define
class PullResult:
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list = attrs.field(factory=list)


class ConsumeStatus(enum.Enum):
    """Listener results.  Concurrent listeners return CONSUME_SUCCESS / RECONSUME_LATER; orderly
    listeners return SUCCESS / SUSPEND_CURRENT_QUEUE_A_MOMENT (CONSUME_SUCCESS is accepted too)."""

    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"
    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


class MessageModel(enum.Enum):
    BROADCASTING = "BROADCASTING"
    CLUSTERING = "CLUSTERING"

    @property
    def wire(self) -> int:  # C++ heartbeat writes the ordinal
        return 0 if self is MessageModel.BROADCASTING else 1


ConsumeFromWhere = _named_enum(
    "ConsumeFromWhere", "CONSUME_FROM_LAST_OFFSET CONSUME_FROM_FIRST_OFFSET CONSUME_FROM_TIMESTAMP")


class ExpressionType:
    TAG = "TAG"
    SQL92 = "SQL92"

    @staticmethod
    def is_tag_type(t: str | None) -> bool:
        return not t or t == ExpressionType.TAG


SUB_ALL = "*"


@attrs.frozen
class MessageSelector:
    """A subscription expression and its type (TAG, SQL92, or a type a filter plugin adds)."""

    expression_type: str
    expression: str

    @classmethod
    def by_tag(cls, tag: str | None = None) -> "MessageSelector":
        return cls(ExpressionType.TAG, tag or SUB_ALL)

    @classmethod
    def by_sql(cls, sql: str) -> "MessageSelector":
        return cls(ExpressionType.SQL92, sql)


def split_tags(expression: str | None) -> list[str]:
    """`TagA || TagB` -> ['TagA', 'TagB']; '*' or empty -> [] (match all)."""
    if not expression or expression.strip() == SUB_ALL:
        return []
    return [t.strip() for t in expression.split("||") if t.strip()]


def encode_properties_checked(props: Mapping[str, str]) -> bytes:
    raw = properties_to_bytes(props)
    if len(raw) > MAX_PROPERTIES_LENGTH:
        raise IllegalArgumentError(
            f"message properties are {len(raw)} bytes, more than {MAX_PROPERTIES_LENGTH}"
        )
    return raw


from rmq_core import errors as _errors  # noqa: E402
from rmq_core._native import record as _record  # noqa: E402
from rmq_core._native.record import MessageExt  # noqa: E402
# The one codec of these small formats is native; rmq imports them from here (tests/codec_oracle.py
# keeps pure-Python references for the property tests).
from rmq_core._native.record import java_string_hash, properties_to_bytes, string_to_properties  # noqa: E402,F401
from rmq_core._native.record_batch import UniqIds  # noqa: E402


def _decompress(body, sys_flag):
    # compression (and lz4) load on the first compressed body, not on `import rmq_core`
    from rmq_core.compression import decompress
    return decompress(body, sys_flag)


# The native record module imports nothing of rmq: its errors and decompressor are handed in here,
# where it is first loaded (`import rmq_core` loads this module).
_record.use_python_layer(
    illegal_argument=_errors.IllegalArgumentError, properties_size_exceeded=_errors.PropertiesSizeExceededError,
    batch_format=_errors.BatchFormatError, decode_error=_errors.MessageDecodeError,
    too_large=_errors.MessageTooLargeError, decompress=_decompress)

MessageClientIDSetter.create_uniq_id = staticmethod(UniqIds(
    MessageClientIDSetter.hex_prefix, MessageClientIDSetter.month_bounds, MessageClientIDSetter._sequence))
