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
from libc.stdint cimport int64_t

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


cpdef str pub_record(int64_t timestamp, str region, str group, str topic, str msg_id, tags, keys, str store_host,
                     Py_ssize_t body_length, int64_t cost, int msg_type, str offset_msg_id, bint success):
    return (f"Pub\x01{timestamp}\x01{region}\x01{group}\x01{topic}\x01{msg_id}\x01{'null' if tags is None else tags}"
            f"\x01{'null' if keys is None else keys}\x01{store_host}\x01{body_length}\x01{cost}\x01{msg_type}\x01"
            f"{offset_msg_id}\x01{'true' if success else 'false'}\x02")


def write_pubs(pubs, str group, double epoch_offset, str trace_topic, list parts, dict keys,
               Py_ssize_t size, Py_ssize_t key_bytes, Py_ssize_t max_size, Py_ssize_t max_key_bytes, ok_status,
               message_type_of):
    """The send notes of the deque `pubs` (taken while the batch has room) as records appended
    to `parts`, their message ids and keys to `keys` (each once); a message of the trace topic
    itself is skipped.  Returns the batch's new (size, key bytes).  message_type_of(message): the
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
            record = pub_record(<int64_t>((begin + epoch_offset) * 1000.0), result.region_id or "", group, topic,
                                msg_id, msg.tags, msg_keys, addr, len(msg.body), <int64_t>((end - begin) * 1000.0),
                                msg_type, result.offset_msg_id, result.status is ok_status)
            parts.append(record)
            size += len(record)
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
