# NativeMap, the raw pointer into one mapped file that the store's kernels (cq, commit_log) read
# and write through; declared here so they can take it as a typed argument.

cdef class NativeMap:
    cdef Py_buffer view
    cdef unsigned char *ptr
    cdef readonly Py_ssize_t size
    cdef bint held

    cdef inline unsigned char *check(self, Py_ssize_t start, Py_ssize_t end) except NULL:
        if self.ptr == NULL:
            raise ValueError("mapped file is closed")
        if start < 0 or end > self.size or start > end:
            raise ValueError(f"range {start}..{end} outside mapped file of {self.size} bytes")
        return self.ptr
