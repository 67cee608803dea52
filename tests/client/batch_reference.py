"""A plain-Python reference of rmq_core._native.record_batch.encode_send_batch (the same checks, errors and bytes), for
the tests that compare the two: the producer itself encodes batches natively."""
import struct
from typing import Callable

from rmq_core.client.producer import _RESERVED_PROPERTIES, check_send_topic
from rmq_core.message import MAX_PROPERTIES_LENGTH
from rmq_core.errors import IllegalArgumentError
from rmq_core.message import Message, MessageClientIDSetter, MessageConst, MixAll

_BATCH_ITEM_HEAD = struct.Struct(">iiiii")  # totalSize, magic, bodyCRC, flag, bodyLength


def _batch_error(index: int, text: str) -> IllegalArgumentError:
    return IllegalArgumentError(f"batch item {index}: {text}")


def _raw_pair(index: int, name, value) -> bytes:
    if not isinstance(name, str):
        raise _batch_error(index, f"property name {name!r} must be a str")
    value = value if type(value) is str else str(value)
    try:
        k, v = name.encode("utf-8"), value.encode("utf-8")
    except UnicodeEncodeError:
        raise _batch_error(index, f"property {name!r} is not encodable as UTF-8") from None
    if not k:
        raise _batch_error(index, f"property name {name!r} is empty (value {value!r})")
    for sep in (b"\x01", b"\x02"):
        if sep in k:
            raise _batch_error(index, f"property {name!r}: the name contains the separator {sep.decode()!r}, which "
                                      f"would corrupt the properties string")
    if b"\x02" in v:
        raise _batch_error(index, f"property {name!r}: the value contains the separator '\\x02', which would "
                                  f"corrupt the properties string")
    return k + b"\x01" + v + b"\x02"


def encode_batch_py(msgs: list, max_message_size: int, create_id: Callable[[], str] = None) -> tuple:
    """Reference twin of record_batch.encode_send_batch (the same checks, errors and bytes):
    (topic, comma-joined UNIQ_KEYs, SEND_BATCH_MESSAGE body, the first message's wait_store_msg_ok)."""
    create_id = create_id or MessageClientIDSetter.create_uniq_id
    if not msgs:
        raise IllegalArgumentError("send_batch needs at least one message")
    topic = None
    out, uniqs = [], []
    total = 0
    for i, m in enumerate(msgs):
        if not isinstance(m, Message):
            raise _batch_error(i, f"expected a Message, got {type(m).__name__}")
        if i == 0:
            topic = m.topic
            check_send_topic(topic)
            if MixAll.is_retry_topic(topic):
                raise IllegalArgumentError(f"retry topic {topic!r} is not supported in a batch")
        elif m.topic != topic:
            raise _batch_error(i, f"all messages of a batch must have the same topic: {m.topic!r} differs from {topic!r}")
        body = m.body
        if not isinstance(body, bytes):
            raise _batch_error(i, f"body must be bytes, not {type(body).__name__}")
        if not body:
            raise _batch_error(i, f"message to topic {topic!r} has an empty body")
        if len(body) > max_message_size:
            raise _batch_error(i, f"message body of {len(body)} bytes to topic {topic!r} exceeds "
                                  f"max_message_size {max_message_size} bytes")
        delay = m.delay_time_level
        if delay < 0:
            raise _batch_error(i, f"bad delay_time_level {delay!r}: must be >= 0")
        if delay > 0:
            raise _batch_error(i, f"delay messages are not supported in a batch (delay_time_level {delay!r})")
        if not isinstance(m.flag, int) or not -0x80000000 <= m.flag <= 0x7FFFFFFF:
            raise _batch_error(i, f"flag {m.flag!r} is out of range (a 32-bit signed int)")
        reserved = sorted(k for k in m.properties if k in _RESERVED_PROPERTIES
                          and k != MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
        if reserved:
            name = reserved[0]
            raise _batch_error(i, f"property name {name!r} is reserved by RocketMQ; use the Message field instead"
                                  if name in ("TAGS", "KEYS", "DELAY") else f"property name {name!r} is reserved by RocketMQ")
        props = dict(m.properties)
        uniq_key = MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX
        if uniq_key in props:
            props[uniq_key] = str(props[uniq_key]) if props[uniq_key] else create_id()
        if m.tags:
            props[MessageConst.TAGS] = m.tags
        if m.keys:
            props[MessageConst.KEYS] = m.keys
        props[MessageConst.WAIT_STORE_MSG_OK] = "true" if m.wait_store_msg_ok else "false"
        if uniq_key not in props:
            props[uniq_key] = create_id()
        raw = b"".join(_raw_pair(i, k, v) for k, v in props.items() if v is not None)  # (None: skipped)
        if len(raw) > MAX_PROPERTIES_LENGTH:
            raise _batch_error(i, f"properties are {len(raw)} bytes, more than {MAX_PROPERTIES_LENGTH}")
        uniqs.append(props[uniq_key])
        out += (_BATCH_ITEM_HEAD.pack(22 + len(body) + len(raw), 0, 0, m.flag, len(body)), body,
                len(raw).to_bytes(2, "big"), raw)
        total += 20 + len(body) + len(raw)
    if total > max_message_size:
        raise IllegalArgumentError(f"batch of {len(msgs)} messages is {total} bytes encoded, more than "
                                   f"max_message_size {max_message_size}; split it")
    return topic, ",".join(uniqs), b"".join(out), msgs[0].wait_store_msg_ok
