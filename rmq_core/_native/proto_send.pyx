# cython: language_level=3, boundscheck=False, wraparound=False
"""RocketMQ 5's SendMessage on the wire (apache.rocketmq.v2, protobuf): the request decoded into
plain values, the response encoded from them.  Bytes and plain values in and out; the field numbers
are the wire contract (rmq_core/proxy/proto/apache/rocketmq/v2/definition.proto, service.proto).

decode_send_request(data) -> list of one tuple per Message (`SEND_FIELDS` names them):

    (topic, body, user_properties, tag, keys, message_id, body_encoding, message_type,
     born_ms, message_group, delivery_ms, queue_id, trace_context, recovery_seconds)

topic is Message.topic.name; user_properties a dict; tag, message_group and trace_context None when
absent (they are `optional`: present-but-empty is ""); born_ms and delivery_ms the Timestamps in
milliseconds (seconds * 1000 + nanos // 10^6), None when absent; recovery_seconds the
orphaned_transaction_recovery_duration's seconds, None when absent.  Decoding follows protobuf's
rules: the last value of a repeated scalar field wins, a repeated message field merges, a field
with an unexpected wire type is an unknown field (skipped, as are the fields the send does not
read), strings must be UTF-8.  Malformed input raises ValueError naming the problem.

encode_send_response(code, message, entries) -> SendMessageResponse's bytes, as protobuf
serializes it (fields in number order, proto3 defaults left out), entries as
(code, message, message_id, transaction_id, offset) tuples."""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.string cimport memcpy
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t

SEND_FIELDS = ("topic", "body", "user_properties", "tag", "keys", "message_id", "body_encoding", "message_type",
               "born_ms", "message_group", "delivery_ms", "queue_id", "trace_context", "recovery_seconds")

cdef enum:
    WT_VARINT = 0
    WT_I64 = 1
    WT_LEN = 2
    WT_SGROUP = 3
    WT_EGROUP = 4
    WT_I32 = 5


cdef struct _Reader:
    const uint8_t* p
    Py_ssize_t pos
    Py_ssize_t end


cdef uint64_t _varint(_Reader* r) except? 0xFFFFFFFFFFFFFFFF:
    cdef uint64_t v = 0
    cdef int shift = 0
    cdef uint8_t b
    while True:
        if r.pos >= r.end:
            raise ValueError("truncated varint")
        b = r.p[r.pos]
        r.pos += 1
        if shift == 63 and b > 1:
            raise ValueError("varint longer than 64 bits")
        v |= (<uint64_t>(b & 0x7F)) << shift
        if not b & 0x80:
            return v
        shift += 7


cdef Py_ssize_t _length(_Reader* r) except -1:
    """A length-delimited field's length, checked against what is left."""
    cdef uint64_t n = _varint(r)
    if n > <uint64_t>(r.end - r.pos):
        raise ValueError(f"length {n} runs past the end of its message ({r.end - r.pos} bytes left)")
    return <Py_ssize_t>n


cdef int _skip(_Reader* r, uint64_t key, int depth) except -1:
    """Skip the value of an unknown field (a group to its end, nested groups too)."""
    cdef int wt = key & 7
    cdef uint64_t k
    if wt == WT_VARINT:
        _varint(r)
    elif wt == WT_I64 or wt == WT_I32:
        if r.end - r.pos < (8 if wt == WT_I64 else 4):
            raise ValueError("truncated fixed-size field")
        r.pos += 8 if wt == WT_I64 else 4
    elif wt == WT_LEN:
        r.pos += _length(r)
    elif wt == WT_SGROUP:
        if depth > 100:
            raise ValueError("groups nested too deep")
        while True:
            k = _key(r)
            if (k & 7) == WT_EGROUP:
                if (k >> 3) != (key >> 3):
                    raise ValueError(f"group {key >> 3} ended by the end of group {k >> 3}")
                return 0
            _skip(r, k, depth + 1)
    else:
        raise ValueError(f"field {key >> 3}: bad wire type {wt}")
    return 0


cdef uint64_t _key(_Reader* r) except? 0xFFFFFFFFFFFFFFFF:
    cdef uint64_t k = _varint(r)
    if (k >> 3) == 0 or (k >> 3) > 0x1FFFFFFF:
        raise ValueError(f"bad field number {k >> 3}")
    return k


cdef inline str _string(_Reader* r):
    cdef Py_ssize_t n = _length(r)
    cdef str s = PyUnicode_DecodeUTF8(<const char*> (r.p + r.pos), n, NULL)  # (strict: bad UTF-8 raises)
    r.pos += n
    return s


cdef inline _Reader _sub(_Reader* r) except *:
    """The reader of an embedded message (the outer one moved past it)."""
    cdef Py_ssize_t n = _length(r)
    cdef _Reader s
    s.p = r.p
    s.pos = r.pos
    s.end = r.pos + n
    r.pos += n
    return s


