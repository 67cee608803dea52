# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The store's side of the record (docs/protocol.md §5): one whole record (encode_record), a batch
body's items as records (encode_batch, fit_batch; straight into a segment: commit_log.pyx) and the
recovery scan of a segment (verify_records).  The inline writers shared with commit_log.pyx are
record.pxd's, so every record is written by the same code."""
cimport cython
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_FromStringAndSize, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_AsUTF8String
from libc.stdint cimport int16_t, int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcmp

from java_hash cimport java_hash_utf8
from record_layout cimport *
from rmq_core._native.crc cimport crc32_update
from rmq_core._native.mapped cimport NativeMap
from rmq_core._native.record cimport (_put_u64, batch_format_error, batch_template, encode_properties, encoded_host,
                                      find_property, illegal_argument, properties_size_error, ptr_or_empty,
                                      rmq_batch_fit, rmq_batch_plan, rmq_batch_tmpl, tags_code_of, too_large_error,
                                      write_record)
from store_bytes cimport CQ_UNIT, rmq_ld16, rmq_ld32, rmq_ld64, rmq_st32, rmq_st64

# verify_records stop reasons
STOP_END = 0        # reached `end` or a zero header (nothing written there)
STOP_BLANK = 1      # end-of-segment blank record
STOP_CORRUPT = 2    # bad magic / size / crc / physical offset / structure



# --- record encoding ---------------------------------------------------------------------------
cdef check_hosts(const unsigned char[::1] born_host, const unsigned char[::1] store_host, int32_t sys_flag):
    cdef Py_ssize_t bh = born_host_len(sys_flag)
    cdef Py_ssize_t sh = store_host_len(sys_flag)
    if born_host.shape[0] != bh:
        raise illegal_argument(f"born host must be {bh} encoded bytes for sysFlag {sys_flag:#x}, got {born_host.shape[0]}")
    if store_host.shape[0] != sh:
        raise illegal_argument(f"store host must be {sh} encoded bytes for sysFlag {sys_flag:#x}, got {store_host.shape[0]}")


def encode_record(str topic, bytes body, int32_t queue_id=0, int32_t flag=0, int64_t queue_offset=0,
                  int64_t commit_log_offset=0, int32_t sys_flag=0, int64_t born_timestamp=0, born_host=None,
                  int64_t store_timestamp=0, store_host=None, int32_t reconsume_times=0,
                  int64_t prepared_transaction_offset=0, properties=None):
    """One whole record, every field as given (a stored record as the broker sends it back, e.g. in
    CHECK_TRANSACTION_STATE): the hosts as `_parse_host` takes them, which also set sysFlag's
    host-v6 bits; BODYCRC over `body` as given; `properties` a dict (or pairs)."""
    cdef bytes t = PyUnicode_AsUTF8String(topic)
    cdef bytes props = encode_properties(properties)
    cdef bytes bh = encoded_host(born_host, "born host"), sh = encoded_host(store_host, "store host")
    cdef Py_ssize_t tl = len(t), bl = len(body), pl = len(props)
    if tl == 0 or tl > MAX_TOPIC:
        raise illegal_argument(f"bad topic name {topic!r}: {tl} bytes; it must be 1..{MAX_TOPIC}")
    if pl > MAX_PROPS:
        raise illegal_argument(f"message properties are {pl} bytes, more than {MAX_PROPS}")
    sys_flag &= ~(BORNHOST_V6 | STOREHOST_V6)
    if len(bh) == HOST_V6_LEN:
        sys_flag |= BORNHOST_V6
    if len(sh) == HOST_V6_LEN:
        sys_flag |= STOREHOST_V6
    cdef Py_ssize_t total = record_len(len(bh), len(sh), bl, tl, pl)
    out = PyBytes_FromStringAndSize(NULL, total)
    cdef unsigned char *d = <unsigned char *>PyBytes_AS_STRING(out)
    cdef const unsigned char *bp = <const unsigned char *><char *>body
    write_record(d, <int32_t>total, crc32_update(0, bp, bl), queue_id, flag, sys_flag, born_timestamp,
                 <const unsigned char *><char *>bh, len(bh), <const unsigned char *><char *>sh, len(sh),
                 reconsume_times, prepared_transaction_offset, bp, bl, <const unsigned char *><char *>t, tl,
                 <const unsigned char *><char *>props, pl, NULL, 0, False)
    _put_u64(d + QUEUE_OFFSET_AT, <uint64_t>queue_offset)
    _put_u64(d + PHYSICAL_OFFSET_AT, <uint64_t>commit_log_offset)
    _put_u64(d + store_timestamp_at(sys_flag), <uint64_t>store_timestamp)
    return out


