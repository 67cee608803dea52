# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Batch bodies (docs/protocol.md §5.5): SEND_BATCH_MESSAGE bodies read back into items, and written
from Message objects in one validating pass (Producer.send_batch, auto_batch); and the UNIQ_KEY
maker.  The record's shared code is record.pxd's."""
cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Next
from cpython.object cimport PyObject
from libc.stdint cimport int32_t, int64_t, uint32_t
from libc.string cimport memcpy

from record_layout cimport *
from rmq_core._native.record cimport (BufferView, _i16, _i32, _put_u32, illegal_argument, is_illegal_argument,
                                      put_property, record_decode_error)
from clock cimport epoch_ms
from json_text cimport Out, out_free, out_reserve, out_start

cdef extern from "Python.h":
    bint PyUnicode_CheckExact(object o)
    object PyIter_Next(object o)
    str PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    void* PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)


# --- batch bodies -------------------------------------------------------------------------------------
def decode_batch_body(buf):
    """Split a SEND_BATCH_MESSAGE body into [(flag, body, raw properties bytes)].

    The body comes from the network: every length is checked before it is used, and truncated or
    inconsistent input raises MessageDecodeError naming the item's offset."""
    cdef BufferView b = BufferView(buf)
    cdef const unsigned char* p = b.ptr
    cdef Py_ssize_t n = b.size, pos = 0, avail, body_len, props_len, total
    cdef int32_t flag
    cdef list out = []
    while pos < n:
        avail = n - pos
        if avail < BATCH_ITEM_FIXED:
            raise record_decode_error(pos, f"truncated batch item: {avail} bytes left, an item needs at least {BATCH_ITEM_FIXED}")
        total = _i32(p + pos)
        flag = _i32(p + pos + 12)
        body_len = _i32(p + pos + 16)
        if total < BATCH_ITEM_FIXED or total > avail:
            raise record_decode_error(pos, f"batch item size {total} is outside {BATCH_ITEM_FIXED}..{avail} (bytes left)")
        if body_len < 0 or body_len > total - BATCH_ITEM_FIXED:
            raise record_decode_error(pos, f"batch item body length {body_len} does not fit in item size {total}")
        props_len = _i16(p + pos + 20 + body_len)
        if props_len < 0 or BATCH_ITEM_FIXED + body_len + props_len != total:
            raise record_decode_error(
                pos, f"batch item size {total} does not match 20 + body {body_len} + 2 + properties {props_len}")
        out.append((
            flag,
            PyBytes_FromStringAndSize(<const char*>p + pos + 20, body_len),
            PyBytes_FromStringAndSize(<const char*>p + pos + 22 + body_len, props_len),
        ))
        pos += total
    return out


# A batch body written from Message objects (Producer.send_batch, auto_batch's items), validated and
# encoded in one pass; decode_batch_body reads it back (encode_batch_py in
# tests/client/batch_reference.py is the Python twin the tests compare it with).  Each item:
#
#     int32 totalSize = 22 + bodyLength + propertiesLength
#     int32 magic = 0,  int32 bodyCRC = 0          (the broker fills them in, as for Java's clients)
#     int32 flag,  int32 bodyLength,  body
#     int16 propertiesLength,  properties           (put_property's pairs)
#
# An item's properties are Message.wire_properties() (user properties, TAGS, KEYS, WAIT) with
# UNIQ_KEY set: the message's own one where it has it, else a new one (at the end).
cdef object _batch_error(Py_ssize_t index, str text):
    """The error of item `index` (-1: a message sent on its own, encode_batch_item)."""
    if index < 0:
        return illegal_argument(text)
    return illegal_argument(f"batch item {index}: {text}")


cdef object _reserved_name(dict props, frozenset reserved):
    """The first (sorted) reserved property name among `props`' names, UNIQ_KEY allowed; None."""
    cdef PyObject* k
    cdef PyObject* v
    cdef Py_ssize_t pos = 0
    first = None
    while PyDict_Next(props, &pos, &k, &v):
        if <object>k in reserved and <object>k != "UNIQ_KEY":
            if first is None or <object>k < first:
                first = <object>k
    return first


cdef str _put_item_properties(Out* o, m, dict user, UniqIds uniq_ids, Py_ssize_t* size):
    """An item's properties through put_property; its UNIQ_KEY (*size: the properties' size)."""
    cdef PyObject* k
    cdef PyObject* v
    cdef Py_ssize_t pos = 0, raw = 0
    cdef bint has_uniq = False
    cdef str uniq = None
    if user:
        while PyDict_Next(user, &pos, &k, &v):
            if PyUnicode_CheckExact(<object>k) and <object>k == "UNIQ_KEY":
                uniq = str(<object>v) if <object>v else uniq_ids.next_id()
                has_uniq = True
                raw += put_property(o, "UNIQ_KEY", uniq)
            elif v != <PyObject*>None:  # (None: skipped, as properties_to_bytes and a single send do)
                raw += put_property(o, <object>k, <object>v)
    tags = m.tags
    if tags:
        raw += put_property(o, "TAGS", tags)
    keys = m.keys
    if keys:
        raw += put_property(o, "KEYS", keys)
    raw += put_property(o, "WAIT", "true" if m.wait_store_msg_ok else "false")
    if not has_uniq:
        uniq = uniq_ids.next_id()
        raw += put_property(o, "UNIQ_KEY", uniq)
    size[0] = raw
    return uniq