cdef int _time(_Reader* r, int64_t* seconds, int32_t* nanos) except -1:
    """A google.protobuf.Timestamp or Duration (seconds = 1, nanos = 2), merged into its values."""
    cdef uint64_t k
    while r.pos < r.end:
        k = _key(r)
        if k == (1 << 3 | WT_VARINT):
            seconds[0] = <int64_t>_varint(r)
        elif k == (2 << 3 | WT_VARINT):
            nanos[0] = <int32_t>_varint(r)
        else:
            _skip(r, k, 0)
    return 0


cdef int _unread(_Reader* r, uint64_t field) except -1:
    """A SystemProperties field the send does not read, checked as protobuf checks it (its
    strings UTF-8, its embedded messages well formed)."""
    cdef _Reader s
    cdef uint64_t k
    cdef int64_t seconds = 0
    cdef int32_t nanos = 0
    if field in (8, 10, 12):  # born_host, store_host, receipt_handle
        _string(r)
        return 0
    s = _sub(r)
    if field in (9, 15):  # store_timestamp, invisible_duration
        return _time(&s, &seconds, &nanos)
    while s.pos < s.end:  # body_digest (checksum = 2), dead_letter_queue (topic = 1, message_id = 2)
        k = _key(&s)
        if (k & 7) == WT_LEN and ((k >> 3) == 2 or (field == 20 and (k >> 3) == 1)):
            _string(&s)
        else:
            _skip(&s, k, 0)
    return 0


cdef object _millis(int64_t seconds, int32_t nanos):
    # (Python's integers: seconds * 1000 may pass 64 bits; nanos // 10^6 floors as Python's does)
    return <object>seconds * 1000 + <object>nanos // 1_000_000


cdef tuple _message(_Reader* r):
    cdef uint64_t k
    cdef _Reader s, e
    cdef str topic = "", mid = "", key, value
    cdef object tag = None, group = None, trace = None
    cdef bytes body = b""
    cdef dict user = {}
    cdef list keys = []
    cdef int32_t encoding = 0, mtype = 0, queue_id = 0, born_nanos = 0, delivery_nanos = 0, recovery_nanos = 0
    cdef int64_t born_seconds = 0, delivery_seconds = 0, recovery_seconds = 0
    cdef bint born = False, delivery = False, recovery = False, entry
    cdef Py_ssize_t n
    while r.pos < r.end:
        k = _key(r)
        if k == (1 << 3 | WT_LEN):  # topic: Resource
            s = _sub(r)
            while s.pos < s.end:
                k = _key(&s)
                if k == (2 << 3 | WT_LEN):
                    topic = _string(&s)
                elif k == (1 << 3 | WT_LEN):
                    _string(&s)  # (resource_namespace: checked as a string, not used by a send)
                else:
                    _skip(&s, k, 0)
        elif k == (2 << 3 | WT_LEN):  # user_properties: map<string, string>, an entry
            s = _sub(r)
            key = value = ""
            entry = True  # (an entry with any other field is not one: protobuf keeps it as an unknown field)
            while s.pos < s.end:
                k = _key(&s)
                if k == (1 << 3 | WT_LEN):
                    key = _string(&s)
                elif k == (2 << 3 | WT_LEN):
                    value = _string(&s)
                else:
                    _skip(&s, k, 0)
                    entry = False
            if entry:
                user[key] = value
        elif k == (3 << 3 | WT_LEN):  # system_properties
            s = _sub(r)
            while s.pos < s.end:
                k = _key(&s)
                if k == (1 << 3 | WT_LEN):
                    tag = _string(&s)
                elif k == (2 << 3 | WT_LEN):
                    keys.append(_string(&s))
                elif k == (3 << 3 | WT_LEN):
                    mid = _string(&s)
                elif k == (5 << 3 | WT_VARINT):
                    encoding = <int32_t>_varint(&s)
                elif k == (6 << 3 | WT_VARINT):
                    mtype = <int32_t>_varint(&s)
                elif k == (7 << 3 | WT_LEN):
                    e = _sub(&s)
                    _time(&e, &born_seconds, &born_nanos)
                    born = True
                elif k == (11 << 3 | WT_LEN):
                    e = _sub(&s)
                    _time(&e, &delivery_seconds, &delivery_nanos)
                    delivery = True
                elif k == (13 << 3 | WT_VARINT):
                    queue_id = <int32_t>_varint(&s)
                elif k == (17 << 3 | WT_LEN):
                    group = _string(&s)
                elif k == (18 << 3 | WT_LEN):
                    trace = _string(&s)
                elif k == (19 << 3 | WT_LEN):
                    e = _sub(&s)
                    _time(&e, &recovery_seconds, &recovery_nanos)
                    recovery = True
                elif (k & 7) == WT_LEN and (k >> 3) in (4, 8, 9, 10, 12, 15, 20):
                    _unread(&s, k >> 3)
                else:
                    _skip(&s, k, 0)
        elif k == (4 << 3 | WT_LEN):  # body
            n = _length(r)
            body = PyBytes_FromStringAndSize(<const char*> (r.p + r.pos), n)
            r.pos += n
        else:
            _skip(r, k, 0)
    return (topic, body, user, tag, keys, mid, encoding, mtype,
            _millis(born_seconds, born_nanos) if born else None, group,
            _millis(delivery_seconds, delivery_nanos) if delivery else None, queue_id, trace,
            recovery_seconds if recovery else None)


