# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""NativeMap: one buffer-protocol view of a mapped file (a commit-log segment, a consume-queue
file), taken once and released before the mmap is closed, so the kernels that take it (cq,
commit_log) cost no per-call buffer acquisition; plus the page work done on such a file
(prefault, msync without the GIL, zeroing a range, writing bytes)."""
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_WRITABLE, PyBUF_SIMPLE
from cpython.bytearray cimport PyByteArray_AS_STRING
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.errno cimport errno
from libc.stdint cimport uint64_t
from libc.string cimport memcpy, memset

from store_bytes cimport copy_out, rmq_ldu64

cdef extern from "<sys/mman.h>" nogil:
    int msync(void *addr, size_t length, int flags)
    int MS_SYNC


cdef class NativeMap:
    """Holds one buffer-protocol view (of an mmap) for the native routines; `release()` it before
    closing the mmap (an exported view keeps mmap.close() from succeeding)."""

    def __cinit__(self, obj, bint writable=True):
        PyObject_GetBuffer(obj, &self.view, PyBUF_WRITABLE if writable else PyBUF_SIMPLE)
        self.held = True
        self.ptr = <unsigned char *>self.view.buf
        self.size = self.view.len

    def release(self):
        if self.held:
            self.held = False
            self.ptr = NULL
            self.size = 0
            PyBuffer_Release(&self.view)

    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.view)

    def read(self, Py_ssize_t pos, Py_ssize_t n):
        cdef unsigned char *p = self.check(pos, pos + n)
        return PyBytes_FromStringAndSize(<char *>p + pos, n)

    def write(self, Py_ssize_t pos, data):
        cdef const unsigned char[::1] v
        cdef Py_ssize_t n
        cdef unsigned char *p
        if type(data) is bytearray:  # the put path: no buffer acquisition
            n = len(<bytearray>data)
            p = self.check(pos, pos + n)
            copy_out(p + pos, <const unsigned char *>PyByteArray_AS_STRING(data), n)
            return
        v = data
        n = v.shape[0]
        p = self.check(pos, pos + n)
        if n:
            copy_out(p + pos, &v[0], n)

    def prefault(self, Py_ssize_t start, Py_ssize_t end, Py_ssize_t page=4096):
        """Touch every page for writing (no content change) so appends never take a page fault."""
        cdef unsigned char *p = self.check(start, end)
        cdef volatile unsigned char *vp = p
        cdef Py_ssize_t i = start
        with nogil:
            while i < end:
                vp[i] = vp[i]
                i += page

    def msync(self, Py_ssize_t start, Py_ssize_t end):
        """msync(MS_SYNC) the pages covering [start, end) without holding the GIL (CPython's
        mmap.flush keeps it, which would stall every writer during a group commit)."""
        cdef unsigned char *p = self.check(start, end)
        cdef Py_ssize_t a = start - start % 4096
        cdef int rc
        if end <= start:
            return
        with nogil:
            rc = msync(p + a, end - a, MS_SYNC)
        if rc != 0:
            raise OSError(errno, f"msync of bytes {a}..{end} failed")

    def zero_range(self, Py_ssize_t start, Py_ssize_t end):
        """Zero [start, end), skipping 4 KiB chunks already zero (a sparse tail stays sparse)."""
        cdef unsigned char *p = self.check(start, end)
        cdef Py_ssize_t i = start, chunk_end, j
        cdef bint dirty
        with nogil:
            while i < end:
                chunk_end = (i // 4096 + 1) * 4096
                if chunk_end > end:
                    chunk_end = end
                dirty = False
                j = i
                while j + 8 <= chunk_end:
                    if rmq_ldu64(p + j) != 0:
                        dirty = True
                        break
                    j += 8
                if not dirty:
                    while j < chunk_end:
                        if p[j] != 0:
                            dirty = True
                            break
                        j += 1
                if dirty:
                    memset(p + i, 0, chunk_end - i)
                i = chunk_end

    def copy_in(self, Py_ssize_t pos, data):
        """Plain memcpy of `data` at `pos` (the benchmark baseline for append)."""
        cdef const unsigned char[::1] v = data
        cdef Py_ssize_t n = v.shape[0]
        cdef unsigned char *p = self.check(pos, pos + n)
        with nogil:
            memcpy(p + pos, &v[0], n)
