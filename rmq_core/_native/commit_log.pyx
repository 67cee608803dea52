# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Commit-log kernels: record encoding (one message, a batch body's items; body CRCs by crc.pyx),
appending records into a mapped segment or a file,
the recovery scan, and the single-message put end to end (SinglePutPath).

Commit-log record (RocketMQ 4.x v1 layout, big-endian; REMOTING.md §6):

    0 TOTALSIZE i32 | 4 MAGIC i32 (0xDAA320A7) | 8 BODYCRC i32 (crc32 & 0x7fffffff) | 12 QUEUEID i32
    16 FLAG i32 | 20 QUEUEOFFSET i64 | 28 PHYSICALOFFSET i64 | 36 SYSFLAG i32 | 40 BORNTIMESTAMP i64
    48 BORNHOST ip(4|16)+port i32 | STORETIMESTAMP i64 | STOREHOST ip(4|16)+port i32
    RECONSUMETIMES i32 | PREPARED_TRANSACTION_OFFSET i64 | BODYLENGTH i32, body
    TOPICLENGTH u8, topic | PROPERTIESLENGTH i16, properties ("k\\x01v\\x02"...)

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

from rmq_core.errors import IllegalArgumentError, MessageTooLargeError
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


cdef extern from "store_batch.h" nogil:
    ctypedef uint32_t (*rmq_crc_fn)(uint32_t, const unsigned char *, size_t) noexcept nogil
    rmq_crc_fn rmq_batch_crc32
    ctypedef int32_t (*rmq_hash_fn)(const unsigned char *, Py_ssize_t) noexcept nogil
    ctypedef struct rmq_batch_tmpl:
        size_t head_len
        size_t fixed
    ctypedef struct rmq_tag_cache:
        const unsigned char *props
    void rmq_batch_tmpl_init(rmq_batch_tmpl *t, int32_t queue_id, int32_t sys_flag, int64_t born_ts,
                             const unsigned char *born_host, size_t bh_len,
                             const unsigned char *store_host, size_t sh_len,
                             int32_t reconsume, int64_t store_ts,
                             const unsigned char *topic, size_t topic_len,
                             const unsigned char *extra, size_t extra_len)
    size_t rmq_batch_encode(const rmq_batch_tmpl *t, const unsigned char *s, size_t *body_pos, size_t n_items,
                            unsigned char *dst, size_t dst_len, int64_t phys0, int64_t qoff0,
                            unsigned char *cq, rmq_tag_cache *tc, rmq_hash_fn hash)
    int rmq_batch_plan(const unsigned char *s, size_t n, size_t fixed, size_t extra_len, size_t max_props,
                       size_t max_record, size_t *count, size_t *total)
    void rmq_stream_copy(unsigned char *d, const unsigned char *s, size_t n)
    size_t rmq_batch_fit(const rmq_batch_tmpl *t, const unsigned char *s, size_t body_pos, size_t n_items,
                         size_t write_pos, size_t file_size, size_t *nbytes, size_t *next_body_pos)

rmq_batch_crc32 = crc32_update  # the batch encoder (store_batch.h) uses the crc module's CRC-32


cdef uint32_t MAGIC = 0xDAA320A7u
cdef uint32_t BLANK_MAGIC = 0xCBD43194u

MESSAGE_MAGIC_CODE = MAGIC
BLANK_MAGIC_CODE = BLANK_MAGIC
END_FILE_MIN_BLANK_LENGTH = MIN_BLANK

# verify_records stop reasons
STOP_END = 0        # reached `end` or a zero header (nothing written there)
STOP_BLANK = 1      # end-of-segment blank record
STOP_CORRUPT = 2    # bad magic / size / crc / physical offset / structure


class PropertiesSizeExceededError(IllegalArgumentError):
    """A message's properties are longer than the int16 length field allows (32767 bytes)."""


class BatchFormatError(IllegalArgumentError):
    """A SEND_BATCH_MESSAGE body does not decode (REMOTING.md §8)."""


# --- Java String.hashCode of UTF-8 text (java_hash.pxd) ---------------------------------------
from java_hash cimport java_hash_utf8