cdef str _put_item(Out* o, m, Py_ssize_t i, str topic, Py_ssize_t max_message_size, frozenset reserved,
                   UniqIds uniq_ids, Py_ssize_t* item_size):
    """One message as a batch item at the end of `o` after check_message's checks and the batch
    rules (errors name item i); its UNIQ_KEY.  item_size: its size as the batch limit counts it
    (20 + body + properties)."""
    cdef Py_ssize_t start, props_at, raw = 0, body_len
    cdef int64_t c_flag
    cdef dict user
    cdef unsigned char* at
    body = m.body
    if type(body) is not bytes:
        raise _batch_error(i, f"body must be bytes, not {type(body).__name__}")
    body_len = PyBytes_GET_SIZE(body)
    if body_len == 0:
        raise _batch_error(i, f"message to topic {topic!r} has an empty body")
    if body_len > max_message_size:
        raise _batch_error(i, f"message body of {body_len} bytes to topic {topic!r} exceeds "
                              f"max_message_size {max_message_size} bytes")
    delay = m.delay_time_level
    if delay < 0:
        raise _batch_error(i, f"bad delay_time_level {delay!r}: must be >= 0")
    if delay > 0:
        raise _batch_error(i, f"delay messages are not supported in a batch (delay_time_level {delay!r})")
    flag = m.flag
    try:
        c_flag = flag
    except (OverflowError, TypeError):
        c_flag = 1 << 40
    if c_flag < -0x80000000 or c_flag > 0x7FFFFFFF:
        raise _batch_error(i, f"flag {flag!r} is out of range (a 32-bit signed int)")
    user = m.properties
    if user:
        name = _reserved_name(user, reserved)
        if name is not None:
            raise _batch_error(i, f"property name {name!r} is reserved by RocketMQ; use the Message field "
                                  f"instead" if name in ("TAGS", "KEYS", "DELAY") else
                                  f"property name {name!r} is reserved by RocketMQ")
    # the fixed part, the body, then the properties after a 2-byte length slot
    start = o.n
    if o.n + 20 + body_len + 2 > o.cap:
        out_reserve(o, 20 + body_len + 2)
    at = <unsigned char*>o.buf + start
    _put_u32(at + 4, 0)
    _put_u32(at + 8, 0)
    _put_u32(at + 12, <uint32_t>c_flag)
    _put_u32(at + 16, <uint32_t>body_len)
    memcpy(at + 20, PyBytes_AS_STRING(body), body_len)
    props_at = start + 20 + body_len + 2
    o.n = props_at
    try:
        uniq = _put_item_properties(o, m, user, uniq_ids, &raw)
    except Exception as e:
        if not is_illegal_argument(e):
            raise
        raise _batch_error(i, str(e)) from None
    if raw > MAX_PROPS:
        raise _batch_error(i, f"properties are {raw} bytes, more than {MAX_PROPS}")
    at = <unsigned char*>o.buf + start  # (the buffer may have moved)
    _put_u32(at, <uint32_t>(BATCH_ITEM_FIXED + body_len + raw))
    o.buf[props_at - 2] = <char>(raw >> 8)
    o.buf[props_at - 1] = <char>raw
    item_size[0] = 20 + body_len + raw
    return uniq


