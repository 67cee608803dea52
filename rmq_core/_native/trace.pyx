# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Message trace records in RocketMQ 4.x's text format (client/trace TraceDataEncoder), natively.

  Pub  Pub, timestamp, region, group, topic, msgId, tags, keys, storeHost, bodyLength, costTime,
       msgType ordinal, offsetMsgId, success
  fields joined by \\x01, the record closed by \\x02; a null Java string is written "null".

- TraceBuffer: where the trace hooks write (AsyncTraceDispatcher's traceContextQueue and
  TraceDataSegment in one): each answered send is written at once as its Pub record into the
  current segment (PipelinedCompletion offers it without a Python frame) - a few hundred bytes,
  no object kept, so a traced producer leaves the garbage collector nothing to walk; a segment
  full (~118 KB or its keys near the property limit) waits in `ready` for the dispatcher's
  worker, which is woken then and otherwise polls.  Consume and end-transaction notes wait as
  tuples in `notes` (the worker writes their records with add()).  At most `capacity` records
  and notes wait outside full segments (AsyncTraceDispatcher's context queue) and at most
  `max_ready` full segments wait for the worker (its trace messages waiting to be sent); beyond,
  a record or note is dropped and counted in `discarded`;
- pub_record: the one writer of a Pub record (rmq_core.client.trace.encode uses it too).

Plain values in: a send's context tuple (message, uniq, mode, queue, store host, timeout,
begin, ...) and its SendResult are read, nothing of them kept.
"""
from collections import deque
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcmp, memcpy

cimport cython

from clock cimport monotonic as _monotonic


@cython.final
cdef class TraceSegment:
    """The records of one trace message (TraceDataSegment): `size` bytes of UTF-8 records in
    `body` (allocated for a whole segment at once: a record is written in place, no resize),
    `key_bytes` bytes of the keys that index them (each traced message's id and keys, space
    separated), how many records, and when the first came (monotonic)."""

    def __init__(self, Py_ssize_t room=0):
        self.body = bytearray(room)
        self.key_buf = bytearray(room // 4)

    cdef inline bint full(self, Py_ssize_t max_size, Py_ssize_t max_key_bytes):
        return self.size >= max_size or self.key_bytes >= max_key_bytes

    @property
    def data(self):
        """The records: the trace message's body."""
        return PyBytes_FromStringAndSize(PyByteArray_AS_STRING(self.body), self.size)

    @property
    def keys(self):
        """The keys that index the records, each once, in order, space separated (the trace
        message's KEYS, as AsyncTraceDispatcher's key set); made without an object per key."""
        cdef const char* src = PyByteArray_AS_STRING(self.key_buf)
        cdef Py_ssize_t n = self.key_bytes, i, start, length, out_len = 0, tokens = 1, slots = 16, slot
        cdef uint64_t h
        cdef int32_t* table
        cdef bytearray out = bytearray(n)
        cdef char* dst = PyByteArray_AS_STRING(out)
        for i in range(n):
            tokens += src[i] == 32
        while slots < 2 * tokens:
            slots <<= 1
        # open addressing on FNV-1a: (start + 1, length) of each key kept; 0 marks a free slot
        table = <int32_t*>calloc(2 * slots, sizeof(int32_t))
        if table == NULL:
            raise MemoryError()
        try:
            i = 0
            while i < n:
                start = i
                h = 14695981039346656037ULL
                while i < n and src[i] != 32:
                    h = (h ^ <unsigned char>src[i]) * 1099511628211ULL
                    i += 1
                length = i - start
                i += 1
                if length == 0:
                    continue
                slot = <Py_ssize_t>(h & <uint64_t>(slots - 1))
                while table[2 * slot] and not (table[2 * slot + 1] == length
                                               and memcmp(src + table[2 * slot] - 1, src + start, length) == 0):
                    slot = (slot + 1) & (slots - 1)
                if table[2 * slot]:
                    continue  # seen before
                table[2 * slot], table[2 * slot + 1] = <int32_t>(start + 1), <int32_t>length
                if out_len:
                    dst[out_len] = 32
                    out_len += 1
                memcpy(dst + out_len, src + start, length)
                out_len += length
        finally:
            free(table)
        return PyUnicode_DecodeUTF8(dst, out_len, NULL)


