# cython: language_level=3
"""record_layout.pxd's constants and field positions as Python values: the one definition of the
commit-log record layout, read by Python readers through rmq_core.record_layout."""
from libc.stdint cimport int32_t

cimport record_layout as L

MESSAGE_MAGIC_CODE = L.MESSAGE_MAGIC_CODE
BLANK_MAGIC_CODE = L.BLANK_MAGIC_CODE

TOTAL_SIZE_AT = L.TOTAL_SIZE_AT
MAGIC_CODE_AT = L.MAGIC_CODE_AT
BODY_CRC_AT = L.BODY_CRC_AT
QUEUE_ID_AT = L.QUEUE_ID_AT
FLAG_AT = L.FLAG_AT
QUEUE_OFFSET_AT = L.QUEUE_OFFSET_AT
PHYSICAL_OFFSET_AT = L.PHYSICAL_OFFSET_AT
SYS_FLAG_AT = L.SYS_FLAG_AT
BORN_TIMESTAMP_AT = L.BORN_TIMESTAMP_AT
BORN_HOST_AT = L.BORN_HOST_AT
HOST_V4_LEN = L.HOST_V4_LEN
HOST_V6_LEN = L.HOST_V6_LEN
RECORD_FIXED_NO_HOSTS = L.RECORD_FIXED_NO_HOSTS
RECORD_FIXED_V4 = L.RECORD_FIXED_V4
MIN_BLANK = L.MIN_BLANK
MAX_TOPIC = L.MAX_TOPIC
MAX_PROPS = L.MAX_PROPS
BATCH_ITEM_FIXED = L.BATCH_ITEM_FIXED

COMPRESSED = L.COMPRESSED
MULTI_TAGS = L.MULTI_TAGS
TRANSACTION_PREPARED_TYPE = L.TRANSACTION_PREPARED_TYPE
TRANSACTION_COMMIT_TYPE = L.TRANSACTION_COMMIT_TYPE
TRANSACTION_ROLLBACK_TYPE = L.TRANSACTION_ROLLBACK_TYPE
TRANSACTION_MASK = L.TRANSACTION_MASK
BORNHOST_V6 = L.BORNHOST_V6
STOREHOST_V6 = L.STOREHOST_V6
NEED_UNWRAP = L.NEED_UNWRAP
INNER_BATCH = L.INNER_BATCH
COMPRESSION_LZ4 = L.COMPRESSION_LZ4
COMPRESSION_ZSTD = L.COMPRESSION_ZSTD
COMPRESSION_ZLIB = L.COMPRESSION_ZLIB
COMPRESSION_TYPE_MASK = L.COMPRESSION_TYPE_MASK


def born_host_len(int32_t sys_flag) -> int:
    return L.born_host_len(sys_flag)


def store_host_len(int32_t sys_flag) -> int:
    return L.store_host_len(sys_flag)


def store_timestamp_at(int32_t sys_flag) -> int:
    return L.store_timestamp_at(sys_flag)


def store_host_at(int32_t sys_flag) -> int:
    return L.store_host_at(sys_flag)


def reconsume_times_at(int32_t sys_flag) -> int:
    return L.reconsume_times_at(sys_flag)


def body_length_at(int32_t sys_flag) -> int:
    return L.body_length_at(sys_flag)