def decode_send_request(bytes data) -> list:
    """A SendMessageRequest's messages as plain tuples (see the module)."""
    cdef _Reader r, s
    cdef uint64_t k
    cdef list out = []
    r.p = <const uint8_t*> PyBytes_AS_STRING(data)
    r.pos = 0
    r.end = PyBytes_GET_SIZE(data)
    while r.pos < r.end:
        k = _key(&r)
        if k == (1 << 3 | WT_LEN):
            s = _sub(&r)
            out.append(_message(&s))
        else:
            _skip(&r, k, 0)
    return out


# --- the response -----------------------------------------------------------------------------------
cdef inline Py_ssize_t _varint_size(uint64_t v):
    cdef Py_ssize_t n = 1
    while v >= 0x80:
        v >>= 7
        n += 1
    return n


cdef inline char* _put_varint(char* w, uint64_t v):
    while v >= 0x80:
        w[0] = <char>((v & 0x7F) | 0x80)
        w += 1
        v >>= 7
    w[0] = <char>v
    return w + 1


cdef inline Py_ssize_t _field_size(Py_ssize_t n):
    """A length-delimited field of n bytes (one-byte key: fields 1-15)."""
    return 1 + _varint_size(<uint64_t>n) + n


cdef inline char* _put_field(char* w, int field, const char* data, Py_ssize_t n):
    w[0] = <char>(field << 3 | WT_LEN)
    w = _put_varint(w + 1, <uint64_t>n)
    memcpy(w, data, n)
    return w + n


cdef inline Py_ssize_t _status_size(int64_t code, bytes message):
    cdef Py_ssize_t n = PyBytes_GET_SIZE(message)
    return (1 + _varint_size(<uint64_t>code) if code else 0) + (_field_size(n) if n else 0)


cdef char* _put_status(char* w, int64_t code, bytes message):
    """Status{code = 1, message = 2} as a field 1 of its parent."""
    cdef Py_ssize_t n = PyBytes_GET_SIZE(message)
    w[0] = <char>(1 << 3 | WT_LEN)
    w = _put_varint(w + 1, <uint64_t>_status_size(code, message))
    if code:
        w[0] = <char>(1 << 3 | WT_VARINT)
        w = _put_varint(w + 1, <uint64_t>code)  # (an enum: a negative one as 10 bytes, as protobuf writes it)
    if n:
        w = _put_field(w, 2, PyBytes_AS_STRING(message), n)
    return w


def encode_send_response(int64_t code, str message, list entries) -> bytes:
    """SendMessageResponse{status{code, message}, entries[(code, message, message_id,
    transaction_id, offset) ...]} as protobuf serializes it."""
    cdef bytes m = message.encode("utf-8"), em, mid, tid, out
    cdef list parts = []  # per entry: (code, message, message_id, transaction_id, offset, size)
    cdef tuple t
    cdef int64_t ecode, offset
    cdef Py_ssize_t size = _field_size(_status_size(code, m)), esize
    cdef char* w
    for t in entries:
        ecode, em, mid, tid, offset = t[0], (<str?>t[1]).encode("utf-8"), (<str?>t[2]).encode("utf-8"), \
            (<str?>t[3]).encode("utf-8"), t[4]
        esize = _field_size(_status_size(ecode, em))
        if PyBytes_GET_SIZE(mid):
            esize += _field_size(PyBytes_GET_SIZE(mid))
        if PyBytes_GET_SIZE(tid):
            esize += _field_size(PyBytes_GET_SIZE(tid))
        if offset:
            esize += 1 + _varint_size(<uint64_t>offset)
        parts.append((ecode, em, mid, tid, offset, esize))
        size += _field_size(esize)
    out = PyBytes_FromStringAndSize(NULL, size)
    w = PyBytes_AS_STRING(out)
    w = _put_status(w, code, m)
    for t in parts:
        ecode, em, mid, tid, offset, esize = t
        w[0] = <char>(2 << 3 | WT_LEN)
        w = _put_varint(w + 1, <uint64_t>esize)
        w = _put_status(w, ecode, em)
        if PyBytes_GET_SIZE(mid):
            w = _put_field(w, 2, PyBytes_AS_STRING(mid), PyBytes_GET_SIZE(mid))
        if PyBytes_GET_SIZE(tid):
            w = _put_field(w, 3, PyBytes_AS_STRING(tid), PyBytes_GET_SIZE(tid))
        if offset:
            w[0] = <char>(4 << 3 | WT_VARINT)
            w = _put_varint(w + 1, <uint64_t>offset)
    return out
