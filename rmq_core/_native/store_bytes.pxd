# Declarations shared by the store's native modules (mapped, cq, commit_log): the byte helpers of
# store_bytes.h, the consume-queue entry size, and the copy every write into a mapped file uses; also the
# C-API and libc names they all work with (`from store_bytes cimport *` brings the lot, listed once).
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_FromStringAndSize, PyByteArray_Resize
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memset

cdef extern from "store_bytes.h":
    uint32_t rmq_ld32(const unsigned char *p) nogil
    uint64_t rmq_ld64(const unsigned char *p) nogil
    uint16_t rmq_ld16(const unsigned char *p) nogil
    void rmq_st32(unsigned char *p, uint32_t v) nogil
    void rmq_st64(unsigned char *p, uint64_t v) nogil
    void rmq_st16(unsigned char *p, uint16_t v) nogil
    uint64_t rmq_bswap64(uint64_t v) nogil
    uint64_t rmq_ldu64(const unsigned char *p) nogil
    Py_ssize_t rmq_cq_count1(const unsigned char *p, Py_ssize_t pos, Py_ssize_t end, uint64_t code) nogil
    Py_ssize_t rmq_cq_next1(const unsigned char *p, Py_ssize_t pos, Py_ssize_t end, uint64_t code) nogil

cdef extern from "store_batch.h" nogil:
    void rmq_stream_copy(unsigned char *d, const unsigned char *s, size_t n)

# (the commit-log record's constants are record_layout.pxd's)
cdef enum:
    CQ_UNIT = 20            # a consume-queue entry: i64 commit-log offset | i32 size | i64 tags code
    STREAM_MIN = 65536


cdef inline void copy_out(unsigned char *d, const unsigned char *s, Py_ssize_t n) noexcept nogil:
    # a large write (a batch's consume-queue entries) lands on fresh lines: streaming stores skip
    # reading them first; a small one is cheaper as a plain copy that stays in cache for readers
    if n >= STREAM_MIN:
        rmq_stream_copy(d, s, n)
    elif n > 0:
        memcpy(d, s, n)
