# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Message trace records in RocketMQ 4.x's text format (client/trace TraceDataEncoder), natively.

  Pub  Pub, timestamp, region, group, topic, msgId, tags, keys, storeHost, bodyLength, costTime,
       msgType ordinal, offsetMsgId, success
  fields joined by \\x01, the record closed by \\x02; a null Java string is written "null".

- TraceBuffer: the bounded buffer the trace hooks append to (AsyncTraceDispatcher's
  traceContextQueue): send notes (PipelinedCompletion offers each answered send without a Python
  frame) and consume notes; a full buffer drops the note and counts it;
- pub_record: the one writer of a Pub record (rmq_core.client.trace.encode uses it too);
- write_pubs: a traced producer's send notes, one after another, as Pub records into a trace
  message's batch (the dispatcher's usual work, one record per traced send).

Plain values in and out: a send note is (the send's context tuple (message, uniq, mode, queue,
store host, timeout, begin, ...), its SendResult, end) - write_pubs reads their attributes, keeps
nothing.
"""
from collections import deque
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcpy

cimport cython

from clock cimport monotonic as _monotonic


@cython.final
cdef class TraceBuffer:
    """Notes waiting for the trace dispatcher's worker: `pubs` (send notes) and `notes` (the
    others), at most `capacity` in all; beyond, a note is dropped and counted in `discarded`.
    wake() is called when they reach half the capacity (the worker drains them at once)."""

    def __init__(self, Py_ssize_t capacity, wake):
        self.pubs = deque()
        self.notes = deque()
        self.capacity = capacity
        self._wake = wake
        self.discarded = 0

    @property
    def capacity(self):
        return self._capacity

    @capacity.setter
    def capacity(self, Py_ssize_t n):
        self._capacity = n
        self._wake_at = n // 2

    def __len__(self):
        return len(self.pubs) + len(self.notes)

    cpdef bint offer_pub(self, tuple context, result) except -1:
        """An answered send (its context and SendResult): noted with its end time."""
        cdef Py_ssize_t n = len(self.pubs) + len(self.notes)
        if n >= self._capacity:
            self.discarded += 1
            return False
        self.pubs.append((context, result, _monotonic()))
        if n == self._wake_at:
            self._wake()
        return True

    def offer(self, tuple note):
        """Another hook's note."""
        cdef Py_ssize_t n = len(self.pubs) + len(self.notes)
        if n >= self._capacity:
            self.discarded += 1
            return False
        self.notes.append(note)
        if n == self._wake_at:
            self._wake()
        return True


cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL


cdef inline Py_ssize_t _digits(char* buf, int64_t v) noexcept:
    """v in decimal at the end of buf[24]; returns where it starts."""
    cdef Py_ssize_t i = 24
    cdef bint neg = v < 0
    cdef uint64_t u = <uint64_t>(-v) if neg else <uint64_t>v
    while True:
        i -= 1
        buf[i] = <char>(48 + u % 10)
        u //= 10
        if u == 0:
            break
    if neg:
        i -= 1
        buf[i] = 45
    return i


cdef inline int _field(value, const char** p, Py_ssize_t* n) except -1:
    """A str field's UTF-8 (an ASCII str's own buffer: no copy); None as Java writes null."""
    if value is None:
        p[0], n[0] = b"null", 4
    else:
        p[0] = PyUnicode_AsUTF8AndSize(value, n)
    return 0


