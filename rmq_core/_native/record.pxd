# The message-record code shared by record.pyx (encode, decode, verify) and commit_log.pyx (the
# appends and the single put write records in place): the one property lookup, the tag code, the
# record writer, and the batch template of store_batch.h.  The layout itself is record_layout.pxd's.
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset

from java_hash cimport java_hash_utf8
from record_layout cimport MAX_TOPIC, MESSAGE_MAGIC_CODE, born_host_len, store_host_len
from store_bytes cimport rmq_st16, rmq_st32, rmq_st64

cdef extern from "store_bytes.h" nogil:
    int rmq_find_prop(const unsigned char *p, size_t n, const char *key, size_t klen, size_t *vs, size_t *vl)

cdef extern from "store_batch.h" nogil:
    ctypedef uint32_t (*rmq_crc_fn)(uint32_t, const unsigned char *, size_t) noexcept nogil
    rmq_crc_fn rmq_batch_crc32
    ctypedef int32_t (*rmq_hash_fn)(const unsigned char *, Py_ssize_t) noexcept nogil
    ctypedef struct rmq_batch_tmpl:
        size_t head_len
        size_t fixed
    ctypedef struct rmq_tag_cache:
        const unsigned char *props
    void rmq_batch_tmpl_init(rmq_batch_tmpl *t, uint32_t magic, int32_t queue_id, int32_t sys_flag, int64_t born_ts,
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
    size_t rmq_batch_fit(const rmq_batch_tmpl *t, const unsigned char *s, size_t body_pos, size_t n_items,
                         size_t write_pos, size_t file_size, size_t *nbytes, size_t *next_body_pos)


from json_text cimport Out

cdef bytes encode_properties(object props)
cdef Py_ssize_t put_property(Out* o, object key, object value) except -1


cdef inline bint find_property(const unsigned char *props, Py_ssize_t n, const char *key, Py_ssize_t klen,
                               Py_ssize_t *vstart, Py_ssize_t *vlen) noexcept nogil:
    """Locate `key`'s value in a "k\\x01v\\x02" properties string (the last such pair wins)."""
    cdef size_t vs = 0, vl = 0
    if n <= 0 or not rmq_find_prop(props, <size_t>n, key, <size_t>klen, &vs, &vl):
        return False
    vstart[0] = <Py_ssize_t>vs
    vlen[0] = <Py_ssize_t>vl
    return True


cdef inline int64_t tags_code_of(const unsigned char *props, Py_ssize_t n) noexcept nogil:
    """The consume-queue tag code: Java String.hashCode of the TAGS value, 0 without one."""
    cdef Py_ssize_t vs = 0, vl = 0
    if find_property(props, n, b"TAGS", 4, &vs, &vl) and vl > 0:
        return java_hash_utf8(props + vs, vl)
    return 0


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
    rmq_st32(q, MESSAGE_MAGIC_CODE); q += 4
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


cdef extern from *:
    """
    /* two upper-case hex digits per byte value: the message ids are written a byte at a time */
    #ifndef RMQ_HEX_PAIRS
    #define RMQ_HEX_PAIRS
    static const char rmq_hex_pairs[513] =
        "000102030405060708090A0B0C0D0E0F101112131415161718191A1B1C1D1E1F202122232425262728292A2B2C2D2E2F303132333435363738393A3B3C3D3E3F"
        "404142434445464748494A4B4C4D4E4F505152535455565758595A5B5C5D5E5F606162636465666768696A6B6C6D6E6F707172737475767778797A7B7C7D7E7F"
        "808182838485868788898A8B8C8D8E8F909192939495969798999A9B9C9D9E9FA0A1A2A3A4A5A6A7A8A9AAABACADAEAFB0B1B2B3B4B5B6B7B8B9BABBBCBDBEBF"
        "C0C1C2C3C4C5C6C7C8C9CACBCCCDCECFD0D1D2D3D4D5D6D7D8D9DADBDCDDDEDFE0E1E2E3E4E5E6E7E8E9EAEBECEDEEEFF0F1F2F3F4F5F6F7F8F9FAFBFCFDFEFF";
    #endif
    """
    const char rmq_hex_pairs[513]


cdef inline void put_hex(char *o, const unsigned char *p, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t j
    for j in range(n):
        memcpy(o + 2 * j, rmq_hex_pairs + 2 * p[j], 2)


cdef inline void put_offset_hex(char *o, int64_t offset) noexcept nogil:
    """The commit-log offset part of an offsetMsgId: 16 hex digits, big-endian."""
    cdef unsigned char be[8]
    rmq_st64(be, <uint64_t>offset)
    put_hex(o, be, 8)


cdef inline Py_ssize_t put_offset_msg_id(char *o, const unsigned char *host, Py_ssize_t hl,
                                        int64_t offset) noexcept nogil:
    """The offsetMsgId, RocketMQ's MessageDecoder.createMessageId: the store host as a record holds
    it (`hl` = 8 bytes, IPv4 + i32 port, or 20, IPv6 + port) then the i64 commit-log offset, as
    upper-case hex.  Writes and returns 2 * (hl + 8) characters.  The one encoder of the id (ids
    of one host share its first 2 * hl characters: commit_log.offset_msg_ids copies them)."""
    put_hex(o, host, hl)
    put_offset_hex(o + 2 * hl, offset)
    return 2 * (hl + 8)


cdef inline const unsigned char *ptr_or_empty(const unsigned char[::1] v) noexcept:
    if v.shape[0] == 0:
        return <const unsigned char *>b""
    return &v[0]


cdef inline int batch_template(rmq_batch_tmpl *t, bytes topic, int32_t queue_id, int32_t sys_flag, int64_t born_ts,
                               bytes born_host, bytes store_host, int32_t reconsume_times,
                               const unsigned char[::1] extra, int64_t store_timestamp) except -1:
    """The constant part of every record of one batch (store_batch.h)."""
    cdef Py_ssize_t tl = len(topic), bhl = len(born_host), shl = len(store_host)
    if tl == 0 or tl > MAX_TOPIC:
        raise ValueError(f"topic of {tl} bytes; it must be 1..{MAX_TOPIC}")
    if bhl != born_host_len(sys_flag) or shl != store_host_len(sys_flag):
        raise ValueError(f"hosts of {bhl}/{shl} bytes do not match sysFlag {sys_flag:#x}")
    rmq_batch_tmpl_init(t, MESSAGE_MAGIC_CODE, queue_id, sys_flag, born_ts, <const unsigned char *><char *>born_host, bhl,
                        <const unsigned char *><char *>store_host, shl, reconsume_times, store_timestamp,
                        <const unsigned char *><char *>topic, tl, ptr_or_empty(extra), extra.shape[0])
    return 0


# --- shared by the record modules: record.pyx defines these; record_batch.pyx, record_columns.pyx
# and record_store.pyx use them -------------------------------------------------------------------
from store_bytes cimport rmq_ld16, rmq_ld32, rmq_ld64


cdef inline uint32_t _u32(const unsigned char* p) noexcept nogil:
    return rmq_ld32(p)


cdef inline int32_t _i32(const unsigned char* p) noexcept nogil:
    return <int32_t>rmq_ld32(p)


cdef inline int64_t _i64(const unsigned char* p) noexcept nogil:
    return <int64_t>rmq_ld64(p)


cdef inline int16_t _i16(const unsigned char* p) noexcept nogil:
    return <int16_t>rmq_ld16(p)


cdef inline void _put_u32(unsigned char* p, uint32_t v) noexcept nogil:
    rmq_st32(p, v)


cdef inline void _put_u64(unsigned char* p, uint64_t v) noexcept nogil:
    rmq_st64(p, v)


cdef class BufferView:
    cdef Py_buffer view
    cdef bint held
    cdef const unsigned char* ptr
    cdef Py_ssize_t size


cdef struct RecordFields:
    # one v1 record's fields and the positions of its variable parts (relative to the record)
    int32_t total
    int32_t body_crc
    int32_t queue_id
    int32_t flag
    int64_t queue_offset
    int64_t commit_log_offset
    int32_t sys_flag
    int64_t born_timestamp
    Py_ssize_t born_ip_pos
    int32_t born_port
    int64_t store_timestamp
    Py_ssize_t store_ip_pos
    int32_t store_port
    int32_t reconsume_times
    int64_t prepared_transaction_offset
    Py_ssize_t body_pos
    Py_ssize_t body_len
    Py_ssize_t topic_pos
    Py_ssize_t topic_len
    Py_ssize_t props_pos
    Py_ssize_t props_len


cdef int read_record_fields(const unsigned char* p, Py_ssize_t avail, Py_ssize_t at, RecordFields* r) except -1
cdef object decompress_record_body(object body, int32_t sys_flag, Py_ssize_t offset)
cdef bytes encoded_host(object value, str what)
# the Python layer's errors (rmq_core.message hands them in: record.use_python_layer)
cdef object record_decode_error(Py_ssize_t offset, str reason)
cdef object illegal_argument(str text)
cdef bint is_illegal_argument(object exc)
cdef object batch_format_error(str text)
cdef object properties_size_error(str text)
cdef object too_large_error(Py_ssize_t size, Py_ssize_t limit)
