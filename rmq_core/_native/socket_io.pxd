# The pipelined connection's write side (socket_io.pyx), for send_pipeline.pyx's direct offer.
cimport cython


@cython.final
cdef class PipelinedWrites:
    cdef readonly dict pending  # opaque -> (deadline, on_done, context)
    cdef list _frames  # gathered for the next write, in order
    cdef Py_ssize_t _bytes
    cdef Py_ssize_t _requests  # requests among them
    cdef readonly Py_ssize_t unanswered  # requests written whose answers have not come (about: never < 0)
    cdef readonly double held_since  # when the first gathered frame came (0: none)
    cdef readonly bint writing
    cdef readonly bint closed
    cdef readonly object error  # what closed it (the first failure)
    cdef public bint closing
    cdef readonly double last_send  # when a request was last offered
    cdef public Py_ssize_t coalesce_bytes
    cdef public double coalesce_delay

    cdef object _take(self, list fresh)
    cpdef object offer(self, frame, opaque, double timeout, on_done, context)
    cpdef object next_write(self)
    cpdef object start_flush(self, Py_ssize_t answered=*)
    cpdef object end_flush(self, rest)
    cpdef object write_failed(self)
    cpdef object answered(self, Py_ssize_t n)
    cpdef object add_response(self, response)
    cpdef bint mark_closed(self, error)