def encode_batch(body, bytes topic, int32_t queue_id, int32_t sys_flag, int64_t born_ts, bytes born_host,
                 bytes store_host, int32_t reconsume_times, extra_properties, Py_ssize_t max_message_size,
                 bint plan_only=False):
    """A SEND_BATCH_MESSAGE body (docs/protocol.md §5.5) -> (bytearray records, count, bytearray tags codes
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
        raise illegal_argument(f"topic {topic.decode('utf-8', 'replace')!r} is {tl} bytes; it must be 1..{MAX_TOPIC}")
    check_hosts(bh, sh, sys_flag)
    if n == 0:
        raise batch_format_error("batch body is empty")
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
            raise batch_format_error(f"batch body truncated at byte {pos}: {n - pos} bytes left, an item header needs 20")
        item_total = <int32_t>rmq_ld32(s + pos)
        blen = <int32_t>rmq_ld32(s + pos + 16)
        if blen < 0 or pos + 20 + blen + 2 > n:
            raise batch_format_error(f"batch item {count} at byte {pos}: body length {blen} runs past the end ({n} bytes)")
        plen = <int16_t>rmq_ld16(s + pos + 20 + blen)
        if plen < 0 or pos + 22 + blen + plen > n:
            raise batch_format_error(f"batch item {count} at byte {pos}: properties length {plen} runs past the end ({n} bytes)")
        if item_total != 22 + blen + plen:
            raise batch_format_error(f"batch item {count} at byte {pos}: total size {item_total} != 22 + body {blen} + properties {plen}")
        ppos = pos + 22 + blen
        sep = plen > 0 and exl > 0 and s[ppos + plen - 1] != 2
        if plen + exl + (1 if sep else 0) > MAX_PROPS:
            raise properties_size_error(
                f"batch item {count}: properties are {plen + exl + (1 if sep else 0)} bytes, more than {MAX_PROPS}")
        rlen = fixed + blen + plen + exl + (1 if sep else 0)
        if rlen > max_message_size:
            raise too_large_error(rlen, max_message_size)
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
            # the record's properties are the item's then the extra ones: the last TAGS wins
            if exl and find_property(exp, exl, b"TAGS", 4, &vs, &vl):
                code = java_hash_utf8(exp + vs, vl) if vl > 0 else 0
            else:
                code = tags_code_of(s + ppos, plen)
            tg[i] = code
            d += rlen
            pos += item_total
            i += 1
    return out, count, tags


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
    cdef Py_ssize_t bo, to, po
    cdef uint32_t i
    if avail < 8:
        return 2
    size = rmq_ld32(p + pos)
    magic = rmq_ld32(p + pos + MAGIC_CODE_AT)
    if size == 0 and magic == 0:
        return 2
    if magic == BLANK_MAGIC_CODE:
        if size >= MIN_BLANK and <Py_ssize_t>size == avail:
            out_size[0] = size
            return 1
        return 3
    if magic != MESSAGE_MAGIC_CODE or size < RECORD_FIXED_V4 or <Py_ssize_t>size > avail:
        return 3
    if <int64_t>rmq_ld64(p + pos + PHYSICAL_OFFSET_AT) != phys:
        return 3
    sysf = rmq_ld32(p + pos + SYS_FLAG_AT)
    bo = body_length_at(sysf) + 4  # the body
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
        sysf = rmq_ld32(p + pos + SYS_FLAG_AT)
        ts = <int64_t>rmq_ld64(p + pos + store_timestamp_at(sysf))
        if ts > last_ts:
            last_ts = ts
        count += 1
        if collect:
            qid = <int32_t>rmq_ld32(p + pos + QUEUE_ID_AT)
            qoff = <int64_t>rmq_ld64(p + pos + QUEUE_OFFSET_AT)
            bo = body_length_at(sysf) + 4
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