cdef inline bint find_property(const unsigned char *props, Py_ssize_t n, const char *key, Py_ssize_t klen,
                               Py_ssize_t *vstart, Py_ssize_t *vlen) noexcept nogil:
    """Locate `key`'s value in a "k\\x01v\\x02" properties string."""
    cdef Py_ssize_t i = 0, j, k
    while i < n:
        # pair starts at i: name up to \x01
        j = i
        while j < n and props[j] != 1 and props[j] != 2:
            j += 1
        if j >= n:
            return False
        if props[j] == 2:      # malformed pair without a value: skip it
            i = j + 1
            continue
        k = j + 1
        while k < n and props[k] != 2:
            k += 1
        if j - i == klen and memcmp(props + i, key, klen) == 0:
            vstart[0] = j + 1
            vlen[0] = k - (j + 1)
            return True
        i = k + 1
    return False


cdef inline int64_t tags_code_of(const unsigned char *props, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t vs = 0, vl = 0
    if find_property(props, n, b"TAGS", 4, &vs, &vl) and vl > 0:
        return java_hash_utf8(props + vs, vl)
    return 0




# --- record encoding ---------------------------------------------------------------------------
cdef inline Py_ssize_t write_record(unsigned char *d, int32_t total, uint32_t body_crc, int32_t queue_id,
                                    int32_t flag, int32_t sys_flag, int64_t born_ts,
                                    const unsigned char *born_host, Py_ssize_t bh_len,
                                    const unsigned char *store_host, Py_ssize_t sh_len,
                                    int32_t reconsume, int64_t prepared,
                                    const unsigned char *body, Py_ssize_t body_len,
                                    const unsigned char *topic, Py_ssize_t topic_len,
                                    const unsigned char *props, Py_ssize_t props_len,
                                    const unsigned char *extra, Py_ssize_t extra_len,
                                    bint extra_sep) noexcept nogil:
    """Write one record with queue offset, physical offset and store timestamp zero (the append
    fills them in under the put lock).  Returns bytes written (== total)."""
    cdef unsigned char *q = d
    rmq_st32(q, <uint32_t>total); q += 4
    rmq_st32(q, MAGIC); q += 4
    rmq_st32(q, body_crc & 0x7FFFFFFF); q += 4
    rmq_st32(q, <uint32_t>queue_id); q += 4
    rmq_st32(q, <uint32_t>flag); q += 4
    memset(q, 0, 16); q += 16                  # queue offset, physical offset
    rmq_st32(q, <uint32_t>sys_flag); q += 4
    rmq_st64(q, <uint64_t>born_ts); q += 8
    memcpy(q, born_host, bh_len); q += bh_len
    memset(q, 0, 8); q += 8                    # store timestamp
    memcpy(q, store_host, sh_len); q += sh_len
    rmq_st32(q, <uint32_t>reconsume); q += 4
    rmq_st64(q, <uint64_t>prepared); q += 8
    rmq_st32(q, <uint32_t>body_len); q += 4
    if body_len:
        memcpy(q, body, body_len); q += body_len
    q[0] = <unsigned char>topic_len; q += 1
    memcpy(q, topic, topic_len); q += topic_len
    rmq_st16(q, <uint16_t>(props_len + extra_len + (1 if extra_sep else 0))); q += 2
    if props_len:
        memcpy(q, props, props_len); q += props_len
    if extra_sep:
        q[0] = 2; q += 1
    if extra_len:
        memcpy(q, extra, extra_len); q += extra_len
    return q - d


cdef inline Py_ssize_t record_len(Py_ssize_t bh, Py_ssize_t sh, Py_ssize_t body, Py_ssize_t topic, Py_ssize_t props) noexcept nogil:
    return 72 + bh + sh + body + 1 + topic + 2 + props


cdef check_hosts(const unsigned char[::1] born_host, const unsigned char[::1] store_host, int32_t sys_flag):
    cdef Py_ssize_t bh = 20 if sys_flag & BORNHOST_V6 else 8
    cdef Py_ssize_t sh = 20 if sys_flag & STOREHOST_V6 else 8
    if born_host.shape[0] != bh:
        raise IllegalArgumentError(f"born host must be {bh} encoded bytes for sysFlag {sys_flag:#x}, got {born_host.shape[0]}")
    if store_host.shape[0] != sh:
        raise IllegalArgumentError(f"store host must be {sh} encoded bytes for sysFlag {sys_flag:#x}, got {store_host.shape[0]}")


cdef inline const unsigned char *ptr_or_empty(const unsigned char[::1] v) noexcept:
    if v.shape[0] == 0:
        return <const unsigned char *>b""
    return &v[0]


def encode_record(bytes topic, int32_t queue_id, int32_t flag, bytes body, bytes props, int32_t sys_flag,
                  int64_t born_ts, bytes born_host, bytes store_host, int32_t reconsume_times,
                  int64_t prepared_transaction_offset, Py_ssize_t max_message_size):
    """One message -> (bytearray record, tags code of its TAGS property).  The record's queue
    offset, physical offset and store timestamp are left zero for `append_records`."""
    cdef Py_ssize_t tl = len(topic), bl = len(body), pl = len(props)
    cdef Py_ssize_t bhl = len(born_host), shl = len(store_host)
    cdef Py_ssize_t want_bh = 20 if sys_flag & BORNHOST_V6 else 8
    cdef Py_ssize_t want_sh = 20 if sys_flag & STOREHOST_V6 else 8
    if tl > MAX_TOPIC or tl == 0:
        raise IllegalArgumentError(f"topic {topic.decode('utf-8', 'replace')!r} is {tl} bytes; it must be 1..{MAX_TOPIC}")
    if pl > MAX_PROPS:
        raise PropertiesSizeExceededError(f"message properties are {pl} bytes, more than {MAX_PROPS}")
    if bhl != want_bh or shl != want_sh:
        raise IllegalArgumentError(f"hosts must be encoded as {want_bh}/{want_sh} bytes for sysFlag {sys_flag:#x}, "
                                   f"got {bhl}/{shl}")
    cdef Py_ssize_t total = record_len(bhl, shl, bl, tl, pl)
    if total > max_message_size:
        raise MessageTooLargeError(total, max_message_size)
    out = PyByteArray_FromStringAndSize(NULL, total)
    cdef unsigned char *d = <unsigned char *>PyByteArray_AS_STRING(out)
    cdef const unsigned char *bp = <const unsigned char *><char *>body
    cdef const unsigned char *pp = <const unsigned char *><char *>props
    cdef uint32_t c = crc32_update(0, bp, bl)
    write_record(d, <int32_t>total, c, queue_id, flag, sys_flag, born_ts, <const unsigned char *><char *>born_host, bhl,
                 <const unsigned char *><char *>store_host, shl, reconsume_times, prepared_transaction_offset,
                 bp, bl, <const unsigned char *><char *>topic, tl, pp, pl, NULL, 0, False)
    return out, tags_code_of(pp, pl)


def encode_batch(body, bytes topic, int32_t queue_id, int32_t sys_flag, int64_t born_ts, bytes born_host,
                 bytes store_host, int32_t reconsume_times, extra_properties, Py_ssize_t max_message_size,
                 bint plan_only=False):
    """A SEND_BATCH_MESSAGE body (REMOTING.md §8) -> (bytearray records, count, bytearray tags codes
    as native int64).  Every item becomes a full record with the request's topic, queue, hosts and
    `extra_properties` appended to its own properties (as the Java broker does).

    plan_only: validate and size only -> (None, count, total record bytes), for `fit_batch` and
    `encode_batch_into`, which encode straight into the segment."""
    cdef const unsigned char[::1] src = body
    cdef const unsigned char[::1] ex = extra_properties
    cdef const unsigned char[::1] bh = born_host
    cdef const unsigned char[::1] sh = store_host
    cdef Py_ssize_t n = src.shape[0]
    cdef Py_ssize_t tl = len(topic)
    cdef Py_ssize_t exl = ex.shape[0]
    if tl > MAX_TOPIC or tl == 0:
        raise IllegalArgumentError(f"topic {topic.decode('utf-8', 'replace')!r} is {tl} bytes; it must be 1..{MAX_TOPIC}")
    check_hosts(bh, sh, sys_flag)
    if n == 0:
        raise BatchFormatError("batch body is empty")
    cdef const unsigned char *s = &src[0]
    cdef const unsigned char *exp = ptr_or_empty(ex)
    cdef Py_ssize_t fixed = record_len(bh.shape[0], sh.shape[0], 0, tl, 0)
    # pass 1: validate and size (the C pass; this loop only runs again to name a problem it found)
    cdef Py_ssize_t pos = 0, count = 0, out_len = 0, item_total, blen, plen, rlen, ppos
    cdef bint sep
    cdef size_t planned_count = 0, planned_total = 0
    cdef int planned
    planned = rmq_batch_plan(s, n, fixed, exl, MAX_PROPS, max_message_size if max_message_size > 0 else 0,
                             &planned_count, &planned_total)
    if planned == 0:
        count = planned_count
        out_len = planned_total
        pos = n
    while pos < n:
        if n - pos < 20:
            raise BatchFormatError(f"batch body truncated at byte {pos}: {n - pos} bytes left, an item header needs 20")
        item_total = <int32_t>rmq_ld32(s + pos)
        blen = <int32_t>rmq_ld32(s + pos + 16)
        if blen < 0 or pos + 20 + blen + 2 > n:
            raise BatchFormatError(f"batch item {count} at byte {pos}: body length {blen} runs past the end ({n} bytes)")
        plen = <int16_t>rmq_ld16(s + pos + 20 + blen)
        if plen < 0 or pos + 22 + blen + plen > n:
            raise BatchFormatError(f"batch item {count} at byte {pos}: properties length {plen} runs past the end ({n} bytes)")
        if item_total != 22 + blen + plen:
            raise BatchFormatError(f"batch item {count} at byte {pos}: total size {item_total} != 22 + body {blen} + properties {plen}")
        ppos = pos + 22 + blen
        sep = plen > 0 and exl > 0 and s[ppos + plen - 1] != 2
        if plen + exl + (1 if sep else 0) > MAX_PROPS:
            raise PropertiesSizeExceededError(
                f"batch item {count}: properties are {plen + exl + (1 if sep else 0)} bytes, more than {MAX_PROPS}")
        rlen = fixed + blen + plen + exl + (1 if sep else 0)
        if rlen > max_message_size:
            raise MessageTooLargeError(rlen, max_message_size)
        out_len += rlen
        count += 1
        pos += item_total
    if plan_only:
        return None, count, out_len
    out = PyByteArray_FromStringAndSize(NULL, out_len)
    tags = PyBytes_FromStringAndSize(NULL, count * 8)  # fresh: filled below, then immutable
    cdef unsigned char *d = <unsigned char *>PyByteArray_AS_STRING(out)
    cdef int64_t *tg = <int64_t *><char *>(<bytes>tags)
    cdef const unsigned char *tp = <const unsigned char *><char *>topic
    cdef const unsigned char *bhp = &bh[0]
    cdef const unsigned char *shp = &sh[0]
    cdef Py_ssize_t i = 0, vs, vl
    cdef int32_t flag
    cdef int64_t code
    with nogil:
        pos = 0
        while i < count:
            item_total = <int32_t>rmq_ld32(s + pos)
            flag = <int32_t>rmq_ld32(s + pos + 12)
            blen = <int32_t>rmq_ld32(s + pos + 16)
            plen = <int16_t>rmq_ld16(s + pos + 20 + blen)
            ppos = pos + 22 + blen
            sep = plen > 0 and exl > 0 and s[ppos + plen - 1] != 2
            rlen = fixed + blen + plen + exl + (1 if sep else 0)
            write_record(d, <int32_t>rlen, crc32_update(0, s + pos + 20, blen), queue_id, flag, sys_flag, born_ts,
                         bhp, bh.shape[0], shp, sh.shape[0], reconsume_times, 0,
                         s + pos + 20, blen, tp, tl, s + ppos, plen, exp, exl, sep)
            # the TAGS of an item wins over one in the extra properties (first occurrence wins)
            code = 0
            if find_property(s + ppos, plen, b"TAGS", 4, &vs, &vl):
                if vl > 0:
                    code = java_hash_utf8(s + ppos + vs, vl)
            elif exl:
                code = tags_code_of(exp, exl)
            tg[i] = code
            d += rlen
            pos += item_total
            i += 1
    return out, count, tags


cdef inline int batch_template(rmq_batch_tmpl *t, bytes topic, int32_t queue_id, int32_t sys_flag, int64_t born_ts,
                               bytes born_host, bytes store_host, int32_t reconsume_times,
                               const unsigned char[::1] extra, int64_t store_timestamp) except -1:
    cdef Py_ssize_t tl = len(topic), bhl = len(born_host), shl = len(store_host)
    if tl == 0 or tl > MAX_TOPIC:
        raise ValueError(f"topic of {tl} bytes; it must be 1..{MAX_TOPIC}")
    if bhl != (20 if sys_flag & BORNHOST_V6 else 8) or shl != (20 if sys_flag & STOREHOST_V6 else 8):
        raise ValueError(f"hosts of {bhl}/{shl} bytes do not match sysFlag {sys_flag:#x}")
    rmq_batch_tmpl_init(t, queue_id, sys_flag, born_ts, <const unsigned char *><char *>born_host, bhl,
                        <const unsigned char *><char *>store_host, shl, reconsume_times, store_timestamp,
                        <const unsigned char *><char *>topic, tl, ptr_or_empty(extra), extra.shape[0])
    return 0


def fit_batch(body, Py_ssize_t body_pos, Py_ssize_t n_items, bytes topic, int32_t sys_flag, bytes born_host,
              bytes store_host, extra_properties, Py_ssize_t write_pos, Py_ssize_t file_size):
    """How many of the (validated) batch items from body[body_pos:] fit a segment at write_pos, each
    record leaving 8 bytes for the end-of-file blank: (records, bytes, next body position)."""
    cdef const unsigned char[::1] src = body
    cdef const unsigned char[::1] ex = extra_properties
    cdef rmq_batch_tmpl t
    cdef size_t nbytes = 0, next_pos = 0, k
    batch_template(&t, topic, 0, sys_flag, 0, born_host, store_host, 0, ex, 0)
    if body_pos < 0 or body_pos > src.shape[0] or n_items < 0 or write_pos < 0:
        raise ValueError(f"body position {body_pos} / item count {n_items} / write position {write_pos} out of range")
    if n_items == 0:
        return 0, 0, body_pos
    k = rmq_batch_fit(&t, &src[0], body_pos, n_items, write_pos, file_size, &nbytes, &next_pos)
    return k, nbytes, next_pos


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
cdef inline Py_ssize_t store_ts_pos(int32_t sys_flag) noexcept nogil:
    return 48 + (20 if sys_flag & BORNHOST_V6 else 8)


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
    cdef Py_ssize_t pos = write_pos, sp = src_pos, i = 0, size
    cdef unsigned char *d
    cdef bint eof = False
    cdef int32_t sysf
    with nogil:
        while i < count:
            size = <int32_t>rmq_ld32(s + sp)
            if size < 91 or sp + size > n:
                break
            if pos + size + MIN_BLANK > file_size:
                eof = True
                break
            d = s + sp
            rmq_st64(d + 20, <uint64_t>(queue_offset + i))
            rmq_st64(d + 28, <uint64_t>(file_from_offset + pos))
            sysf = <int32_t>rmq_ld32(d + 36)
            rmq_st64(d + store_ts_pos(sysf), <uint64_t>store_timestamp)
            rmq_st64(cq, <uint64_t>(file_from_offset + pos))
            rmq_st32(cq + 8, <uint32_t>size)
            rmq_st64(cq + 12, <uint64_t>tg[tag_index + i])
            cq += CQ_UNIT
            pos += size
            sp += size
            i += 1
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
    cdef Py_ssize_t pos = write_pos, sp = src_pos, i = 0, size
    cdef unsigned char *d
    cdef bint eof = False
    cdef int32_t sysf
    cdef int rc = 0
    cdef unsigned char blank[8]
    with nogil:
        while i < count:
            size = <int32_t>rmq_ld32(s + sp)
            if size < 91 or sp + size > n:
                break
            if pos + size + MIN_BLANK > file_size:
                eof = True
                break
            d = s + sp
            rmq_st64(d + 20, <uint64_t>(queue_offset + i))
            rmq_st64(d + 28, <uint64_t>(file_from_offset + pos))
            sysf = <int32_t>rmq_ld32(d + 36)
            rmq_st64(d + store_ts_pos(sysf), <uint64_t>store_timestamp)
            rmq_st64(cq, <uint64_t>(file_from_offset + pos))
            rmq_st32(cq + 8, <uint32_t>size)
            rmq_st64(cq + 12, <uint64_t>tg[tag_index + i])
            cq += CQ_UNIT
            pos += size
            sp += size
            i += 1
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


# --- recovery scan ---------------------------------------------------------------------------------
cdef inline bint valid_topic_byte(unsigned char c) noexcept nogil:
    return (c >= 48 and c <= 57) or (c >= 65 and c <= 90) or (c >= 97 and c <= 122) or c == 37 or c == 124 or c == 95 or c == 45


cdef inline bint valid_properties(const unsigned char *p, Py_ssize_t n) noexcept nogil:
    """Properties are "name\\x01value\\x02" pairs of UTF-8 text without NULs.  A torn write that left
    random bytes in this part of a record (which the body CRC does not cover) fails this check."""
    cdef Py_ssize_t i = 0, need = 0
    cdef bint in_name = True
    cdef Py_ssize_t name_len = 0
    cdef unsigned char c
    if n == 0:
        return True
    if p[n - 1] != 2:
        return False
    while i < n:
        c = p[i]
        if need:
            if (c & 0xC0) != 0x80:
                return False
            need -= 1
        elif c == 0:
            return False
        elif c == 1:
            if not in_name or name_len == 0:
                return False
            in_name = False
        elif c == 2:
            if in_name:
                return False
            in_name = True
            name_len = 0
        elif c >= 0x80:
            if (c & 0xE0) == 0xC0 and c >= 0xC2:
                need = 1
            elif (c & 0xF0) == 0xE0:
                need = 2
            elif (c & 0xF8) == 0xF0 and c <= 0xF4:
                need = 3
            else:
                return False
            if in_name:
                name_len += 1
        elif in_name:
            name_len += 1
        i += 1
    return need == 0


cdef inline int check_record(const unsigned char *p, Py_ssize_t pos, Py_ssize_t end, int64_t phys, bint check_crc,
                             Py_ssize_t *out_size) noexcept nogil:
    """0 = good message record, 1 = blank, 2 = nothing (zero header / too short), 3 = corrupt."""
    cdef Py_ssize_t avail = end - pos
    cdef uint32_t size, magic, bl, tl, pl, sysf
    cdef Py_ssize_t bh, sh, bo, to, po
    cdef uint32_t i
    if avail < 8:
        return 2
    size = rmq_ld32(p + pos)
    magic = rmq_ld32(p + pos + 4)
    if size == 0 and magic == 0:
        return 2
    if magic == BLANK_MAGIC:
        if size >= MIN_BLANK and <Py_ssize_t>size == avail:
            out_size[0] = size
            return 1
        return 3
    if magic != MAGIC or size < 91 or <Py_ssize_t>size > avail:
        return 3
    if <int64_t>rmq_ld64(p + pos + 28) != phys:
        return 3
    sysf = rmq_ld32(p + pos + 36)
    bh = 20 if sysf & BORNHOST_V6 else 8
    sh = 20 if sysf & STOREHOST_V6 else 8
    bo = 72 + bh + sh
    if bo + 4 > <Py_ssize_t>size:
        return 3
    bl = rmq_ld32(p + pos + bo - 4)
    if <int64_t>bo + <int32_t>bl + 3 > <int64_t>size or <int32_t>bl < 0:
        return 3
    to = bo + bl
    tl = p[pos + to]
    if tl == 0 or tl > MAX_TOPIC or to + 1 + tl + 2 > <Py_ssize_t>size:
        return 3
    for i in range(tl):
        if not valid_topic_byte(p[pos + to + 1 + i]):
            return 3
    po = to + 1 + tl
    pl = rmq_ld16(p + pos + po)
    if po + 2 + <Py_ssize_t>pl != <Py_ssize_t>size:
        return 3
    if not valid_properties(p + pos + po + 2, pl):
        return 3
    if check_crc and (crc32_update(0, p + pos + bo, bl) & 0x7FFFFFFF) != rmq_ld32(p + pos + 8):
        return 3
    out_size[0] = size
    return 0


cdef inline int64_t schedule_tags_code(const unsigned char *props, Py_ssize_t n, int64_t store_ts,
                                       const int64_t *levels, Py_ssize_t nlevels, int64_t fallback) noexcept nogil:
    """SCHEDULE_TOPIC_XXXX entries carry the delivery time as their tag code (RocketMQ)."""
    cdef Py_ssize_t vs = 0, vl = 0, i
    cdef int64_t level = 0
    if nlevels == 0 or not find_property(props, n, b"DELAY", 5, &vs, &vl) or vl == 0 or vl > 9:
        return fallback
    for i in range(vl):
        if props[vs + i] < 48 or props[vs + i] > 57:
            return fallback
        level = level * 10 + (props[vs + i] - 48)
    if level <= 0:
        return fallback
    if level > nlevels:
        level = nlevels
    return store_ts + levels[level - 1]


def verify_records(NativeMap m, Py_ssize_t start, Py_ssize_t end, int64_t file_from_offset, bint check_crc,
                   bint collect=True, delay_levels_ms=None):
    """Walk records in [start, end) of one segment, checking magic, size, physical offset,
    structure and (optionally) body CRC.

    Returns (stop_pos, stop_reason, count, last_store_timestamp, runs).  stop_reason is STOP_END,
    STOP_BLANK or STOP_CORRUPT; stop_pos is where the walk stopped (the end of the last good record,
    or the segment end after a blank).  With `collect`, runs lists consecutive records of one
    (topic, queue) with consecutive queue offsets as (topic, queue_id, first_queue_offset, count,
    memoryview of its 20-byte consume-queue entries, max_store_timestamp) — so re-dispatch costs one
    Python object per run, not per record."""
    cdef unsigned char *p = m.check(start, end)
    cdef Py_ssize_t pos = start, size = 0
    cdef int r = 2
    cdef Py_ssize_t count = 0
    cdef int64_t last_ts = 0, ts, qoff, run_next = -1
    cdef int32_t qid, run_qid = -1
    cdef uint32_t sysf, tl, pl, bl
    cdef Py_ssize_t bo, to, po
    cdef const unsigned char *run_topic = NULL
    cdef uint32_t run_tl = 0
    cdef int64_t code
    cdef int64_t run_max_ts = 0
    cdef Py_ssize_t run_start_count = 0
    cdef bint sched
    cdef const int64_t *lv = NULL
    cdef Py_ssize_t nlv = 0
    cdef const unsigned char[::1] lvv
    if delay_levels_ms is not None and len(delay_levels_ms):
        import array
        lvv = array.array("q", delay_levels_ms).tobytes()
        lv = <const int64_t *>&lvv[0]
        nlv = len(delay_levels_ms)
    runs = []
    # every entry of this segment goes into one growing buffer; a run is a slice of it
    cdef Py_ssize_t cap = 65536, used = 0, run_byte = 0
    allbuf = PyByteArray_FromStringAndSize(NULL, cap)
    cdef unsigned char *entry
    cdef int64_t run_first = 0
    while True:
        r = check_record(p, pos, end, file_from_offset + pos, check_crc, &size)
        if r != 0:
            break
        sysf = rmq_ld32(p + pos + 36)
        ts = <int64_t>rmq_ld64(p + pos + store_ts_pos(sysf))
        if ts > last_ts:
            last_ts = ts
        count += 1
        if collect:
            qid = <int32_t>rmq_ld32(p + pos + 12)
            qoff = <int64_t>rmq_ld64(p + pos + 20)
            bo = 72 + (20 if sysf & BORNHOST_V6 else 8) + (20 if sysf & STOREHOST_V6 else 8)
            bl = rmq_ld32(p + pos + bo - 4)
            to = bo + bl
            tl = p[pos + to]
            po = to + 1 + tl
            pl = rmq_ld16(p + pos + po)
            code = tags_code_of(p + pos + po + 2, pl)
            sched = tl == 19 and memcmp(p + pos + to + 1, b"SCHEDULE_TOPIC_XXXX", 19) == 0
            if sched:
                code = schedule_tags_code(p + pos + po + 2, pl, ts, lv, nlv, code)
            if not (run_topic != NULL and qid == run_qid and qoff == run_next and tl == run_tl
                    and memcmp(run_topic, p + pos + to + 1, tl) == 0):
                if run_topic != NULL:
                    runs.append((PyBytes_FromStringAndSize(<char *>run_topic, run_tl).decode("utf-8"), run_qid,
                                 run_first, count - 1 - run_start_count, run_byte, run_max_ts))
                    run_byte = used
                run_topic = p + pos + to + 1
                run_tl = tl
                run_qid = qid
                run_first = qoff
                run_start_count = count - 1
                run_max_ts = 0
            run_next = qoff + 1
            if ts > run_max_ts:
                run_max_ts = ts
            if used + CQ_UNIT > cap:
                cap *= 2
                PyByteArray_Resize(allbuf, cap)
            entry = <unsigned char *>PyByteArray_AS_STRING(allbuf) + used
            rmq_st64(entry, <uint64_t>(file_from_offset + pos))
            rmq_st32(entry + 8, <uint32_t>size)
            rmq_st64(entry + 12, <uint64_t>code)
            used += CQ_UNIT
        pos += size
    if collect and run_topic != NULL:
        runs.append((PyBytes_FromStringAndSize(<char *>run_topic, run_tl).decode("utf-8"), run_qid,
                     run_first, count - run_start_count, run_byte, run_max_ts))
    if runs:
        PyByteArray_Resize(allbuf, used)
        view = memoryview(allbuf)
        runs = [(t, q, f, c, view[b:b + c * CQ_UNIT], ts) for (t, q, f, c, b, ts) in runs]
    if r == 1:
        return end, STOP_BLANK, count, last_ts, runs
    return pos, (STOP_CORRUPT if r == 3 else STOP_END), count, last_ts, runs


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


cdef bytes _encode_properties(dict props, object properties_to_string):
    """properties_to_string(props).encode("utf-8") for the common all-str dict, without building
    the intermediate str (str objects keep their UTF-8 form, so this is mostly memcpy)."""
    cdef Py_ssize_t total = 0, n
    cdef const char *p
    for k, v in props.items():
        if v is None:
            continue
        if type(k) is not str or type(v) is not str:
            return (<str>properties_to_string(props)).encode("utf-8")
        PyUnicode_AsUTF8AndSize(k, &n)
        total += n + 1
        PyUnicode_AsUTF8AndSize(v, &n)
        total += n + 1
    out = PyBytes_FromStringAndSize(NULL, total)
    cdef char *o = <char *>(<bytes>out)
    for k, v in props.items():
        if v is None:
            continue
        p = PyUnicode_AsUTF8AndSize(k, &n)
        memcpy(o, p, n)
        o[n] = 1
        o += n + 1
        p = PyUnicode_AsUTF8AndSize(v, &n)
        memcpy(o, p, n)
        o[n] = 2
        o += n + 1
    return <bytes>out


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
    cdef object schedule_topic, index_append, index_builder, listeners, log_exception, properties_to_string
    cdef object request_flush
    cdef GroupCommitFutures flush_futures
    cdef GroupCommitGate gate
    cdef int64_t sync_timeout_ms
    cdef object durable_result
    cdef bytearray scratch

    def __init__(self, store, commit_log, dict host_cache, bytes store_host_b, bint store_v6, Py_ssize_t limit,
                 append_result_cls, put_result_cls, put_ok, schedule_topic, log_exception, properties_to_string):
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
        self.properties_to_string = properties_to_string

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
            props = _encode_properties(<dict>props_dict, self.properties_to_string) if props_dict else b""
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
