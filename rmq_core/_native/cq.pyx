# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Consume-queue kernels: recovery of a consume-queue file's valid end, searches by commit-log
offset, the tag / bloom-filtered scan of a pull, and the gathering of the matched records from a
commit-log segment into a pull body.

Consume-queue entry (20 bytes, big-endian): i64 commit-log offset | i32 size | i64 tags code.
Every function takes NativeMap views (mapped.pxd) and plain values; it creates no Python object
per entry scanned or skipped.
"""
cimport cython
from rmq_core._native.mapped cimport NativeMap
from store_bytes cimport *  # the store's byte helpers, constants and common C names

CQ_STORE_UNIT_SIZE = CQ_UNIT


def cq_valid_end(NativeMap m, Py_ssize_t start=0):
    """Byte position after the last valid entry (commit-log offset >= 0 and size > 0), scanning from
    `start` (RocketMQ's ConsumeQueue.recover rule)."""
    cdef unsigned char *p = m.check(start, m.size)
    cdef Py_ssize_t pos = start - start % CQ_UNIT, end = m.size - m.size % CQ_UNIT
    with nogil:
        while pos + CQ_UNIT <= end:
            if <int64_t>rmq_ld64(p + pos) < 0 or <int32_t>rmq_ld32(p + pos + 8) <= 0:
                break
            pos += CQ_UNIT
    return pos


def cq_first_at_or_above(NativeMap m, Py_ssize_t start, Py_ssize_t end, int64_t phys):
    """Position of the first entry in [start, end) whose commit-log offset >= phys (or end)."""
    cdef unsigned char *p = m.check(start, end)
    cdef Py_ssize_t pos = start
    with nogil:
        while pos + CQ_UNIT <= end:
            if <int64_t>rmq_ld64(p + pos) >= phys:
                break
            pos += CQ_UNIT
    return pos


def cq_first_phys_at_or_above(NativeMap m, Py_ssize_t start, Py_ssize_t end, int64_t phys):
    """Binary search (entries are ordered by commit-log offset): first entry with offset >= phys."""
    cdef unsigned char *p = m.check(start, end)
    cdef Py_ssize_t lo = start // CQ_UNIT, hi = end // CQ_UNIT, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if <int64_t>rmq_ld64(p + mid * CQ_UNIT) < phys:
            lo = mid + 1
        else:
            hi = mid
    return lo * CQ_UNIT


def cq_entry(NativeMap m, Py_ssize_t pos):
    """(commit-log offset, size, tags code) of the entry at byte pos."""
    cdef unsigned char *p = m.check(pos, pos + CQ_UNIT)
    return <int64_t>rmq_ld64(p + pos), <int32_t>rmq_ld32(p + pos + 8), <int64_t>rmq_ld64(p + pos + 12)


cdef class TagFilter:
    """Tag hash codes prepared for the native scan: big-endian images, sorted for bsearch."""
    cdef uint64_t *codes
    cdef Py_ssize_t n
    cdef bytes store

    def __cinit__(self, codes):
        vals = sorted({rmq_bswap64(<uint64_t><int64_t>c) for c in codes})
        import array
        self.store = array.array("Q", vals).tobytes()
        self.codes = <uint64_t *><char *>self.store
        self.n = len(vals)

    @property
    def size(self):
        return self.n


cdef inline bint tag_match(uint64_t be_code, const uint64_t *codes, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t lo, hi, mid, i
    if n <= 8:
        for i in range(n):
            if codes[i] == be_code:
                return True
        return False
    lo = 0
    hi = n
    while lo < hi:
        mid = (lo + hi) >> 1
        if codes[mid] < be_code:
            lo = mid + 1
        elif codes[mid] > be_code:
            hi = mid
        else:
            return True
    return False


cdef class BloomTest:
    """A filter's bloom test prepared for the scan (the `MessageFilter` contract): an entry whose
    ext unit holds a bit map — of `bit_num` bits unless that is 0 — stored after `born_time`
    (unless that is -1) must have every bit set to stay a candidate."""
    cdef int32_t *bits
    cdef Py_ssize_t n
    cdef readonly Py_ssize_t bit_num
    cdef readonly int64_t born_time
    cdef bytes store

    def __cinit__(self, bits, Py_ssize_t bit_num=0, int64_t born_time=-1):
        import array
        self.store = array.array("i", [int(b) for b in bits]).tobytes()
        self.bits = <int32_t *><char *>self.store
        self.n = len(self.store) // 4
        self.bit_num = bit_num
        self.born_time = born_time
        for i in range(self.n):
            if self.bits[i] < 0 or (bit_num and self.bits[i] >= bit_num):
                raise ValueError(f"bloom bit {self.bits[i]} outside a {bit_num}-bit map")


cdef inline bint bloom_reject(const unsigned char *unit, BloomTest bloom) noexcept nogil:
    """True when the entry's bit map proves the filter cannot match (RocketMQ's bloom prefilter)."""
    cdef int64_t ts = <int64_t>rmq_ld64(unit)
    cdef Py_ssize_t blen = rmq_ld16(unit + 8), i
    cdef int32_t b
    if blen <= 0:
        return False  # no map: a candidate
    if bloom.bit_num and blen * 8 != bloom.bit_num:
        return False  # a map of another bloom configuration
    if bloom.born_time >= 0 and ts <= bloom.born_time:
        return False  # computed before the subscription was registered
    for i in range(bloom.n):
        b = bloom.bits[i]
        if (b >> 3) >= blen or not (unit[10 + (b >> 3)] & (1 << (b & 7))):
            return True
    return False


cdef inline void emit_match(unsigned char *o, int64_t phys, int32_t size, int32_t index) noexcept nogil:
    # one cq_scan match: native int64 commit-log offset, int32 size, int32 entry index
    memcpy(o, &phys, 8)
    memcpy(o + 8, &size, 4)
    memcpy(o + 12, &index, 4)


def cq_scan(NativeMap m, Py_ssize_t start, Py_ssize_t end, TagFilter tags, Py_ssize_t max_count,
            Py_ssize_t max_bytes, int64_t min_phys, bytearray out, NativeMap ext=None, Py_ssize_t ext_pos=0,
            Py_ssize_t ext_unit=0, BloomTest bloom=None):
    """Scan entries in [start, end) of one consume-queue file.

    An entry matches when its tag code is in `tags` (None: every entry).  Entries whose commit-log
    offset is below `min_phys` (already deleted from the log) are skipped and counted.  Stops after
    `max_count` matches, or before a match that would take the total size over `max_bytes`
    (the first match is always taken), or at `end`.  Matches are written to `out` as native
    (int64 commit-log offset, int32 size, int32 entry index relative to start), 16 bytes each.
    With `ext` (the paired consume-queue ext file, unit of entry `start` at ext_pos, `ext_unit`
    bytes per entry) and `bloom`, tag candidates are also tested against their bit map.
    Returns (matches, scanned_end_pos, skipped_removed)."""
    cdef unsigned char *p = m.check(start, end)
    cdef unsigned char *xp = NULL
    if ext is not None and bloom is not None:
        xp = ext.check(ext_pos, ext_pos + ((end - start) // CQ_UNIT) * ext_unit)
    if max_count < 1:  # the first match is always written: a zero-length `out` would overflow
        raise ValueError(f"max_count must be at least 1, got {max_count}")
    if len(out) < max_count * 16:
        raise ValueError(f"output buffer of {len(out)} bytes too small for {max_count} matches")
    cdef unsigned char *o = <unsigned char *>PyByteArray_AS_STRING(out)
    cdef const uint64_t *codes = NULL
    cdef Py_ssize_t ncodes = -1
    if tags is not None:
        codes = tags.codes
        ncodes = tags.n
    cdef Py_ssize_t pos = start, found = 0, total = 0, removed = 0
    cdef int64_t phys
    cdef int32_t size
    cdef uint64_t code = 0
    if ncodes == 1:
        code = codes[0]
    with nogil:
        while True:
            # the next candidate: for the common pull (one tag) the native kernel skips to it
            if ncodes == 1:
                pos = rmq_cq_next1(p, pos, end, code)
            else:
                while pos + CQ_UNIT <= end and not (ncodes < 0 or tag_match(rmq_ldu64(p + pos + 12), codes, ncodes)):
                    pos += CQ_UNIT
            if pos + CQ_UNIT > end:
                break
            phys = <int64_t>rmq_ld64(p + pos)
            if phys < min_phys:
                removed += 1
                pos += CQ_UNIT
                continue
            if xp != NULL and bloom_reject(xp + ext_pos + ((pos - start) // CQ_UNIT) * ext_unit, bloom):
                pos += CQ_UNIT
                continue
            size = <int32_t>rmq_ld32(p + pos + 8)
            if found and (found >= max_count or total + size > max_bytes):
                break
            emit_match(o + found * 16, phys, size, <int32_t>((pos - start) // CQ_UNIT))
            total += size
            found += 1
            pos += CQ_UNIT
    return found, pos, removed


def cq_count_matches(NativeMap m, Py_ssize_t start, Py_ssize_t end, TagFilter tags):
    """Count entries in [start, end) whose tag code is in `tags` (a full-speed scan; no limits)."""
    cdef unsigned char *p = m.check(start, end)
    cdef Py_ssize_t pos = start, found = 0
    cdef const uint64_t *codes = tags.codes
    cdef Py_ssize_t ncodes = tags.n
    cdef uint64_t code = 0
    with nogil:
        if ncodes == 1:
            found = rmq_cq_count1(p, pos, end, codes[0])
        else:
            while pos + CQ_UNIT <= end:
                found += tag_match(rmq_ldu64(p + pos + 12), codes, ncodes)
                pos += CQ_UNIT
    return found


def segment_runs(bytearray matches, Py_ssize_t start, Py_ssize_t n, NativeMap seg, int64_t seg_from,
                 Py_ssize_t seg_limit):
    """Where the records of matches[start:n] (as written by cq_scan) lie in one commit-log
    segment, stopping at the first match outside [seg_from, seg_from + seg_limit): runs of
    adjacent records (a batch-sent queue's records are back to back in the log) as a flat list
    [from, to, from, to, ...] of positions in the segment - the pull response body is these
    byte ranges of the mapped file, sent as they are (nothing copied).  Returns (runs, matches
    consumed); ValueError when the segment's mapping is gone."""
    cdef const unsigned char *m = <const unsigned char *>PyByteArray_AS_STRING(matches)
    if len(matches) < n * 16:
        raise ValueError("matches buffer shorter than n")
    seg.check(0, seg_limit)
    cdef Py_ssize_t i = start
    cdef int64_t phys, run_from = -1, run_to = -1
    cdef int32_t size
    runs = []
    while i < n:
        memcpy(&phys, m + i * 16, 8)
        memcpy(&size, m + i * 16 + 8, 4)
        if phys < seg_from or phys - seg_from + size > seg_limit or size <= 0:
            break
        phys -= seg_from
        if phys != run_to:
            if run_to >= 0:
                runs.append(run_from)
                runs.append(run_to)
            run_from = phys
        run_to = phys + size
        i += 1
    if run_to >= 0:
        runs.append(run_from)
        runs.append(run_to)
    return runs, i - start


def copy_runs(NativeMap seg, list runs):
    """The bytes of runs [from, to, from, to, ...] of one segment (segment_runs), back to back in
    one bytes object: a pull whose matches are scattered (a sparse tag) is cheaper copied than sent
    as one view per record."""
    cdef Py_ssize_t k, total = 0, a, b
    cdef unsigned char *p = seg.check(0, seg.size)
    for k in range(0, len(runs), 2):
        a = runs[k]
        b = runs[k + 1]
        if a < 0 or b < a or b > seg.size:
            raise ValueError(f"run {a}..{b} outside the segment's {seg.size} bytes")
        total += b - a
    body = PyBytes_FromStringAndSize(NULL, total)
    cdef unsigned char *o = <unsigned char *><char *>(<bytes>body)
    for k in range(0, len(runs), 2):
        a = runs[k]
        b = runs[k + 1]
        memcpy(o, p + a, b - a)
        o += b - a
    return body


def match_queue_offsets(bytearray matches, Py_ssize_t start, Py_ssize_t end, int64_t queue_offset_base):
    """The queue offsets of matches[start:end] (as written by cq_scan): base + each entry index."""
    cdef const unsigned char *m = <const unsigned char *>PyByteArray_AS_STRING(matches)
    if start < 0 or end < start or len(matches) < end * 16:
        raise ValueError(f"match range {start}..{end} outside the matches buffer")
    cdef Py_ssize_t k
    cdef int32_t idx
    out = []
    for k in range(start, end):
        memcpy(&idx, m + k * 16 + 12, 4)
        out.append(queue_offset_base + idx)
    return out
