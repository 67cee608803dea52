cdef class TraceSegment:
    cdef readonly bytearray body
    cdef readonly bytearray key_buf
    cdef readonly Py_ssize_t size
    cdef readonly Py_ssize_t key_bytes
    cdef readonly Py_ssize_t count
    cdef readonly double first
    cdef inline bint full(self, Py_ssize_t max_size, Py_ssize_t max_key_bytes)


cdef class TraceBuffer:
    cdef readonly object ready
    cdef readonly object notes
    cdef TraceSegment _current
    cdef Py_ssize_t _capacity
    cdef Py_ssize_t _wake_at
    cdef Py_ssize_t _pending
    cdef Py_ssize_t _ready_records  # (of _pending: in full segments)
    cdef Py_ssize_t _max_ready
    cdef readonly Py_ssize_t discarded
    cdef object _wake
    cdef str _group
    cdef str _trace_topic
    cdef double _epoch_offset
    cdef object _ok_status
    cdef object _message_type_of
    cdef Py_ssize_t _max_size
    cdef Py_ssize_t _max_key_bytes
    cdef inline TraceSegment _new_segment(self)
    cpdef bint offer_pub(self, tuple context, result) except -1
    cdef int _pub(self, msg, str msg_id, str offset_msg_id, str region, str store_host, double begin, double end,
                  bint success) except -1
    cdef int _keys(self, str msg_id, keys) except -1
    cdef int _written(self) except -1
    cdef inline bint _full(self)
    cdef inline bint _own(self, str topic) except -1
