"""A RocketMQ 5 message <-> what the broker stores, as RocketMQ 5's proxy converts them.

Sending: tag -> TAGS, keys -> KEYS, message id -> UNIQ_KEY, message group -> __SHARDINGKEY,
delivery timestamp -> TIMER_DELIVER_MS (rmq's timer), a transactional message -> a half message
(TRAN_MSG, its topic as the producer group), a GZIP body -> stored as it came, flagged compressed
(zlib, what a 4.x client's compressed body is).  Receiving: the stored record decoded with its body
decompressed, the user's properties without the system ones, the body's MD5 digest in upper-case
hex (what the clients check)."""
from __future__ import annotations

import hashlib

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from rmq_core.broker import message_type as mt
from rmq_core.codec import decode_messages, properties_to_bytes
from rmq_core.errors import IllegalArgumentError
from rmq_core.message import MessageConst, SysFlag
from rmq_core.proxy.proto.apache.rocketmq.v2 import definition_pb2 as pb
from rmq_core.proxy.proto.apache.rocketmq.v2 import service_pb2 as spb

TRACE_CONTEXT = "TRACE_CONTEXT"  # RocketMQ 5's property for a message's trace context
TIMER_OUT_MS = "TIMER_OUT_MS"  # (broker/timer.py: the due time of a timer message)
# Properties a 5.x client never sees as its own: every key of MessageConst, the broker's and RocketMQ 5's
SYSTEM_PROPERTIES = frozenset(
    {v for k, v in vars(MessageConst).items() if k.isupper() and isinstance(v, str) and v.strip()}
    | MessageConst.SYSTEM_KEYS
    | {mt.SHARDING_KEY, TRACE_CONTEXT, TIMER_OUT_MS, "TIMER_DELAY_MS", "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS",
       "TIMER_ROLL_TIMES", "POP_CK", "POP_CK_OFFSET", "1ST_POP_TIME", "bname", "INNER_NUM", "INNER_MULTI_DISPATCH",
       "INNER_MULTI_QUEUE_OFFSET", "__STARTDELIVERTIME", "CONSUME_CONTEXT_TYPE"})

_TYPE_NAMES = {pb.NORMAL: mt.NORMAL, pb.FIFO: mt.FIFO, pb.DELAY: mt.DELAY, pb.TRANSACTION: mt.TRANSACTION}
_TYPES = {v: k for k, v in _TYPE_NAMES.items()}


class BadMessage(Exception):
    """A message of a SendMessage refused before the broker's send path: `code` (a v2 Code) and why."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def timestamp(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def duration(ms: int) -> Duration:
    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def millis(t) -> int:
    """A Timestamp or Duration in milliseconds."""
    return t.seconds * 1000 + t.nanos // 1_000_000


def accepted_types(attributes) -> list[int]:
    """The MessageQueue.accept_message_types of a topic with these attributes."""
    accepted = mt.topic_message_type(attributes)
    return [pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION] if accepted == mt.MIXED else [_TYPES[accepted]]


def to_send(message: tuple, max_body_size: int) -> tuple[bytes, int, int]:
    """(properties string, sys flag, message type) of a 5.x message to send, given as
    rmq_core._native.proto_send decodes it - the properties encoded once, by the record module's
    one properties writer, as the store writes them; BadMessage names what is wrong."""
    (topic, body, user, tag, keys, mid, encoding, kind, _born, group, delivery, _queue_id, trace,
     recovery) = message
    if not mid:
        raise BadMessage(pb.ILLEGAL_MESSAGE_ID, f"a message to topic {topic} has no message_id")
    size = len(body)
    if size > max_body_size:
        raise BadMessage(pb.MESSAGE_BODY_TOO_LARGE, f"message {mid} body is {size} bytes, "
                         f"over the max body size {max_body_size} (maxMessageSize)")
    props = {}
    if user:
        reserved = SYSTEM_PROPERTIES.intersection(user)
        if reserved:
            raise BadMessage(pb.ILLEGAL_MESSAGE_PROPERTY_KEY,
                             f"message {mid}: property key {min(reserved)!r} is reserved by RocketMQ")
        props.update(user)
    if tag is not None:
        if not tag.strip() or "|" in tag:
            raise BadMessage(pb.ILLEGAL_MESSAGE_TAG, f"message {mid}: bad tag {tag!r}")
        props[MessageConst.TAGS] = tag
    if keys:
        props[MessageConst.KEYS] = keys[0] if len(keys) == 1 else MessageConst.KEY_SEPARATOR.join(keys)
    props[MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = mid
    sys_flag = 0
    if kind != pb.NORMAL or group is not None or delivery is not None:
        if group is not None:
            if kind not in (pb.FIFO, pb.MESSAGE_TYPE_UNSPECIFIED):
                raise BadMessage(pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                                 f"message {mid} has a message group but its type is {_type_name(kind)}")
            props[mt.SHARDING_KEY] = group
        elif kind == pb.FIFO:
            raise BadMessage(pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, f"FIFO message {mid} has no message group")
        if delivery is not None:
            if kind not in (pb.DELAY, pb.MESSAGE_TYPE_UNSPECIFIED):
                raise BadMessage(pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, f"message {mid} has a delivery "
                                 f"timestamp but its type is {_type_name(kind)}")
            props[MessageConst.TIMER_DELIVER_MS] = str(delivery)
        elif kind == pb.DELAY:
            raise BadMessage(pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, f"DELAY message {mid} has no delivery timestamp")
        if kind == pb.TRANSACTION:
            props[MessageConst.TRANSACTION_PREPARED] = "true"
            props[MessageConst.PRODUCER_GROUP] = topic
            sys_flag |= SysFlag.TRANSACTION_PREPARED_TYPE
            if recovery is not None:
                props[MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS] = str(recovery)
    if trace is not None:
        props[TRACE_CONTEXT] = trace
    if encoding == pb.GZIP:
        sys_flag |= SysFlag.COMPRESSED
    try:
        encoded = properties_to_bytes(props)
    except IllegalArgumentError as e:  # a separator in a name or value: it would not read back
        raise BadMessage(pb.ILLEGAL_MESSAGE_PROPERTY_KEY, f"message {mid}: {e}") from None
    return encoded, sys_flag, kind


def _type_name(kind: int) -> str:
    """A MessageType's name (an unknown number as itself: proto3 enums are open)."""
    return pb.MessageType.Name(kind) if kind in pb.MessageType.values() else str(kind)