def encode_send_batch(list msgs, Py_ssize_t max_message_size, message_cls, frozenset reserved, check_topic,
                      UniqIds uniq_ids):
    """Validate and encode a batch: (topic, comma-joined UNIQ_KEYs, body, the first message's
    wait_store_msg_ok).  Each message is checked as selector.check_message does (a Message, the
    topic once through check_topic, a bytes body of 1..max_message_size, no reserved property name,
    a delay level >= 0) plus the batch rules (one topic, no delay, no retry topic, a 32-bit flag,
    properties that do not corrupt the encoding and fit 32767 bytes); the encoded batch (20 bytes a
    message plus bodies and properties) must fit max_message_size.  IllegalArgumentError names the
    item and the bad value.  uniq_ids: the UNIQ_KEY maker (new UNIQ_KEYs)."""
    cdef Py_ssize_t count = len(msgs), i, item_size = 0, total = 0
    cdef Out o
    cdef list uniqs
    if count == 0:
        raise illegal_argument("send_batch needs at least one message")
    uniqs = [None] * count
    topic = None
    out_start(&o, NULL, 0)
    try:
        for i in range(count):
            m = msgs[i]
            if not isinstance(m, message_cls):
                raise _batch_error(i, f"expected a Message, got {type(m).__name__}")
            if i == 0:
                topic = m.topic
                check_topic(topic)
                if topic.startswith("%RETRY%"):
                    raise illegal_argument(f"retry topic {topic!r} is not supported in a batch")
                # room for every item the size of the first (its body and ~100 bytes of properties)
                out_reserve(&o, count * (BATCH_ITEM_FIXED + 100 + (PyBytes_GET_SIZE(m.body) if type(m.body) is bytes else 0)))
            else:
                other = m.topic
                if other is not topic and other != topic:
                    raise _batch_error(i, f"all messages of a batch must have the same topic: {other!r} "
                                          f"differs from {topic!r}")
            uniqs[i] = _put_item(&o, m, i, topic, max_message_size, reserved, uniq_ids, &item_size)
            total += item_size
        if total > max_message_size:
            raise illegal_argument(
                f"batch of {count} messages is {total} bytes encoded, more than max_message_size "
                f"{max_message_size}; split it")
        return topic, ",".join(uniqs), PyBytes_FromStringAndSize(o.buf, o.n), msgs[0].wait_store_msg_ok
    finally:
        out_free(&o)


def encode_batch_item(message, Py_ssize_t max_message_size, message_cls, frozenset reserved, check_topic,
                      UniqIds uniq_ids):
    """One message sent on its own as a batch item (auto_batch gathers these): (topic, UNIQ_KEY,
    item, wait_store_msg_ok) after encode_send_batch's checks, its errors naming the bad value
    without an item index; the item is what encode_send_batch writes for it (a batch body is items
    end to end)."""
    cdef char stack[1024]
    cdef Out o
    cdef Py_ssize_t item_size = 0
    if not isinstance(message, message_cls):
        raise illegal_argument(f"expected a Message, got {type(message).__name__}")
    topic = message.topic
    check_topic(topic)
    if topic.startswith("%RETRY%"):
        raise illegal_argument(f"retry topic {topic!r} is not supported in a batch")
    out_start(&o, stack, 1024)
    try:
        uniq = _put_item(&o, message, -1, topic, max_message_size, reserved, uniq_ids, &item_size)
        if item_size > max_message_size:
            raise illegal_argument(f"message to topic {topic!r} is {item_size} bytes encoded, more than "
                                       f"max_message_size {max_message_size}")
        return topic, uniq, PyBytes_FromStringAndSize(o.buf, o.n), message.wait_store_msg_ok
    finally:
        out_free(&o)


# --- UNIQ_KEY -----------------------------------------------------------------------------------------

cdef const char* _UPPER_HEX = "0123456789ABCDEF"


@cython.final
cdef class UniqIds:
    """The UNIQ_KEY maker (MessageClientIDSetter.create_uniq_id): 32 upper-case hex digits - the
    fixed part (IP, pid, a random number: 20 digits, from `prefix()`, asked once), the milliseconds
    since the start of this month (8; `month_bounds(now_ms)` gives (month start, next month start)
    in ms, asked when a month begins) and a counter from the iterator `sequence` (4).  Called from
    many threads: each step is atomic under the GIL, and racing month look-ups agree."""

    cdef object _prefix_of
    cdef object _month_bounds
    cdef object _sequence
    cdef str _prefix
    cdef int64_t _month_start
    cdef int64_t _next_month

    def __init__(self, prefix, month_bounds, sequence):
        self._prefix_of = prefix
        self._month_bounds = month_bounds
        self._sequence = sequence
        self._prefix = None
        self._month_start = 0
        self._next_month = 0

    def __call__(self):
        return self.next_id()

    cdef str next_id(self):
        cdef int64_t now = epoch_ms()
        cdef Py_ssize_t n, i
        cdef uint32_t elapsed, counter
        cdef char* out
        if now >= self._next_month:
            if self._prefix is None:
                prefix = self._prefix_of()
                if type(prefix) is not str or not (<str>prefix).isascii():
                    raise ValueError(f"UNIQ_KEY prefix {prefix!r} is not ASCII hex")
                self._prefix = prefix
            start, following = self._month_bounds(now)
            self._month_start, self._next_month = start, following
        counter = <uint32_t>(<int64_t>PyIter_Next(self._sequence) & 0xFFFF)
        elapsed = <uint32_t>((now - self._month_start) & 0xFFFFFFFF)
        prefix = self._prefix
        n = PyUnicode_GET_LENGTH(prefix)
        uniq = PyUnicode_New(n + 12, 127)
        out = <char*>PyUnicode_DATA(uniq)
        memcpy(out, PyUnicode_DATA(prefix), n)
        for i in range(8):
            out[n + i] = _UPPER_HEX[(elapsed >> (28 - 4 * i)) & 15]
        for i in range(4):
            out[n + 8 + i] = _UPPER_HEX[(counter >> (12 - 4 * i)) & 15]
        return uniq