@cython.final
cdef class TraceBuffer:
    """The trace records and notes of one traced client waiting for its dispatcher's worker.

    group, trace_topic: the client's and where its traces go (a send to the trace topic itself is
    not traced); epoch_offset: wall clock minus monotonic (records carry epoch ms); ok_status:
    SendStatus.SEND_OK; message_type_of(message): the Pub msgType ordinal of a message with
    properties or a delay level (the others are normal, 0); max_size / max_key_bytes: a
    segment's limits; max_ready: how many full segments may wait; wake(): called when a segment
    fills or half the capacity waits."""

    def __init__(self, Py_ssize_t capacity, wake, str group, str trace_topic, double epoch_offset, ok_status,
                 message_type_of, Py_ssize_t max_size, Py_ssize_t max_key_bytes, Py_ssize_t max_ready=16):
        self.ready = deque()
        self.notes = deque()
        self.capacity = capacity
        self._wake = wake
        self._group, self._trace_topic = group, trace_topic
        self._epoch_offset = epoch_offset
        self._ok_status, self._message_type_of = ok_status, message_type_of
        self._max_size, self._max_key_bytes = max_size, max_key_bytes
        self._max_ready = max_ready
        self._current = self._new_segment()

    cdef inline TraceSegment _new_segment(self):
        return TraceSegment(self._max_size + 8192)

    @property
    def capacity(self):
        return self._capacity

    @capacity.setter
    def capacity(self, Py_ssize_t n):
        self._capacity = n
        self._wake_at = n // 2

    def __len__(self):
        """Records and notes waiting (not yet taken by the worker)."""
        return self._pending

    cdef inline bint _own(self, str topic) except -1:
        """A message of the trace topic (its own sends are not traced)."""
        return PyUnicode_Tailmatch(topic, self._trace_topic, 0, len(topic), -1) == 1

    cdef inline bint _full(self):
        if self._pending - self._ready_records >= self._capacity or len(self.ready) >= self._max_ready:
            self.discarded += 1
            return True
        return False

    cdef int _written(self) except -1:
        """A record went into the current segment: a full segment goes to `ready` (and the worker
        is woken)."""
        cdef TraceSegment seg = self._current
        self._pending += 1
        seg.count += 1
        if seg.count == 1:
            seg.first = _monotonic()
        if seg.full(self._max_size, self._max_key_bytes):
            self.ready.append(seg)
            self._ready_records += seg.count
            self._current = self._new_segment()
            self._wake()
        elif self._pending - self._ready_records == self._wake_at:
            self._wake()
        return 0

    cdef int _keys(self, str msg_id, keys) except -1:
        """A record's index keys (its message id, the message's keys) after the segment's (the
        keys are made unique when the segment is sent)."""
        cdef TraceSegment seg = self._current
        cdef const char* p
        cdef Py_ssize_t n
        cdef char* dst
        _field(msg_id, &p, &n)
        dst = _room(seg.key_buf, seg.key_bytes, n + 1)
        memcpy(dst, p, n)
        dst[n] = 32
        seg.key_bytes += n + 1
        if keys:
            _field(keys, &p, &n)
            dst = _room(seg.key_buf, seg.key_bytes, n + 1)
            memcpy(dst, p, n)
            dst[n] = 32
            seg.key_bytes += n + 1
        return 0

    cdef int _pub(self, msg, str msg_id, str offset_msg_id, str region, str store_host, double begin, double end,
                  bint success) except -1:
        cdef int msg_type = self._message_type_of(msg) if (msg.properties or msg.delay_time_level) else 0
        keys = msg.keys
        self._current.size += _write_pub(
            self._current.body, self._current.size, <int64_t>((begin + self._epoch_offset) * 1000.0), region, self._group, msg.topic,
            msg_id, msg.tags, keys, store_host, len(msg.body), <int64_t>((end - begin) * 1000.0), msg_type,
            offset_msg_id, success)
        self._keys(msg_id, keys)
        return self._written()

    cpdef bint offer_pub(self, tuple context, result) except -1:
        """An answered send (SendMessageTraceHookImpl.sendMessageAfter): its context and SendResult
        written as a Pub record; False when dropped (full) or not traced (the trace topic's own)."""
        msg = context[0]
        if self._own(msg.topic) or self._full():
            return False
        self._pub(msg, result.msg_id, result.offset_msg_id, result.region_id or "", context[4], context[6],
                  _monotonic(), result.status is self._ok_status)
        return True

    def offer_batch(self, list msgs, list msg_ids, list offset_ids, str region, str store_host, double begin,
                    bint success):
        """An answered batch: a Pub record per message (its own id, tags, keys and body, the
        batch's store host, cost and status); returns how many were written."""
        cdef Py_ssize_t i, n = min(len(msgs), len(msg_ids)), n_ids = len(offset_ids), written = 0
        cdef double end = _monotonic()
        for i in range(n):
            msg = msgs[i]
            if self._own(msg.topic) or self._full():
                continue
            self._pub(msg, msg_ids[i], offset_ids[i] if i < n_ids else "", region, store_host, begin, end, success)
            written += 1
        return written

    def offer(self, tuple note):
        """Another hook's note, for the worker; False when dropped."""
        if self._full():
            return False
        self.notes.append(note)
        self._pending += 1
        if self._pending - self._ready_records == self._wake_at:
            self._wake()
        return True

    def take_note(self):
        """The oldest note (the worker's; IndexError when none)."""
        note = self.notes.popleft()
        self._pending -= 1
        return note

    def add(self, str record, str msg_id, keys):
        """A record the worker wrote from a note, into the current segment."""
        cdef TraceSegment seg = self._current
        cdef const char* p
        cdef Py_ssize_t n
        _field(record, &p, &n)
        memcpy(_room(seg.body, seg.size, n), p, n)
        seg.size += n
        self._keys(msg_id, keys)
        self._written()

    def take(self, double threshold, bint force):
        """The segments to send now: the full ones, and the current one when it has records and
        waited `threshold` seconds (or `force`)."""
        cdef list out = []
        cdef TraceSegment seg
        while self.ready:
            seg = self.ready.popleft()
            self._pending -= seg.count
            self._ready_records -= seg.count
            out.append(seg)
        seg = self._current
        if seg.count and (force or _monotonic() - seg.first >= threshold):
            self._pending -= seg.count
            out.append(seg)
            self._current = self._new_segment()
        return out


cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL
    Py_ssize_t PyUnicode_Tailmatch(object s, object substr, Py_ssize_t start, Py_ssize_t end, int direction) except -1


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


cdef char* _room(bytearray out, Py_ssize_t pos, Py_ssize_t n) except NULL:
    """Where `n` bytes go at `pos` of `out`, grown (doubling) when they would not fit."""
    cdef Py_ssize_t have = PyByteArray_GET_SIZE(out)
    if pos + n > have:
        PyByteArray_Resize(out, max(pos + n, 2 * have))
    return PyByteArray_AS_STRING(out) + pos


cdef Py_ssize_t _write_pub(bytearray out, Py_ssize_t pos, int64_t timestamp, str region, str group, str topic, str msg_id, tags, keys,
                           str store_host, int64_t body_length, int64_t cost, int64_t msg_type, str offset_msg_id,
                           bint success) except -1:
    """A Pub record's UTF-8 bytes written at `pos` of `out` (grown if need be); returns how many."""
    cdef const char* p[14]
    cdef Py_ssize_t n[14]
    cdef char nums[4][24]
    cdef Py_ssize_t i, total = 0
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
    dst = _room(out, pos, total)
    for i in range(14):
        memcpy(dst, p[i], n[i])
        dst += n[i]
        dst[0] = 1 if i < 13 else 2
        dst += 1
    return total


cpdef str pub_record(int64_t timestamp, str region, str group, str topic, str msg_id, tags, keys, str store_host,
                     Py_ssize_t body_length, int64_t cost, int msg_type, str offset_msg_id, bint success):
    cdef bytearray out = bytearray()
    cdef Py_ssize_t n = _write_pub(out, 0, timestamp, region, group, topic, msg_id, tags, keys, store_host, body_length,
                                   cost, msg_type, offset_msg_id, success)
    return PyUnicode_DecodeUTF8(PyByteArray_AS_STRING(out), n, NULL)