cdef Py_ssize_t _write_pub(bytearray out, int64_t timestamp, str region, str group, str topic, str msg_id, tags, keys,
                           str store_host, int64_t body_length, int64_t cost, int64_t msg_type, str offset_msg_id,
                           bint success) except -1:
    """A Pub record's UTF-8 bytes appended to `out` in one resize; returns how many."""
    cdef const char* p[14]
    cdef Py_ssize_t n[14]
    cdef char nums[4][24]
    cdef Py_ssize_t i, total = 0, pos
    cdef char* dst
    cdef int64_t ints[4]
    # the fields in TraceDataEncoder's order: Pub, timestamp, region, group, topic, msgId, tags,
    # keys, storeHost, bodyLength, costTime, msgType, offsetMsgId, success
    p[0], n[0] = b"Pub", 3
    _field(region, &p[2], &n[2])
    _field(group, &p[3], &n[3])
    _field(topic, &p[4], &n[4])
    _field(msg_id, &p[5], &n[5])
    _field(tags, &p[6], &n[6])
    _field(keys, &p[7], &n[7])
    _field(store_host, &p[8], &n[8])
    _field(offset_msg_id, &p[12], &n[12])
    ints[0], ints[1], ints[2], ints[3] = timestamp, body_length, cost, msg_type
    i = _digits(nums[0], ints[0])
    p[1], n[1] = nums[0] + i, 24 - i
    i = _digits(nums[1], ints[1])
    p[9], n[9] = nums[1] + i, 24 - i
    i = _digits(nums[2], ints[2])
    p[10], n[10] = nums[2] + i, 24 - i
    i = _digits(nums[3], ints[3])
    p[11], n[11] = nums[3] + i, 24 - i
    if success:
        p[13], n[13] = b"true", 4
    else:
        p[13], n[13] = b"false", 5
    for i in range(14):
        total += n[i] + 1  # (each field closed by \x01, the last by \x02)
    pos = PyByteArray_GET_SIZE(out)
    PyByteArray_Resize(out, pos + total)
    dst = PyByteArray_AS_STRING(out) + pos
    for i in range(14):
        memcpy(dst, p[i], n[i])
        dst += n[i]
        dst[0] = 1 if i < 13 else 2
        dst += 1
    return total


cpdef str pub_record(int64_t timestamp, str region, str group, str topic, str msg_id, tags, keys, str store_host,
                     Py_ssize_t body_length, int64_t cost, int msg_type, str offset_msg_id, bint success):
    cdef bytearray out = bytearray()
    _write_pub(out, timestamp, region, group, topic, msg_id, tags, keys, store_host, body_length, cost, msg_type,
               offset_msg_id, success)
    return out.decode("utf-8")


def write_pubs(pubs, str group, double epoch_offset, str trace_topic, bytearray body, dict keys,
               Py_ssize_t size, Py_ssize_t key_bytes, Py_ssize_t max_size, Py_ssize_t max_key_bytes, ok_status,
               message_type_of):
    """The send notes of the deque `pubs` (taken while the batch has room) as records appended
    to `body` (UTF-8), their message ids and keys to `keys` (each once); a message of the trace
    topic itself is skipped.  Returns the batch's new (size, key bytes).  message_type_of(message): the
    type ordinal of a message with properties or a delay level (the others are normal, 0)."""
    cdef double begin, end
    cdef str msg_id, k
    cdef int msg_type
    cdef tuple note, context
    while pubs:
        note = pubs.popleft()
        context = note[0]
        msg, result, addr, begin, end = context[0], note[1], context[4], context[6], note[2]
        topic = msg.topic
        if not topic.startswith(trace_topic):
            msg_id = result.msg_id
            msg_keys = msg.keys
            msg_type = message_type_of(msg) if (msg.properties or msg.delay_time_level) else 0
            size += _write_pub(body, <int64_t>((begin + epoch_offset) * 1000.0), result.region_id or "", group, topic,
                               msg_id, msg.tags, msg_keys, addr, len(msg.body), <int64_t>((end - begin) * 1000.0),
                               msg_type, result.offset_msg_id, result.status is ok_status)
            if msg_id not in keys:
                keys[msg_id] = None
                key_bytes += len(msg_id) + 1
            if msg_keys:
                for k in msg_keys.split(" "):
                    if k and k not in keys:
                        keys[k] = None
                        key_bytes += len(k) + 1
        if size >= max_size or key_bytes >= max_key_bytes:
            break
    return size, key_bytes
