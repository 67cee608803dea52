# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Commit-log kernels: appending records into a mapped segment or a file (encoded records, or a
batch body's items straight into the segment), one message record with its consume-queue entry
(put_record), the end-of-segment blank and append results (offset msg ids).  The commit log and
message store (Python) own every position, file and decision; these take buffers and plain values.
The record format itself (layout, encoders, the property lookup, the recovery scan) is
record.pyx's; the shared inline helpers come from record.pxd.

End of segment: BLANK record = i32 remaining bytes, i32 0xCBD43194 (at least 8 bytes left).

Consume-queue entry (written by the puts here, scanned by cq.pyx; 20 bytes, big-endian):
i64 commit-log offset | i32 size | i64 tags code.

All functions work on raw pointers held by `NativeMap` (mapped.pyx), so a call costs no per-call
buffer acquisition and creates no Python object per record scanned or skipped.
"""
cimport cython
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_WRITABLE, PyBUF_SIMPLE
from rmq_core._native.mapped cimport NativeMap
from store_bytes cimport *  # the store's byte helpers, constants and common C names

cdef extern from "<sys/mman.h>" nogil:
    int msync(void *addr, size_t length, int flags)
    int MS_SYNC

from libc.errno cimport errno, EINTR

cdef extern from "<unistd.h>" nogil:
    ssize_t pwrite(int fd, const void *buf, size_t count, long offset)

from rmq_core._native.crc cimport crc32_update
from java_hash cimport java_hash_utf8
from rmq_core._native.record cimport (batch_template, put_offset_hex, put_offset_msg_id, rmq_batch_crc32,
                                      rmq_batch_encode, rmq_batch_tmpl, rmq_hash_fn, rmq_tag_cache, tags_code_of,
                                      write_record)
from record_layout cimport (BLANK_MAGIC_CODE as BLANK_MAGIC, MAX_PROPS, MAX_TOPIC, MESSAGE_MAGIC_CODE as MAGIC,
                            HOST_V4_LEN, HOST_V6_LEN, MAGIC_CODE_AT, MIN_BLANK, PHYSICAL_OFFSET_AT, QUEUE_OFFSET_AT, RECORD_FIXED_V4, SYS_FLAG_AT,
                            born_host_len, record_len, store_host_len, store_timestamp_at)


rmq_batch_crc32 = crc32_update  # the batch encoder (store_batch.h) uses the crc module's CRC-32





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
        if size < RECORD_FIXED_V4 or sp + size > n:
            break
        if pos + size + MIN_BLANK > file_size:
            eof[0] = True
            break
        d = s + sp
        rmq_st64(d + QUEUE_OFFSET_AT, <uint64_t>(queue_offset + i))
        rmq_st64(d + PHYSICAL_OFFSET_AT, <uint64_t>(file_from_offset + pos))
        sysf = <int32_t>rmq_ld32(d + SYS_FLAG_AT)
        rmq_st64(d + store_timestamp_at(sysf), <uint64_t>store_timestamp)
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
                   bytes tags, Py_ssize_t tag_index, bytearray cq_out, Py_ssize_t cq_pos, int fd=-1):
    """Copy up to `count` encoded records from src[src_pos:] into the segment `dst` at write_pos,
    filling in each record's queue offset (consecutive from `queue_offset`), physical offset and
    store timestamp, and writing one 20-byte consume-queue entry per record into cq_out[cq_pos:].

    The fields are filled in `src` (the caller's private encode buffer, still warm in cache) and
    the records then go into the segment in one piece: one memcpy into the mapping, or - with
    `fd` >= 0, the segment's descriptor - one pwrite into the page cache, where the mapping sees
    them (RocketMQ's transient-store idea, used for SYNC_FLUSH: pages dirtied through write() are
    made durable by fdatasync without the page-fault / journal cost that msync of mmap-dirtied
    pages has on ext4).  A record that does not fit (it must leave 8 bytes for the blank) stops
    the copy: the blank end-of-file record is written and the third result is True.
    Returns (records written, bytes written, end_of_file)."""
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
    cdef int rc = 0
    with nogil:
        i = fill_records(s, n, src_pos, count, write_pos, file_size, file_from_offset, queue_offset,
                         store_timestamp, tg + tag_index, cq, &pos, &sp, &eof)
        if pos > write_pos:
            if fd < 0:
                memcpy(base + write_pos, s + src_pos, pos - write_pos)
            else:
                rc = pwrite_all(fd, s + src_pos, pos - write_pos, write_pos)
        if eof and rc == 0:
            rc = put_blank(base, fd, pos, file_size)
    if rc != 0:
        raise OSError(errno, f"write of commit-log bytes {write_pos}..{pos} failed")
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


cdef int put_blank(unsigned char *base, int fd, Py_ssize_t pos, Py_ssize_t file_size) noexcept nogil:
    """The end-of-file blank record (int32 length to the segment end, int32 BLANK_MAGIC) at pos:
    into the mapping at `base`, or pwritten through `fd` when fd >= 0.  0, or -1 (errno set)."""
    cdef unsigned char blank[8]
    rmq_st32(blank, <uint32_t>(file_size - pos))
    rmq_st32(blank + 4, BLANK_MAGIC)
    if fd < 0:
        memcpy(base + pos, blank, 8)
        return 0
    return pwrite_all(fd, blank, 8, pos)


def write_blank(NativeMap dst, Py_ssize_t pos, int fd=-1):
    """The end-of-file blank record from pos to the end of the segment (fd >= 0: pwritten through
    the segment's descriptor, as the records of a SYNC_FLUSH log are)."""
    cdef unsigned char *p = dst.check(pos, pos + MIN_BLANK)
    if put_blank(p, fd, pos, dst.size) != 0:
        raise OSError(errno, f"write of the blank record at {pos} failed")


def record_store_timestamp(NativeMap m, Py_ssize_t pos):
    """Store timestamp of the record at pos (0 if no message record starts there)."""
    cdef unsigned char *p = m.check(pos, pos + 8)
    if pos + 64 > m.size or rmq_ld32(p + pos + MAGIC_CODE_AT) != MAGIC:
        return 0
    return <int64_t>rmq_ld64(p + pos + store_timestamp_at(<int32_t>rmq_ld32(p + pos + SYS_FLAG_AT)))


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

def offset_msg_ids(entries, Py_ssize_t count, bytes host):
    """Comma-joined offsetMsgIds (store host bytes + commit-log offset, upper-case hex) of the first
    `count` entries; `host` is the 8 (IPv4) or 20 (IPv6) byte encoded store host.  Written straight
    into one ASCII str by record.pxd's put_offset_msg_id."""
    cdef const unsigned char[::1] v = entries
    cdef Py_ssize_t hl = len(host), i
    if v.shape[0] < count * CQ_UNIT:
        raise ValueError("entries buffer shorter than count")
    if hl != HOST_V4_LEN and hl != HOST_V6_LEN:
        raise ValueError(f"store host of {hl} bytes; it must be {HOST_V4_LEN} or {HOST_V6_LEN}")
    if count == 0:
        return ""
    cdef Py_ssize_t per = (hl + 8) * 2
    out = PyUnicode_New(count * (per + 1) - 1, 127)
    cdef char *o = <char *>PyUnicode_DATA(out)
    cdef const unsigned char *h = <const unsigned char *><char *>host
    cdef const unsigned char *e = &v[0]
    cdef const char *first = o
    with nogil:
        o += put_offset_msg_id(o, h, hl, <int64_t>rmq_ld64(e))
        for i in range(1, count):
            e += CQ_UNIT
            o[0] = 44
            memcpy(o + 1, first, 2 * hl)  # the host's digits, as the first id has them
            put_offset_hex(o + 1 + 2 * hl, <int64_t>rmq_ld64(e))
            o += per + 1
    return out


# --- one message record ---------------------------------------------------------------------------
def put_record(NativeMap seg, Py_ssize_t write_pos, int fd, bytearray scratch, NativeMap cq_map, Py_ssize_t cq_pos,
               bytes topic, int32_t queue_id, int32_t flag, bytes body, bytes props, int32_t sys_flag,
               int64_t born_ts, bytes born_host, bytes store_host, int32_t reconsume_times, int64_t prepared,
               int64_t body_crc, int64_t queue_offset, int64_t phys, int64_t store_timestamp, tags):
    """Write one message record at write_pos of a segment, with its queue offset, physical offset
    `phys` and store timestamp filled in, and (cq_map not None) its consume-queue entry
    (phys, size, tag code) at cq_pos of a consume-queue file.  fd < 0: the record is encoded
    straight into the mapping; fd >= 0 (SYNC_FLUSH): into `scratch`, then pwritten at write_pos.
    body_crc < 0: the body's CRC is taken here (a small body; see `body_crc`).  tags None: the
    tag code is the Java hash of the TAGS property.  Returns the tag code.  The caller decided
    where (room, positions) and owns them."""
    cdef Py_ssize_t tl = len(topic), bl = len(body), pl = len(props)
    cdef Py_ssize_t bhl = len(born_host), shl = len(store_host)
    if tl == 0 or tl > MAX_TOPIC:
        raise ValueError(f"topic of {tl} bytes; it must be 1..{MAX_TOPIC}")
    if pl > MAX_PROPS:
        raise ValueError(f"properties of {pl} bytes; at most {MAX_PROPS}")
    if bhl != born_host_len(sys_flag) or shl != store_host_len(sys_flag):
        raise ValueError(f"hosts of {bhl}/{shl} bytes do not match sysFlag {sys_flag:#x}")
    cdef Py_ssize_t total = record_len(bhl, shl, bl, tl, pl)
    cdef const unsigned char *bp = <const unsigned char *><char *>body
    cdef const unsigned char *pp = <const unsigned char *><char *>props
    cdef int64_t tag_code = tags_code_of(pp, pl) if tags is None else <int64_t>tags
    cdef unsigned char *base = seg.check(write_pos, write_pos + total)
    cdef unsigned char *c = NULL
    if cq_map is not None:
        c = cq_map.check(cq_pos, cq_pos + CQ_UNIT) + cq_pos
    cdef unsigned char *d
    if fd < 0:
        d = base + write_pos
    else:
        if len(scratch) < total:
            raise ValueError(f"scratch buffer of {len(scratch)} bytes is shorter than the {total}-byte record")
        d = <unsigned char *>PyByteArray_AS_STRING(scratch)
    cdef uint32_t crc = <uint32_t>body_crc if body_crc >= 0 else crc32_update(0, bp, bl)
    write_record(d, <int32_t>total, crc, queue_id, flag, sys_flag, born_ts,
                 <const unsigned char *><char *>born_host, bhl, <const unsigned char *><char *>store_host, shl,
                 reconsume_times, prepared, bp, bl, <const unsigned char *><char *>topic, tl, pp, pl, NULL, 0, False)
    rmq_st64(d + QUEUE_OFFSET_AT, <uint64_t>queue_offset)
    rmq_st64(d + PHYSICAL_OFFSET_AT, <uint64_t>phys)
    rmq_st64(d + store_timestamp_at(sys_flag), <uint64_t>store_timestamp)
    # one page-cache write: keeping the GIL is cheaper than handing it over and back
    if fd >= 0 and pwrite_all(fd, d, total, write_pos) != 0:
        raise OSError(errno, f"write of commit-log bytes {write_pos}..{write_pos + total} failed")
    if c != NULL:
        rmq_st64(c, <uint64_t>phys)
        rmq_st32(c + 8, <uint32_t>total)
        rmq_st64(c + 12, <uint64_t>tag_code)
    return tag_code


def body_crc(bytes body):
    """CRC-32 of a message body, for put_record: a large body's is taken before the put lock."""
    cdef Py_ssize_t n = len(body)
    cdef const unsigned char *p = <const unsigned char *><char *>body
    cdef uint32_t c
    if n < 65536:
        return crc32_update(0, p, n)
    with nogil:
        c = crc32_update(0, p, n)
    return c

