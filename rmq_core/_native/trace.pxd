cdef class TraceBuffer:
    cdef readonly object pubs
    cdef readonly object notes
    cdef Py_ssize_t _capacity
    cdef Py_ssize_t _wake_at
    cdef readonly Py_ssize_t discarded
    cdef object _wake
    cpdef bint offer_pub(self, tuple context, result) except -1
