# Cython declarations of json_text.h (the shared JSON output buffer and writers), with the
# buffer helpers every writer uses: a buffer that starts on the caller's stack, its writes, its release.
from libc.stdint cimport int64_t
from libc.stdlib cimport free
from libc.string cimport memcpy


cdef extern from "json_text.h":
    ctypedef struct Out "rmq_out":
        char* buf
        Py_ssize_t n
        Py_ssize_t cap
        bint heap  # buf came from malloc (else the caller's stack buffer, or NULL)
    int out_reserve "rmq_out_reserve"(Out* o, Py_ssize_t extra) except -1
    char* rmq_json_int(char* w, int64_t v) noexcept nogil
    char* rmq_json_escaped(char* w, const char* p, Py_ssize_t n) noexcept nogil


cdef inline int out_put(Out* o, const char* s, Py_ssize_t n) except -1:
    if o.n + n > o.cap:
        out_reserve(o, n)
    memcpy(o.buf + o.n, s, n)
    o.n += n
    return 0


cdef inline int out_put_int(Out* o, int64_t v) except -1:
    if o.n + 24 > o.cap:
        out_reserve(o, 24)
    o.n = rmq_json_int(o.buf + o.n, v) - o.buf
    return 0


cdef inline void out_start(Out* o, char* stack, Py_ssize_t cap) noexcept nogil:
    """An empty buffer over the caller's `stack` of `cap` bytes (NULL, 0: none yet); it moves to
    the heap when it outgrows it (out_reserve), so out_free() it when done."""
    o.buf = stack
    o.cap = cap
    o.n = 0
    o.heap = False


cdef inline void out_free(Out* o) noexcept nogil:
    if o.heap:
        free(o.buf)