def _host(addr: str | None) -> str:
    return addr or ""


def _received_type(props, sys_flag: int) -> int:
    """A stored message's type as a receiver sees it: a committed half (sysFlag's commit type)
    TRANSACTION, a message the timer released (it keeps TIMER_OUT_MS, its due time) DELAY."""
    if SysFlag.transaction_value(sys_flag) == SysFlag.TRANSACTION_COMMIT_TYPE:
        return pb.TRANSACTION
    if TIMER_OUT_MS in props:
        return pb.DELAY
    return _TYPES[mt.message_type(props, sys_flag)]


def to_message(m, popped=None, invisible_ms: int | None = None):
    """The pb Message of a decoded stored message (MessageExt, body decompressed); `popped`:
    its PoppedMessage when a receive hands it out (receipt handle, delivery attempt, original topic)."""
    props = m.properties
    body = m.body or b""
    sp = pb.SystemProperties(
        message_id=props.get(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or m.msg_id,
        body_digest=pb.Digest(type=pb.MD5, checksum=hashlib.md5(body).hexdigest().upper()),
        body_encoding=pb.IDENTITY,
        message_type=_received_type(props, m.sys_flag),
        born_timestamp=timestamp(m.born_timestamp),
        born_host=_host(m.born_host).rpartition(":")[0] or _host(m.born_host),
        store_timestamp=timestamp(m.store_timestamp),
        store_host=_host(m.store_host),
        queue_id=m.queue_id,
        queue_offset=m.queue_offset,
    )
    tag = props.get(MessageConst.TAGS)
    if tag:
        sp.tag = tag
    keys = props.get(MessageConst.KEYS)
    if keys:
        sp.keys.extend(k for k in keys.split(MessageConst.KEY_SEPARATOR) if k)
    group = props.get(mt.SHARDING_KEY)
    if group:
        sp.message_group = group
    deliver = props.get(MessageConst.TIMER_DELIVER_MS) or props.get(TIMER_OUT_MS)
    if deliver and deliver.isdigit():
        sp.delivery_timestamp.CopyFrom(timestamp(int(deliver)))
    trace = props.get(TRACE_CONTEXT)
    if trace:
        sp.trace_context = trace
    topic = m.topic
    if popped is not None:
        topic = popped.topic
        sp.receipt_handle = popped.receipt_handle
        sp.delivery_attempt = popped.delivery_attempt
        sp.queue_id, sp.queue_offset = popped.queue_id, popped.queue_offset
        if invisible_ms is not None:
            sp.invisible_duration.CopyFrom(duration(invisible_ms))
    user = {k: v for k, v in props.items() if k not in SYSTEM_PROPERTIES}
    return pb.Message(topic=pb.Resource(name=topic), user_properties=user, system_properties=sp, body=body)


def popped_message(popped, invisible_ms: int):
    """The pb Message of a message a receive hands out (PopService's PoppedMessage)."""
    m = decode_messages(popped.record, decompress=True)[0]
    return to_message(m, popped, invisible_ms)


# --- transactions ---------------------------------------------------------------------------------------
def transaction_id(commit_log_offset: int, half_queue_offset: int) -> str:
    """A half message's transaction id: what EndTransaction needs to find it (the remoting
    END_TRANSACTION's commitLogOffset and tranStateTableOffset)."""
    return f"{commit_log_offset:016X}{half_queue_offset:016X}"


def parse_transaction_id(tid: str) -> tuple[int, int]:
    """(commit log offset, half queue offset) of a transaction id; ValueError if it is not one of ours."""
    if len(tid) != 32:
        raise ValueError(f"transaction id {tid!r} is not one this broker gave")
    return int(tid[:16], 16), int(tid[16:], 16)


def recover_command(request):
    """The RecoverOrphanedTransactionCommand (in a TelemetryCommand) of the broker's
    CHECK_TRANSACTION_STATE request to a producer (its body: the half message's record)."""
    ext = request.ext_fields
    m = decode_messages(request.body, decompress=True)[0]
    msg = to_message(m)
    tid = transaction_id(int(ext["commitLogOffset"]), int(ext["tranStateTableOffset"]))
    return spb.TelemetryCommand(recover_orphaned_transaction_command=spb.RecoverOrphanedTransactionCommand(
        message=msg, transaction_id=tid))
