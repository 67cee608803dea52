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

The store's index builder hashes records into a `KeyRun` (C arrays: offset, store time and key
hashes per record) - from its queue of single puts (`collect_items`) or straight from a batch's
commit-log span (`collect_span`) - and `IndexMap.put_run` writes a run with the GIL released, so
no Python object is made per record or per key.
"""
cimport cython
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_WRITABLE, PyBUF_SIMPLE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.errno cimport errno
from libc.string cimport memchr, memcmp
from posix.mman cimport MS_SYNC, msync

DEF HEADER_SIZE = 40
DEF SLOT_SIZE = 4
DEF ENTRY_SIZE = 20
DEF I32_MAX = 0x7FFFFFFF
# Records or keys from which a pass gives the GIL up (~20-40 us of work): handing the GIL over and
# getting it back can cost more than a few records' work, up to the interpreter's switch interval
# when the event loop is busy, so short passes keep it.
DEF NOGIL_MIN_WORK = 256


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


from java_hash cimport abs_index_hash, java_hash_str


def index_key_hash(str key):
    """abs(Java String.hashCode(key)) over UTF-16 code units; abs(MIN_VALUE) -> 0."""
    return abs_index_hash(java_hash_str(0, key))


def topic_prefix_hash(str topic):
    """Java String.hashCode of `topic + "#"` (not made absolute): the seed every key hash of the
    topic continues from, so `topic#key` is never built as a string."""
    return java_hash_str(0, topic + "#")


@cython.final
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

    def sync(self):
        """msync(MS_SYNC) the whole file without holding the GIL (CPython's mmap.flush holds it
        for the whole msync - a stall of the broker's event loop at every index flush)."""
        if not self.held:
            raise ValueError("index file is closed")
        cdef int rc
        cdef size_t n = <size_t>self.view.len
        with nogil:
            rc = msync(self.base, n, MS_SYNC)
        if rc != 0:
            raise OSError(errno, f"msync of an index file ({n} bytes) failed")

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
        return self._put(key_hash, phy_offset, store_timestamp)

    cdef bint _put(self, int32_t key_hash, int64_t phy_offset, int64_t store_timestamp) noexcept nogil:
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
                self._put(<int32_t>hashes[k], offset, ts)
            if nk:
                indexed = offset
            i += 1
        return i, indexed

    def put_run(self, KeyRun run not None, Py_ssize_t start, int64_t indexed):
        """put_hashed over a KeyRun, with the GIL released for a run of NOGIL_MIN_WORK keys or more:
        the loop touches only the mapping and the run's arrays (IndexService holds its lock, so
        no query or release runs meanwhile).  Same stops and result as put_hashed."""
        if not self.held:
            raise ValueError("index file is closed")
        cdef Py_ssize_t i
        if run.nkeys >= NOGIL_MIN_WORK:
            with nogil:
                i = self._put_records(run.offsets, run.timestamps, run.key_end, run.hashes, start, run.n, &indexed)
        else:
            i = self._put_records(run.offsets, run.timestamps, run.key_end, run.hashes, start, run.n, &indexed)
        return i, indexed

    cdef Py_ssize_t _put_records(self, const int64_t *offsets, const int64_t *timestamps, const Py_ssize_t *key_end,
                                 const int32_t *hashes, Py_ssize_t i, Py_ssize_t n, int64_t *indexed) noexcept nogil:
        # put_run's loop over a KeyRun's arrays
        cdef Py_ssize_t k, k0, k1
        cdef int64_t offset, ts
        while i < n:
            offset = offsets[i]
            if offset < indexed[0]:
                i += 1
                continue
            if offset == indexed[0]:
                break
            k0 = key_end[i - 1] if i > 0 else 0
            k1 = key_end[i]
            if <Py_ssize_t>self._count() + (k1 - k0) > self.index_num:
                break
            ts = timestamps[i]
            for k in range(k0, k1):
                self._put(hashes[k], offset, ts)
            if k1 > k0:
                indexed[0] = offset
            i += 1
        return i


# --- hashing records' keys into a KeyRun ---------------------------------------------------------

from record_layout cimport (BORN_HOST_AT, SYS_FLAG_AT, TRANSACTION_MASK as TX_MASK,
                            TRANSACTION_PREPARED_TYPE as TX_PREPARED, TRANSACTION_ROLLBACK_TYPE as TX_ROLLBACK,
                            body_length_at, store_timestamp_at)


@cython.final
cdef class KeyRun:
    """Records ready for the index, in commit-log order: record i has offset `offsets[i]`, store
    time `timestamps[i]` and the key hashes `hashes[key_end[i-1]:key_end[i]]`.  Records without a
    key are not kept (their time still counts in `last_timestamp`: the store time of the newest
    record taken, kept or not, 0 after clear()).  Indexing and iterating give
    (offset, timestamp, [hashes]) tuples, the form IndexService.build_hashed also takes."""

    cdef int64_t *offsets
    cdef int64_t *timestamps
    cdef Py_ssize_t *key_end
    cdef int32_t *hashes
    cdef Py_ssize_t n, cap, nkeys, kcap
    cdef public int64_t last_timestamp

    def __cinit__(self):
        self.n = self.cap = self.nkeys = self.kcap = 0
        self.last_timestamp = 0

    def __dealloc__(self):
        free(self.offsets)
        free(self.timestamps)
        free(self.key_end)
        free(self.hashes)

    def clear(self):
        """Forget every record (the arrays are kept for the next run)."""
        self.n = self.nkeys = 0
        self.last_timestamp = 0

    def __len__(self):
        return self.n

    @property
    def key_count(self):
        return self.nkeys

    def __getitem__(self, Py_ssize_t i):
        if i < 0:
            i += self.n
        if i < 0 or i >= self.n:
            raise IndexError(f"record {i} out of a run of {self.n}")
        cdef Py_ssize_t k0 = self.key_end[i - 1] if i > 0 else 0
        return (self.offsets[i], self.timestamps[i], [self.hashes[k] for k in range(k0, self.key_end[i])])

    def __iter__(self):
        cdef Py_ssize_t i
        for i in range(self.n):
            yield self[i]

    cdef int _room(self, Py_ssize_t keys) noexcept nogil:
        """Make room for one more record with up to `keys` keys; -1 when memory ran out."""
        cdef void *p
        cdef Py_ssize_t cap
        if self.n >= self.cap:
            cap = self.cap * 2 if self.cap else 256
            p = realloc(self.offsets, cap * sizeof(int64_t))
            if p == NULL:
                return -1
            self.offsets = <int64_t *>p
            p = realloc(self.timestamps, cap * sizeof(int64_t))
            if p == NULL:
                return -1
            self.timestamps = <int64_t *>p
            p = realloc(self.key_end, cap * sizeof(Py_ssize_t))
            if p == NULL:
                return -1
            self.key_end = <Py_ssize_t *>p
            self.cap = cap
        if self.nkeys + keys > self.kcap:
            cap = self.kcap * 2 if self.kcap else 1024
            while cap < self.nkeys + keys:
                cap *= 2
            p = realloc(self.hashes, cap * sizeof(int32_t))
            if p == NULL:
                return -1
            self.hashes = <int32_t *>p
            self.kcap = cap
        return 0

    cdef int add_record(self, uint32_t seed, int64_t offset, int64_t ts, int32_t sys_flag,
                        const uint8_t *props, Py_ssize_t n) noexcept nogil:
        """Hash one record's keys, as IndexService.build_index finds them in its properties: the
        UNIQ_KEY, then each non-empty space-separated word of KEYS, each as `topic#key` (`seed`
        is the hash of "topic#").  The last value of a repeated property wins, and a pair without
        \x01 is dropped, as in string_to_properties.  Returns 0 when taken, 1 when a key is not
        plain ASCII (the caller decodes it in Python, so invalid UTF-8 is replaced exactly as the
        Python decoder does; nothing is taken), -1 when memory ran out."""
        cdef Py_ssize_t i = 0, j, k, a, e, us = -1, ul = 0, ks = -1, kl = 0
        cdef const uint8_t *hit
        cdef uint32_t h
        cdef uint8_t c, seen = 0
        if (sys_flag & TX_MASK) == TX_PREPARED or (sys_flag & TX_MASK) == TX_ROLLBACK:
            self.last_timestamp = ts  # never indexed, but seen
            return 0
        # every "name\x01value\x02" pair (memchr: the pairs are found with the C library's wide
        # scans instead of a byte loop)
        while i < n:
            hit = <const uint8_t *>memchr(props + i, 2, n - i)
            k = hit - props if hit != NULL else n
            hit = <const uint8_t *>memchr(props + i, 1, k - i)
            if hit != NULL:
                j = hit - props
                if j - i == 8 and memcmp(props + i, b"UNIQ_KEY", 8) == 0:
                    us, ul = j + 1, k - (j + 1)
                elif j - i == 4 and memcmp(props + i, b"KEYS", 4) == 0:
                    ks, kl = j + 1, k - (j + 1)
            i = k + 1
        if ul <= 0 and kl <= 0:
            self.last_timestamp = ts
            return 0
        # at most one key per two bytes of KEYS (a word and its space)
        if self._room(1 + (kl + 1) // 2) < 0:
            return -1
        # hash (an ASCII byte is one UTF-16 code unit of the same value) while checking for
        # non-ASCII bytes (seen collects every byte's high bit); the hashes are committed only
        # when the record is taken
        k = self.nkeys
        if ul > 0:
            h = seed
            for j in range(us, us + ul):
                c = props[j]
                seen |= c
                h = h * 31 + c
            self.hashes[k] = abs_index_hash(h)
            k += 1
        if kl > 0:
            a, e, h = ks, ks + kl, seed
            for j in range(ks, e):
                c = props[j]
                seen |= c
                if c == 32:
                    if j > a:
                        self.hashes[k] = abs_index_hash(h)
                        k += 1
                    a, h = j + 1, seed
                else:
                    h = h * 31 + c
            if e > a:
                self.hashes[k] = abs_index_hash(h)
                k += 1
        if seen & 0x80:
            return 1
        self.last_timestamp = ts
        if k == self.nkeys:
            return 0  # KEYS of spaces only
        self.offsets[self.n] = offset
        self.timestamps[self.n] = ts
        self.key_end[self.n] = k
        self.nkeys = k
        self.n += 1
        return 0


    cdef Py_ssize_t parse_span(self, const uint8_t *s, Py_ssize_t n, const uint8_t *e, Py_ssize_t i, Py_ssize_t stop,
                               uint32_t seed, Py_ssize_t *pos_io, int *rc) noexcept nogil:
        """collect_span's loop: records of entries e[i:stop] from s[pos_io[0]:] on (docs/protocol.md
        §5 layout); returns the entry reached, its position in pos_io."""
        cdef Py_ssize_t pos = pos_io[0], p, end, size, props_len
        cdef int64_t ts
        cdef int32_t sys_flag
        while i < stop:
            size = rd32(e + i * ENTRY_SIZE + 8)
            end = pos + size
            if size <= 0 or end > n or BORN_HOST_AT > size:
                break
            sys_flag = rd32(s + pos + SYS_FLAG_AT)
            p = pos + store_timestamp_at(sys_flag)
            if p + 8 > end:
                break
            ts = rd64(s + p)
            p = pos + body_length_at(sys_flag)
            if p + 4 > end:
                break
            p += 4 + <Py_ssize_t>rd32(s + p)  # body
            if p < pos or p + 1 > end:
                break
            p += 1 + s[p]  # topic
            if p + 2 > end:
                break
            props_len = <Py_ssize_t>(<int32_t>(<int16_t>((<uint32_t>s[p] << 8) | s[p + 1])))
            p += 2
            if props_len < 0 or p + props_len > end:
                break
            rc[0] = self.add_record(seed, rd64(e + i * ENTRY_SIZE), ts, sys_flag, s + p, props_len)
            if rc[0] != 0:
                break
            pos = end
            i += 1
        pos_io[0] = pos
        return i


def collect_items(q, Py_ssize_t limit, dict seeds, KeyRun run not None):
    """Pop up to `limit` single-record index items (topic, commit-log offset, store timestamp,
    sys flag, properties bytes) from the left of deque `q` and hash their keys into `run`.
    Stops at an item it cannot take - a batch item, keys that are not plain ASCII - and returns
    that one (popped); None when it stopped for the limit or an empty queue.  `seeds` caches
    topic_prefix_hash per topic.  Prepared / rollback records are never indexed."""
    cdef PyObject *seed_o
    cdef object obj, topic, props
    cdef uint32_t seed
    cdef int rc
    cdef Py_ssize_t taken = 0
    popleft = q.popleft
    while taken < limit and q:
        obj = popleft()
        if type(obj) is not tuple or PyTuple_GET_SIZE(obj) != 5:
            return obj
        topic = <object>PyTuple_GET_ITEM(obj, 0)
        props = <object>PyTuple_GET_ITEM(obj, 4)
        if type(topic) is not str or type(props) is not bytes:
            return obj
        seed_o = PyDict_GetItem(seeds, topic)
        if seed_o == NULL:
            seed = java_hash_str(0, <str>topic + "#")
            seeds[topic] = seed
        else:
            seed = <object>seed_o
        rc = run.add_record(seed, <object>PyTuple_GET_ITEM(obj, 1), <object>PyTuple_GET_ITEM(obj, 2),
                            <object>PyTuple_GET_ITEM(obj, 3), <const uint8_t *>PyBytes_AS_STRING(props),
                            PyBytes_GET_SIZE(props))
        if rc < 0:
            raise MemoryError()
        if rc > 0:
            return obj
        taken += 1
    return None


def adjacent_entries(const uint8_t[::1] entries, Py_ssize_t start, Py_ssize_t count):
    """From consume-queue entry `start` (20 bytes each: offset i64, size i32, tag code i64), the
    run of entries whose records lie back to back in the commit log: (end entry, first record's
    offset, total size)."""
    if start < 0 or count > entries.shape[0] // ENTRY_SIZE or start >= count:
        raise ValueError(f"entries {start}..{count} outside a buffer of {entries.shape[0]} bytes")
    cdef const uint8_t *e = &entries[0]
    cdef int64_t first = rd64(e + start * ENTRY_SIZE)
    cdef int64_t end = first + rd32(e + start * ENTRY_SIZE + 8)
    cdef Py_ssize_t j = start + 1
    while j < count and rd64(e + j * ENTRY_SIZE) == end:
        end += rd32(e + j * ENTRY_SIZE + 8)
        j += 1
    return j, first, end - first


def collect_span(KeyRun run not None, const uint8_t[::1] span, const uint8_t[::1] entries, Py_ssize_t start,
                 Py_ssize_t stop, uint32_t seed, Py_ssize_t pos=0):
    """Hash into `run` the keys of the records of consume-queue entries [start, stop), which lie
    back to back in `span` (a copy of the commit log; entry `start`'s record at span[pos:]),
    with the GIL released for NOGIL_MIN_WORK records or more.  Stops at a record it cannot take
    (a key that is not plain ASCII, or fields that do not fit the record) for the caller's
    general path.  Returns (entry index reached, its record's position in span)."""
    if start < 0 or stop > entries.shape[0] // ENTRY_SIZE or start > stop:
        raise ValueError(f"entries {start}..{stop} outside a buffer of {entries.shape[0]} bytes")
    cdef Py_ssize_t i = start, n = span.shape[0]
    if pos < 0 or pos > n:
        raise ValueError(f"span position {pos} outside a span of {n} bytes")
    cdef const uint8_t *s = &span[0] if n > 0 else NULL
    cdef const uint8_t *e = &entries[0] if stop > start else NULL
    cdef int rc = 0
    if stop - start >= NOGIL_MIN_WORK:
        with nogil:
            i = run.parse_span(s, n, e, start, stop, seed, &pos, &rc)
    else:
        i = run.parse_span(s, n, e, start, stop, seed, &pos, &rc)
    if rc < 0:
        raise MemoryError()
    return i, pos

