# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Commit-log kernels: appending records into a mapped segment or a file (encoded records, or a
batch body's items straight into the segment), the end-of-segment blank, append results, and the
single-message put end to end (SinglePutPath).  The record format itself (layout, encoders, the
property lookup, the recovery scan) is record.pyx's; the shared inline helpers come from record.pxd.

End of segment: BLANK record = i32 remaining bytes, i32 0xCBD43194 (at least 8 bytes left).

Consume-queue entry (written by the puts here, scanned by cq.pyx; 20 bytes, big-endian):
i64 commit-log offset | i32 size | i64 tags code.

All functions work on raw pointers held by `NativeMap` (mapped.pyx), so a call costs no per-call
buffer acquisition and creates no Python object per record scanned or skipped.
"""
cimport cython
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_WRITABLE, PyBUF_SIMPLE
from cpython.bytearray cimport PyByteArray_FromStringAndSize, PyByteArray_AS_STRING, PyByteArray_Resize
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset, memcmp

from rmq_core._native.group_commit cimport GroupCommitFutures, GroupCommitGate, RMQ_GC_OK, rmq_gc_await
from rmq_core._native.mapped cimport NativeMap
from store_bytes cimport (BORNHOST_V6, CQ_UNIT, MAX_PROPS, MAX_TOPIC, MIN_BLANK, STOREHOST_V6, copy_out,
                          rmq_bswap64, rmq_ld16, rmq_ld32, rmq_ld64, rmq_ldu64, rmq_st16, rmq_st32, rmq_st64)

cdef extern from "<sys/mman.h>" nogil:
    int msync(void *addr, size_t length, int flags)
    int MS_SYNC

from libc.errno cimport errno, EINTR

cdef extern from "<unistd.h>" nogil:
    ssize_t pwrite(int fd, const void *buf, size_t count, long offset)

from rmq_core._native.crc cimport crc32_update
from java_hash cimport java_hash_utf8
from rmq_core._native.record cimport (batch_template, encode_properties, rmq_batch_crc32, rmq_batch_encode,
                                      rmq_batch_tmpl, rmq_hash_fn, rmq_tag_cache, record_len,
                                      store_ts_pos, tags_code_of, write_record)


rmq_batch_crc32 = crc32_update  # the batch encoder (store_batch.h) uses the crc module's CRC-32


cdef uint32_t MAGIC = 0xDAA320A7u
cdef uint32_t BLANK_MAGIC = 0xCBD43194u

MESSAGE_MAGIC_CODE = MAGIC
BLANK_MAGIC_CODE = BLANK_MAGIC
END_FILE_MIN_BLANK_LENGTH = MIN_BLANK

def write_blank(NativeMap dst, Py_ssize_t pos):
    """The end-of-file blank record from pos to the end of the segment."""
    cdef unsigned char *p = dst.check(pos, pos + MIN_BLANK)
    rmq_st32(p + pos, <uint32_t>(dst.size - pos))
    rmq_st32(p + pos + 4, BLANK_MAGIC)


def encode_batch_into(NativeMap dst, Py_ssize_t dst_pos, Py_ssize_t dst_len, body, Py_ssize_t body_pos,
                      Py_ssize_t n_items, bytes topic, int32_t queue_id, int32_t sys_flag, int64_t born_ts,
                      bytes born_host, bytes store_host, int32_t reconsume_times, extra_properties,
                      int64_t file_from_offset, int64_t queue_offset, int64_t store_timestamp,
                      bytearray cq_out, Py_ssize_t cq_pos):
    """Encode `n_items` batch items (validated by `encode_batch(plan_only=True)`) from body[body_pos:]
    straight into the `dst_len` bytes reserved in the segment at dst_pos, with their final queue
    offsets, physical offsets and store timestamp, and write their consume-queue entries (tag code
    of each item's TAGS, else of the extra properties' TAGS) into cq_out[cq_pos:].  One pass over
    the bytes (store_batch.h: read the item, build the record, CRC the body, stream it out).
    Returns the next body position."""
    cdef const unsigned char[::1] src = body
    cdef const unsigned char[::1] ex = extra_properties
    cdef rmq_batch_tmpl t
    cdef rmq_tag_cache tc
    cdef size_t bp = body_pos, done
    if body_pos < 0 or body_pos > src.shape[0] or n_items < 0 or dst_len < 0:
        raise ValueError(f"body position {body_pos} / item count {n_items} / length {dst_len} out of range")
    if cq_pos < 0 or len(cq_out) < cq_pos + n_items * CQ_UNIT:
        raise ValueError("consume-queue buffer too small for the item count")
    cdef unsigned char *base = dst.check(dst_pos, dst_pos + dst_len)
    if n_items == 0:
        return body_pos
    batch_template(&t, topic, queue_id, sys_flag, born_ts, born_host, store_host, reconsume_times, ex,
                   store_timestamp)
    tc.props = NULL
    cdef const unsigned char *sp = &src[0]
    cdef unsigned char *cq = <unsigned char *>PyByteArray_AS_STRING(cq_out) + cq_pos
    with nogil:
        done = rmq_batch_encode(&t, sp, &bp, n_items, base + dst_pos, dst_len, file_from_offset + dst_pos,
                                queue_offset, cq, &tc, <rmq_hash_fn>java_hash_utf8)
    if <Py_ssize_t>done < n_items:
        raise ValueError(f"reserved space in the segment ends before item {done}")
    return bp


# --- append --------------------------------------------------------------------------------------
cdef inline Py_ssize_t fill_records(unsigned char *s, Py_ssize_t n, Py_ssize_t src_pos, Py_ssize_t count,
                                    Py_ssize_t write_pos, Py_ssize_t file_size, int64_t file_from_offset,
                                    int64_t queue_offset, int64_t store_timestamp, const int64_t *tags,
                                    unsigned char *cq, Py_ssize_t *pos_out, Py_ssize_t *sp_out,
                                    bint *eof) noexcept nogil:
    """Fill in the queue offset, physical offset and store timestamp of up to `count` encoded
    records at s[src_pos:] bound for write_pos, and write their consume-queue entries into `cq`;
    stops at a record that would not leave room for the blank (*eof) or a bad size.  Returns the
    records filled; *pos_out / *sp_out end where they end.  Both append routes (mapping and
    descriptor) copy what this filled."""
    cdef Py_ssize_t pos = write_pos, sp = src_pos, i = 0, size
    cdef unsigned char *d
    cdef int32_t sysf
    while i < count:
        size = <int32_t>rmq_ld32(s + sp)
        if size < 91 or sp + size > n:
            break
        if pos + size + MIN_BLANK > file_size:
            eof[0] = True
            break
        d = s + sp
        rmq_st64(d + 20, <uint64_t>(queue_offset + i))
        rmq_st64(d + 28, <uint64_t>(file_from_offset + pos))
        sysf = <int32_t>rmq_ld32(d + 36)
        rmq_st64(d + store_ts_pos(sysf), <uint64_t>store_timestamp)
        rmq_st64(cq, <uint64_t>(file_from_offset + pos))
        rmq_st32(cq + 8, <uint32_t>size)
        rmq_st64(cq + 12, <uint64_t>tags[i])
        cq += CQ_UNIT
        pos += size
        sp += size
        i += 1
    pos_out[0] = pos
    sp_out[0] = sp
    return i

def append_records(NativeMap dst, Py_ssize_t write_pos, bytearray src, Py_ssize_t src_pos, Py_ssize_t count,
                   int64_t file_from_offset, int64_t queue_offset, int64_t store_timestamp,
                   bytes tags, Py_ssize_t tag_index, bytearray cq_out, Py_ssize_t cq_pos):
    """Copy up to `count` encoded records from src[src_pos:] into the segment at write_pos, filling
    in each record's queue offset (consecutive from `queue_offset`), physical offset and store
    timestamp, and writing one 20-byte consume-queue entry per record into cq_out[cq_pos:].

    The fields are filled in `src` (the caller's private encode buffer, still warm in cache) and
    the records then go into the mapping with one large memcpy.  A record that does not fit (it
    must leave 8 bytes for the blank) stops the copy: the blank end-of-file record is written and
    the third result is True.  Returns (records written, bytes written, end_of_file)."""
    cdef unsigned char *base = dst.check(write_pos, dst.size)
    cdef Py_ssize_t file_size = dst.size
    cdef Py_ssize_t n = len(src)
    if count <= 0:
        return 0, 0, False
    if src_pos < 0 or src_pos >= n:
        raise ValueError(f"src_pos {src_pos} outside the {n} encoded bytes")
    if len(tags) < (tag_index + count) * 8 or len(cq_out) < cq_pos + count * CQ_UNIT:
        raise ValueError("tags / consume-queue buffers are too small for the record count")
    cdef unsigned char *s = <unsigned char *>PyByteArray_AS_STRING(src)
    cdef const int64_t *tg = <const int64_t *><char *>tags
    cdef unsigned char *cq = <unsigned char *>PyByteArray_AS_STRING(cq_out) + cq_pos
    cdef Py_ssize_t pos = write_pos, sp = src_pos, i = 0
    cdef bint eof = False
    with nogil:
        i = fill_records(s, n, src_pos, count, write_pos, file_size, file_from_offset, queue_offset,
                         store_timestamp, tg + tag_index, cq, &pos, &sp, &eof)
        if pos > write_pos:
            memcpy(base + write_pos, s + src_pos, pos - write_pos)
        if eof:
            rmq_st32(base + pos, <uint32_t>(file_size - pos))
            rmq_st32(base + pos + 4, BLANK_MAGIC)
    if not eof and i < count:
        raise ValueError(f"encoded record at byte {sp} has a bad size")
    return i, pos - write_pos, eof


cdef int pwrite_all(int fd, const unsigned char *p, Py_ssize_t n, Py_ssize_t off) noexcept nogil:
    cdef ssize_t w
    while n > 0:
        w = pwrite(fd, p, n, off)
        if w < 0:
            if errno == EINTR:
                continue
            return -1
        p += w
        n -= w
        off += w
    return 0


def append_records_fd(int fd, Py_ssize_t write_pos, Py_ssize_t file_size, bytearray src, Py_ssize_t src_pos,
                      Py_ssize_t count, int64_t file_from_offset, int64_t queue_offset, int64_t store_timestamp,
                      bytes tags, Py_ssize_t tag_index, bytearray cq_out, Py_ssize_t cq_pos):
    """`append_records` through the file descriptor instead of the mapping (RocketMQ's
    transient-store idea): the fields are filled in the caller's private encode buffer, then one
    pwrite puts the records into the page cache, where the segment's mapping sees them.  Used for
    SYNC_FLUSH: pages dirtied through write() are made durable by fdatasync without the
    page-fault / journal cost that msync of mmap-dirtied pages has on ext4."""
    cdef Py_ssize_t n = len(src)
    if count <= 0:
        return 0, 0, False
    if src_pos < 0 or src_pos >= n or write_pos < 0 or write_pos > file_size:
        raise ValueError(f"src_pos {src_pos} / write_pos {write_pos} out of range")
    if len(tags) < (tag_index + count) * 8 or len(cq_out) < cq_pos + count * CQ_UNIT:
        raise ValueError("tags / consume-queue buffers are too small for the record count")
    cdef unsigned char *s = <unsigned char *>PyByteArray_AS_STRING(src)
    cdef const int64_t *tg = <const int64_t *><char *>tags
    cdef unsigned char *cq = <unsigned char *>PyByteArray_AS_STRING(cq_out) + cq_pos
    cdef Py_ssize_t pos = write_pos, sp = src_pos, i = 0
    cdef bint eof = False
    cdef int rc = 0
    cdef unsigned char blank[8]
    with nogil:
        i = fill_records(s, n, src_pos, count, write_pos, file_size, file_from_offset, queue_offset,
                         store_timestamp, tg + tag_index, cq, &pos, &sp, &eof)
        if pos > write_pos:
            rc = pwrite_all(fd, s + src_pos, pos - write_pos, write_pos)
        if eof and rc == 0:
            rmq_st32(blank, <uint32_t>(file_size - pos))
            rmq_st32(blank + 4, BLANK_MAGIC)
            rc = pwrite_all(fd, blank, 8, pos)
    if rc != 0:
        raise OSError(errno, f"write of commit-log bytes {write_pos}..{pos} failed")
    if not eof and i < count:
        raise ValueError(f"encoded record at byte {sp} has a bad size")
    return i, pos - write_pos, eof


def record_store_timestamp(NativeMap m, Py_ssize_t pos):
    """Store timestamp of the record at pos (0 if no message record starts there)."""
    cdef unsigned char *p = m.check(pos, pos + 8)
    if pos + 64 > m.size or rmq_ld32(p + pos + 4) != MAGIC:
        return 0
    return <int64_t>rmq_ld64(p + pos + store_ts_pos(<int32_t>rmq_ld32(p + pos + 36)))


# --- results of a batch append ------------------------------------------------------------------
def entries_phys_offsets(entries, Py_ssize_t count):
    """Commit-log offsets of the first `count` 20-byte consume-queue entries, as a tuple."""
    cdef const unsigned char[::1] v = entries
    if v.shape[0] < count * CQ_UNIT:
        raise ValueError("entries buffer shorter than count")
    cdef Py_ssize_t i
    cdef const unsigned char *p = &v[0] if count else NULL
    return tuple([<int64_t>rmq_ld64(p + i * CQ_UNIT) for i in range(count)])


cdef extern from "Python.h":
    object PyUnicode_New(Py_ssize_t size, uint32_t maxchar)
    void *PyUnicode_DATA(object o)

cdef char _HEX_PAIRS[512]
for _i in range(256):
    _HEX_PAIRS[2 * _i] = b"0123456789ABCDEF"[_i >> 4]
    _HEX_PAIRS[2 * _i + 1] = b"0123456789ABCDEF"[_i & 15]


def offset_msg_ids(entries, Py_ssize_t count, bytes host):
    """Comma-joined offsetMsgIds (store host bytes + commit-log offset, upper-case hex) of the first
    `count` entries; `host` is the 8 (IPv4) or 20 (IPv6) byte encoded store host.  Written straight
    into one ASCII str: the host's hex once, then two characters per offset byte from a table."""
    cdef const unsigned char[::1] v = entries
    cdef Py_ssize_t hl = len(host), i, j
    if v.shape[0] < count * CQ_UNIT:
        raise ValueError("entries buffer shorter than count")
    if count == 0:
        return ""
    cdef Py_ssize_t per = (hl + 8) * 2
    out = PyUnicode_New(count * (per + 1) - 1, 127)
    cdef char *o = <char *>PyUnicode_DATA(out)
    cdef const unsigned char *h = <const unsigned char *><char *>host
    cdef const unsigned char *e = &v[0]
    cdef char prefix[40]
    for j in range(hl):
        memcpy(prefix + 2 * j, _HEX_PAIRS + 2 * h[j], 2)
    with nogil:
        for i in range(count):
            memcpy(o, prefix, 2 * hl)
            o += 2 * hl
            for j in range(8):
                memcpy(o, _HEX_PAIRS + 2 * e[j], 2)
                o += 2
            e += CQ_UNIT
            if i + 1 < count:
                o[0] = 44
                o += 1
    return out


# --- the single-message put, end to end --------------------------------------------------------
from cpython.object cimport PyObject_GenericSetAttr

cdef extern from "<time.h>" nogil:
    ctypedef long time_t
    struct timespec:
        time_t tv_sec
        long tv_nsec
    int clock_gettime(int clk_id, timespec *tp)
    int CLOCK_REALTIME

cdef inline int64_t wall_ms() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <int64_t>ts.tv_sec * 1000 + ts.tv_nsec // 1000000


cdef object _new_frozen(type cls, tuple names, tuple values):
    # attrs frozen classes refuse setattr; their own __init__ goes through object.__setattr__
    # once per field, which is what this does without the bound-method calls.
    cdef object obj = cls.__new__(cls)
    cdef Py_ssize_t i
    for i in range(len(names)):
        PyObject_GenericSetAttr(obj, names[i], values[i])
    return obj


cdef extern from "Python.h":
    const char *PyUnicode_AsUTF8AndSize(object s, Py_ssize_t *size) except NULL


cdef tuple _APPEND_FIELDS = ("wrote_offset", "wrote_bytes", "msg_id", "store_timestamp", "logics_offset",
                             "msg_num", "phys_offsets", "queue_offsets")
cdef tuple _PUT_FIELDS = ("status", "append_result", "error")


cdef class SinglePutPath:
    """The common single-message put (ASYNC_FLUSH, plain message, room left in the current
    commit-log segment and consume-queue file, nothing else in flight) done in one native call:
    encode the record straight into the mapped segment, fill queue offset / physical offset /
    store time, write the consume-queue entry, queue the index work, build the results.

    `put(msg)` returns (PutMessageResult, group-commit Future or None), or None whenever anything is out of the ordinary (a check fails, a segment must
    roll, a batch is still being published, a first put to a queue, ...): the caller then takes the
    general path, which handles every case and every error message.  No state is touched before
    the last check passes, so falling back is always safe.

    The owner keeps `enabled` current (running, writable, ASYNC_FLUSH, no extra dispatchers, no
    consume-queue ext) and holds the objects below; all writes happen under the commit log's put
    lock, in the same order as the general path (record bytes, queue entry, then positions)."""

    cdef public bint enabled
    cdef object store, commit_log, put_lock_acquire, put_lock_release, mapped_files
    cdef dict topic_queue_table, consume_queue_table, host_cache, topic_cache
    cdef object append_result_cls, put_result_cls, put_ok
    cdef bytes store_host_b
    cdef bint store_v6
    cdef Py_ssize_t limit
    cdef object schedule_topic, index_append, index_builder, listeners, log_exception
    cdef object request_flush
    cdef GroupCommitFutures flush_futures
    cdef GroupCommitGate gate
    cdef int64_t sync_timeout_ms
    cdef object durable_result
    cdef bytearray scratch

    def __init__(self, store, commit_log, dict host_cache, bytes store_host_b, bint store_v6, Py_ssize_t limit,
                 append_result_cls, put_result_cls, put_ok, schedule_topic, log_exception):
        self.enabled = False
        self.store = store
        self.commit_log = commit_log
        self.put_lock_acquire = commit_log.put_lock.acquire
        self.put_lock_release = commit_log.put_lock.release
        self.mapped_files = None
        self.topic_queue_table = None
        self.consume_queue_table = store.consume_queue_table
        self.host_cache = host_cache
        self.topic_cache = {}
        self.store_host_b = store_host_b
        self.store_v6 = store_v6
        self.limit = limit
        self.append_result_cls = append_result_cls
        self.put_result_cls = put_result_cls
        self.put_ok = put_ok
        self.schedule_topic = schedule_topic
        self.index_append = None
        self.index_builder = None
        self.request_flush = None
        self.gate = None
        self.sync_timeout_ms = 0
        self.durable_result = None
        self.scratch = bytearray(4096)
        self.listeners = ()
        self.log_exception = log_exception

    def configure(self, bint enabled, index_builder, listeners, Py_ssize_t limit, request_flush=None,
                  GroupCommitGate gate=None, int64_t sync_timeout_ms=0, durable_result=None):
        """Refresh what may change while the store runs (tables are replaced by load()).
        `index_builder`: the store's IndexBuildService (its deque gets the index work), or None.
        `request_flush`: SYNC_FLUSH — records go to the segment's descriptor with pwrite (see
        append_records_fd) and request_flush(end_offset, store_timestamp) (or a GroupCommitFutures
        object, called natively) gives the group-commit Future;
        a blocking put (`defer_flush`) waits on `gate` (GIL released) for at most sync_timeout_ms,
        and `durable_result(result, gate status)` answers one that did not become durable."""
        self.enabled = enabled
        self.request_flush = request_flush
        self.flush_futures = request_flush if isinstance(request_flush, GroupCommitFutures) else None
        self.gate = gate
        self.sync_timeout_ms = sync_timeout_ms
        self.durable_result = durable_result
        self.index_builder = index_builder
        self.index_append = index_builder._queue.append if index_builder is not None else None
        self.listeners = tuple(listeners)
        self.limit = limit
        self.topic_queue_table = self.commit_log.topic_queue_table
        self.consume_queue_table = self.store.consume_queue_table
        self.mapped_files = None

    def put(self, msg, bint defer_flush=False):
        """See the class doc; with SYNC_FLUSH and `defer_flush` (a blocking put), this thread waits
        for the group commit here, without the GIL, and gets (the final result, None) — or, without
        a gate, (result, end offset to wait for with GroupCommitService.await_flush)."""
        if not self.enabled:
            return None
        topic = msg.topic
        props = msg.properties_bytes
        body = msg.body
        if props is None:
            props_dict = msg.properties
            if type(props_dict) is not dict:
                return None
            try:
                props = encode_properties(props_dict) if props_dict else b""
            except Exception:  # a bad name or value: the general path names it
                return None
        if type(props) is not bytes or type(body) is not bytes or type(topic) is not str:
            return None
        if msg.store_host is not None or topic == self.schedule_topic:
            return None
        tags_override = msg.tags_code
        try:
            host = self.host_cache.get(msg.born_host)
        except TypeError:  # an unhashable host: the general path names it
            return None
        if host is None:
            return None
        cdef bytes born_b = <bytes>(<tuple>host)[0]
        cdef bint born_v6 = (<tuple>host)[1]
        topic_b = self.topic_cache.get(topic)
        if topic_b is None:
            topic_b = (<str>topic).encode("utf-8")
            if len(<bytes>topic_b) == 0 or len(<bytes>topic_b) > MAX_TOPIC:
                return None
            if len(self.topic_cache) < 100000:
                self.topic_cache[topic] = topic_b
        cdef int32_t queue_id, sys_flag, flag, reconsume
        cdef int64_t born_ts, prepared
        try:
            queue_id = msg.queue_id
            sys_flag = msg.sys_flag
            flag = msg.flag
            born_ts = msg.born_timestamp
            reconsume = msg.reconsume_times
            prepared = msg.prepared_transaction_offset
        except (OverflowError, TypeError):  # out of range: the general path reports it
            return None
        sys_flag = (sys_flag & ~0x30) | (BORNHOST_V6 if born_v6 else 0) | (STOREHOST_V6 if self.store_v6 else 0)
        cdef int32_t tx = sys_flag & 0xC  # prepared (0x4) and rollback (0xC) records get no queue entry
        if tx == 0x4 or tx == 0xC:
            return None
        cdef Py_ssize_t tl = len(<bytes>topic_b), bl = len(<bytes>body), pl = len(<bytes>props)
        cdef Py_ssize_t bhl = len(born_b), shl = len(self.store_host_b)
        if pl > MAX_PROPS or bhl != (20 if born_v6 else 8):
            return None
        cdef Py_ssize_t total = record_len(bhl, shl, bl, tl, pl)
        if total > self.limit:
            return None
        if born_ts == 0:
            born_ts = wall_ms()
        cdef const unsigned char *bp = <const unsigned char *><char *>body
        cdef const unsigned char *pp = <const unsigned char *><char *>props
        cdef uint32_t body_crc
        with nogil:
            body_crc = crc32_update(0, bp, bl)
        cdef int64_t tags
        if tags_override is None:
            tags = tags_code_of(pp, pl)
        else:
            tags = tags_override
        key = (topic, queue_id)
        cdef int64_t qoff, store_ts, last_ts, phys, seg_from, cq_from
        cdef Py_ssize_t wp, fsize, cpos, csize
        cdef NativeMap seg, cseg
        cdef unsigned char *d
        cdef unsigned char *c
        cdef int fd, rc
        cl = self.commit_log
        self.put_lock_acquire()
        try:
            if not self.enabled:
                return None  # disabled while we waited for the lock (shutdown waits on this lock)
            if cl._published != cl._next_ticket - 1:
                return None  # a batch is being encoded outside the lock: publish in order
            files = self.mapped_files
            if files is None:
                files = self.mapped_files = cl.mapped_file_queue.mapped_files
            elif files is not cl.mapped_file_queue.mapped_files:
                files = self.mapped_files = cl.mapped_file_queue.mapped_files
            if not files:
                return None
            mf = (<list>files)[len(<list>files) - 1]  # no wraparound in this module
            fd_obj = mf.fd
            if (fd_obj is None) != (self.request_flush is None):
                return None
            wp = mf.wrote_position
            fsize = mf.file_size
            if wp + total + MIN_BLANK > fsize:
                return None  # the segment must roll: general path
            seg = mf.native
            if seg is None or seg.ptr == NULL or fsize > seg.size:
                return None
            qs = self.consume_queue_table.get(topic)
            if qs is None:
                return None
            cq = (<dict>qs).get(queue_id)
            if cq is None or cq.ext is not None:
                return None
            cfiles = cq.mapped_file_queue.mapped_files
            if not cfiles:
                return None
            cmf = (<list>cfiles)[len(<list>cfiles) - 1]
            cpos = cmf.wrote_position
            csize = cq.mapped_file_size
            qoff = self.topic_queue_table.get(key, 0)
            cq_from = cmf.file_from_offset
            if cpos + CQ_UNIT > csize or cq_from + cpos != qoff * CQ_UNIT:
                return None
            cseg = cmf.native
            if cseg is None or cseg.ptr == NULL or cpos + CQ_UNIT > cseg.size:
                return None
            store_ts = wall_ms()
            last_ts = cl.last_store_timestamp
            if store_ts < last_ts:
                store_ts = last_ts  # store time stays monotonic along the log
            seg_from = mf.file_from_offset
            phys = seg_from + wp
            # -- every check passed: write --
            if fd_obj is None:
                d = seg.ptr + wp
            else:  # encode into the scratch buffer, pwrite below
                if len(self.scratch) < total:
                    self.scratch = bytearray(total * 2)
                d = <unsigned char *>PyByteArray_AS_STRING(self.scratch)
            write_record(d, <int32_t>total, body_crc, queue_id, flag, sys_flag, born_ts,
                         <const unsigned char *><char *>born_b, bhl,
                         <const unsigned char *><char *>self.store_host_b, shl, reconsume, prepared,
                         bp, bl, <const unsigned char *><char *>topic_b, tl, pp, pl, NULL, 0, False)
            rmq_st64(d + 20, <uint64_t>qoff)
            rmq_st64(d + 28, <uint64_t>phys)
            rmq_st64(d + store_ts_pos(sys_flag), <uint64_t>store_ts)
            if fd_obj is not None:
                fd = fd_obj
                # a page-cache write of one record: keeping the GIL is cheaper than handing it
                # to another thread and waiting to get it back
                rc = pwrite_all(fd, d, total, wp)
                if rc != 0:
                    raise OSError(errno, f"write of commit-log bytes {wp}..{wp + total} failed")
            c = cseg.ptr + cpos
            rmq_st64(c, <uint64_t>phys)
            rmq_st32(c + 8, <uint32_t>total)
            rmq_st64(c + 12, <uint64_t>tags)
            mf.wrote_position = wp + total
            cmf.wrote_position = cpos + CQ_UNIT
            cq.max_physic_offset = phys + total
            self.topic_queue_table[key] = qoff + 1
            cl.last_store_timestamp = store_ts
            if self.index_append is not None:
                # IndexBuildService.submit, inlined
                self.index_append((topic, phys, store_ts, sys_flag, props))
                if self.index_builder._idle and len(self.index_builder._queue) >= self.index_builder.WAKE_BACKLOG:
                    self.index_builder.wake()
        finally:
            self.put_lock_release()
        # -- results (outside the lock) --
        cdef unsigned char idb[28]
        cdef char hexs[56]
        cdef const char *hexd = b"0123456789ABCDEF"
        cdef Py_ssize_t j
        memcpy(idb, <const unsigned char *><char *>self.store_host_b, shl)
        rmq_st64(idb + shl, <uint64_t>phys)
        for j in range(shl + 8):
            hexs[2 * j] = hexd[idb[j] >> 4]
            hexs[2 * j + 1] = hexd[idb[j] & 15]
        msg_id = hexs[:2 * (shl + 8)].decode("ascii")
        append_result = _new_frozen(self.append_result_cls, _APPEND_FIELDS,
                                    (phys, total, msg_id, store_ts, qoff, 1, None, None))
        result = _new_frozen(self.put_result_cls, _PUT_FIELDS, (self.put_ok, append_result, None))
        store = self.store
        store.put_message_count = store.put_message_count + 1
        for fn in self.listeners:
            try:
                fn(topic, queue_id, qoff + 1, tags, store_ts, props)
            except Exception:
                self.log_exception("message arriving listener %r failed", fn)
        cdef int gc
        cdef GroupCommitGate gate = self.gate
        cdef int64_t end = phys + total, timeout_ns = self.sync_timeout_ms * 1000000
        if self.request_flush is not None:
            if defer_flush:
                if gate is None:
                    return result, end
                with nogil:
                    gc = rmq_gc_await(&gate.g, end, store_ts, timeout_ns)
                if gc == RMQ_GC_OK:
                    return result, None
                return self.durable_result(result, gc), None
            if self.flush_futures is not None:
                return result, self.flush_futures.request_c(end, store_ts)
            return result, self.request_flush(end, store_ts)
        return result, None
