# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Native twin of the IndexFile put/select paths (rmq_core/store/index.py has the pure-Python
reference and the full layout description; tests run both).

IndexFile layout (RocketMQ's, big-endian):

    header   40 bytes  beginTimestamp i64, endTimestamp i64, beginPhyOffset i64, endPhyOffset i64,
                       hashSlotCount i32, indexCount i32 (starts at 1; entry 0 is "none")
    slots    hashSlotNum × i32: newest entry of the slot
    entries  indexNum × 20 bytes: keyHash i32, phyOffset i64, timeDiff i32 (s), prevIndex i32

`IndexMap` takes one buffer view of the file's mmap when the file is opened and releases it in
`release()` (before the mmap is closed), so a put or a chain walk costs no buffer acquisition and
creates no Python object per entry walked.
"""
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_WRITABLE, PyBUF_SIMPLE
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t

DEF HEADER_SIZE = 40
DEF SLOT_SIZE = 4
DEF ENTRY_SIZE = 20
DEF I32_MAX = 0x7FFFFFFF


cdef inline int32_t rd32(const uint8_t *p) noexcept nogil:
    return <int32_t>((<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3])


cdef inline int64_t rd64(const uint8_t *p) noexcept nogil:
    return <int64_t>((<uint64_t><uint32_t>rd32(p) << 32) | <uint64_t><uint32_t>rd32(p + 4))


cdef inline void wr32(uint8_t *p, int32_t v) noexcept nogil:
    cdef uint32_t u = <uint32_t>v
    p[0] = <uint8_t>(u >> 24)
    p[1] = <uint8_t>(u >> 16)
    p[2] = <uint8_t>(u >> 8)
    p[3] = <uint8_t>u


cdef inline void wr64(uint8_t *p, int64_t v) noexcept nogil:
    wr32(p, <int32_t>(<uint64_t>v >> 32))
    wr32(p + 4, <int32_t><uint32_t>(<uint64_t>v))


def index_key_hash(str key):
    """abs(Java String.hashCode(key)) over UTF-16 code units; abs(MIN_VALUE) -> 0."""
    cdef uint32_t h = 0
    cdef Py_UCS4 ch
    cdef uint32_t c
    for ch in key:
        c = <uint32_t>ch
        if c > 0xFFFF:  # a supplementary character is two UTF-16 code units in Java
            c -= 0x10000
            h = 31 * h + (0xD800 + (c >> 10))
            h = 31 * h + (0xDC00 + (c & 0x3FF))
        else:
            h = 31 * h + c
    cdef int32_t s = <int32_t>h
    if s == <int32_t>0x80000000:
        return 0
    return -s if s < 0 else s


cdef class IndexMap:
    """A held view of one index file's mmap plus its geometry."""

    cdef Py_buffer view
    cdef bint held
    cdef uint8_t *base
    cdef readonly int32_t hash_slot_num
    cdef readonly int32_t index_num
    cdef Py_ssize_t entries_at

    def __cinit__(self, object mm, int32_t hash_slot_num, int32_t index_num):
        self.held = False
        if hash_slot_num <= 0 or index_num <= 0:
            raise ValueError(f"bad index geometry: hashSlotNum={hash_slot_num}, indexNum={index_num}")
        PyObject_GetBuffer(mm, &self.view, PyBUF_WRITABLE | PyBUF_SIMPLE)
        self.held = True
        cdef Py_ssize_t need = HEADER_SIZE + <Py_ssize_t>hash_slot_num * SLOT_SIZE + <Py_ssize_t>index_num * ENTRY_SIZE
        if self.view.len < need:
            PyBuffer_Release(&self.view)
            self.held = False
            raise ValueError(f"index buffer is {self.view.len} bytes, need {need}")
        self.base = <uint8_t *>self.view.buf
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.entries_at = HEADER_SIZE + <Py_ssize_t>hash_slot_num * SLOT_SIZE

    def release(self):
        """Give the buffer back (must happen before the mmap is closed)."""
        if self.held:
            PyBuffer_Release(&self.view)
            self.held = False
            self.base = NULL

    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.view)

    cdef inline int32_t _count(self) noexcept nogil:
        cdef int32_t count = rd32(self.base + 36)
        return 1 if count <= 0 else count

    cdef inline int32_t _slot_head(self, Py_ssize_t slot_pos, int32_t count) noexcept nogil:
        cdef int32_t head = rd32(self.base + slot_pos)
        return 0 if (head <= 0 or head >= count) else head

    def put_key(self, int32_t key_hash, int64_t phy_offset, int64_t store_timestamp):
        """Append one entry (entry, then slot, then header: see index.py); False when full."""
        if not self.held:
            raise ValueError("index file is closed")
        cdef uint8_t *b = self.base
        cdef int32_t count = self._count()
        if count >= self.index_num:
            return False
        cdef Py_ssize_t slot_pos = HEADER_SIZE + <Py_ssize_t>(key_hash % self.hash_slot_num) * SLOT_SIZE
        cdef int32_t prev = self._slot_head(slot_pos, count)
        cdef int64_t begin_ts = rd64(b)
        if count <= 1:
            begin_ts = store_timestamp
            wr64(b, begin_ts)
            wr64(b + 16, phy_offset)
        cdef int64_t diff = 0
        if begin_ts > 0:
            diff = store_timestamp - begin_ts
            # floor division like Python's //, then clamp to [0, I32_MAX]
            diff = diff // 1000 if diff >= 0 else -((-diff + 999) // 1000)
            if diff < 0:
                diff = 0
            elif diff > I32_MAX:
                diff = I32_MAX
        cdef uint8_t *e = b + self.entries_at + <Py_ssize_t>count * ENTRY_SIZE
        wr32(e, key_hash)
        wr64(e + 4, phy_offset)
        wr32(e + 12, <int32_t>diff)
        wr32(e + 16, prev)
        wr32(b + slot_pos, count)
        wr64(b + 8, store_timestamp)
        wr64(b + 24, phy_offset)
        wr32(b + 32, rd32(b + 32) + 1)
        wr32(b + 36, count + 1)
        return True

    def select_phy_offsets(self, list out, set seen, int32_t key_hash, Py_ssize_t max_num, int64_t begin,
                           int64_t end):
        """Walk the key's chain newest first; append offsets whose hash and time match."""
        if not self.held:
            raise ValueError("index file is closed")
        cdef uint8_t *b = self.base
        cdef int32_t count = self._count()
        if count <= 1:
            return
        cdef int64_t begin_ts = rd64(b)
        cdef Py_ssize_t slot_pos = HEADER_SIZE + <Py_ssize_t>(key_hash % self.hash_slot_num) * SLOT_SIZE
        cdef int32_t index = self._slot_head(slot_pos, count)
        cdef const uint8_t *e
        cdef int32_t h, diff, prev
        cdef int64_t off, time_read
        while index > 0 and len(out) < max_num:
            e = b + self.entries_at + <Py_ssize_t>index * ENTRY_SIZE
            h = rd32(e)
            off = rd64(e + 4)
            diff = rd32(e + 12)
            prev = rd32(e + 16)
            if diff < 0:
                break
            time_read = begin_ts + <int64_t>diff * 1000
            if h == key_hash and begin <= time_read <= end:
                o = off
                if o not in seen:
                    seen.add(o)
                    out.append(o)
            if prev <= 0 or prev >= index or time_read < begin:
                break
            index = prev

    def put_hashed(self, list records, Py_ssize_t start, int64_t indexed):
        """Index records[start:], each (commit-log offset, store timestamp, key hashes) in log order,
        while this file has room for all of a record's keys; records below `indexed` (the newest
        indexed offset) are skipped.  Stops before a record at `indexed` itself (the caller checks
        which of its keys exist) and before one that does not fit (the caller rolls the file).
        Returns (next position in records, new indexed offset)."""
        if not self.held:
            raise ValueError("index file is closed")
        cdef Py_ssize_t i = start, n = len(records), k, nk
        cdef int64_t offset, ts
        cdef int32_t count
        cdef tuple rec
        cdef object hashes
        while i < n:
            rec = records[i]
            offset = rec[0]
            if offset < indexed:
                i += 1
                continue
            if offset == indexed:
                break
            ts = rec[1]
            hashes = rec[2]
            nk = len(hashes)
            count = self._count()
            if count + nk > self.index_num:
                break
            for k in range(nk):
                self.put_key(<int32_t>hashes[k], offset, ts)
            if nk:
                indexed = offset
            i += 1
        return i, indexed
