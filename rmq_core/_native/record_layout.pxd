# The commit-log message record (RocketMQ 4.x "v1" layout, docs/protocol.md §5): its magic codes,
# sysFlag bits, size limits and field offsets, defined here and nowhere else.  Every native reader
# and writer cimports these; rmq_core._native.layout exports them to Python (rmq_core.record_layout),
# and tests/test_record_layout.py checks that it exports every `NAME = value` line below.
#
# Offsets are from the record's start.  The born host is 8 bytes (IPv4 + port) or 20 (IPv6 +
# port, sysFlag BORNHOST_V6), and so is the store host (STOREHOST_V6): the fields after a host
# move with it, so their positions are functions of the sysFlag (below), not constants.
from libc.stdint cimport int32_t, uint32_t

# The magic codes are above INT_MAX, which a C enum may not hold: plain unsigned C constants.
cdef extern from *:
    """
    #ifndef RMQ_RECORD_LAYOUT_MAGIC
    #define RMQ_RECORD_LAYOUT_MAGIC
    #define RMQ_MESSAGE_MAGIC_CODE 0xDAA320A7u
    #define RMQ_BLANK_MAGIC_CODE 0xCBD43194u
    #endif
    """
    # MESSAGE_MAGIC_CODE = 0xDAA320A7
    const uint32_t MESSAGE_MAGIC_CODE "RMQ_MESSAGE_MAGIC_CODE"
    # BLANK_MAGIC_CODE = 0xCBD43194
    const uint32_t BLANK_MAGIC_CODE "RMQ_BLANK_MAGIC_CODE"

cdef enum:
    # --- fixed-position fields (i32 unless noted) ---
    TOTAL_SIZE_AT = 0
    MAGIC_CODE_AT = 4
    BODY_CRC_AT = 8
    QUEUE_ID_AT = 12
    FLAG_AT = 16
    QUEUE_OFFSET_AT = 20          # i64
    PHYSICAL_OFFSET_AT = 28       # i64
    SYS_FLAG_AT = 36
    BORN_TIMESTAMP_AT = 40        # i64
    BORN_HOST_AT = 48             # 4 or 16 address bytes + i32 port
    # --- sizes ---
    HOST_V4_LEN = 8               # an encoded host: IPv4 address + i32 port
    HOST_V6_LEN = 20              # IPv6 address + i32 port
    # every fixed-width field but the two hosts: 4*5 + 8*2 + 4 + 8 (born ts) + 8 (store ts)
    # + 4 (reconsume) + 8 (prepared) + 4 (body length) = 72, then u8 topic length and i16
    # properties length
    RECORD_FIXED_NO_HOSTS = 72
    RECORD_FIXED_V4 = 91          # the shortest record: IPv4 hosts, no body, topic or properties
    MIN_BLANK = 8                 # the shortest end-of-segment BLANK record: i32 size, u32 magic
    MAX_TOPIC = 127               # u8 topic length, RocketMQ's limit
    MAX_PROPS = 32767             # i16 properties length
    # --- a SEND_BATCH_MESSAGE body's item: i32 total, i32 magic, i32 bodyCRC, i32 flag, i32 body
    # length, body, i16 properties length, properties ---
    BATCH_ITEM_FIXED = 22
    # --- sysFlag bits ---
    COMPRESSED = 0x1
    MULTI_TAGS = 0x2
    TRANSACTION_PREPARED_TYPE = 0x4
    TRANSACTION_COMMIT_TYPE = 0x8
    TRANSACTION_ROLLBACK_TYPE = 0xC
    TRANSACTION_MASK = 0xC
    BORNHOST_V6 = 0x10
    STOREHOST_V6 = 0x20
    NEED_UNWRAP = 0x40
    INNER_BATCH = 0x80
    COMPRESSION_LZ4 = 0x100
    COMPRESSION_ZSTD = 0x200
    COMPRESSION_ZLIB = 0x300
    COMPRESSION_TYPE_MASK = 0x700


# --- positions that follow the hosts ---------------------------------------------------------------
cdef inline Py_ssize_t born_host_len(int32_t sys_flag) noexcept nogil:
    return HOST_V6_LEN if sys_flag & BORNHOST_V6 else HOST_V4_LEN


cdef inline Py_ssize_t store_host_len(int32_t sys_flag) noexcept nogil:
    return HOST_V6_LEN if sys_flag & STOREHOST_V6 else HOST_V4_LEN


cdef inline Py_ssize_t store_timestamp_at(int32_t sys_flag) noexcept nogil:
    """STORETIMESTAMP (i64), right after the born host."""
    return BORN_HOST_AT + born_host_len(sys_flag)


cdef inline Py_ssize_t store_host_at(int32_t sys_flag) noexcept nogil:
    return store_timestamp_at(sys_flag) + 8


cdef inline Py_ssize_t reconsume_times_at(int32_t sys_flag) noexcept nogil:
    """RECONSUMETIMES (i32), then PREPARED_TRANSACTION_OFFSET (i64) and BODYLENGTH (i32)."""
    return store_host_at(sys_flag) + store_host_len(sys_flag)


cdef inline Py_ssize_t body_length_at(int32_t sys_flag) noexcept nogil:
    return reconsume_times_at(sys_flag) + 12


cdef inline Py_ssize_t record_len(Py_ssize_t bh, Py_ssize_t sh, Py_ssize_t body, Py_ssize_t topic,
                                  Py_ssize_t props) noexcept nogil:
    """A record's TOTALSIZE from its hosts' encoded lengths and its variable parts."""
    return RECORD_FIXED_NO_HOSTS + bh + sh + body + 1 + topic + 2 + props
